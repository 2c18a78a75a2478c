"""Drafters in the core: a draft model (any `Model`) sampled with warp + sample."""

from __future__ import annotations

import dataclasses

from specsample._array import Array, device, namespace
from specsample.cache import Cache, rollback
from specsample.params import SamplingParams
from specsample.protocols import Model, Proposal
from specsample.sample import sample
from specsample.warp import warp

__all__ = ["DraftState", "ModelDrafter"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftState:
    """A draft model's cache and how many committed tokens it has not yet seen.

    `window` is 1 after the prompt and 2 after every round: the cache is rolled
    back to L - 2 entries so that rows which accepted all K drafts (whose
    cache lacks the last draft) and rows that did not take one static shape.
    """

    cache: Cache
    window: int


class ModelDrafter:
    """Draft K tokens autoregressively from a draft `Model` (the law q is returned).

    Args:
        model: the draft model; its vocabulary must equal the target's.
    """

    def __init__(self, model: Model) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"model: expected a specsample Model, got {type(model).__name__}")
        self.model = model

    def start(self, tokens: Array, lengths: Array, capacity: int) -> DraftState:
        """Prefill the draft cache with each prompt but its last token."""
        cache = self.model.new_cache(int(tokens.shape[0]), capacity)
        width = int(namespace(lengths).max(lengths))
        if width > 1:
            _, cache = self.model.forward(tokens[:, : width - 1], cache)
        return DraftState(cache=rollback(cache, lengths - 1), window=1)

    def propose(self, state: DraftState, tokens: Array, lengths: Array, k: int,
                params: SamplingParams, uniforms: Array) -> Proposal:
        """Sample k tokens from q, feeding each back; returns q [B, k, V]."""
        xp = namespace(tokens)
        span = xp.arange(state.window, dtype=xp.int64, device=device(tokens))[None, :]
        span = xp.clip(span + (lengths - state.window)[:, None], min=0)  # [B, window]
        feed = xp.take_along_axis(tokens, span, axis=1)  # [B, window]
        cache = state.cache
        drafted, laws = [], []
        for i in range(k):
            logits, cache = self.model.forward(feed, cache)
            law, q = self.laws(logits[:, -1, :], params, check=i == 0)  # [B, V] each
            x = sample(law, uniforms[:, i], check=False)  # [B]
            drafted.append(x)
            laws.append(q)
            feed = x[:, None]
        return Proposal(tokens=xp.stack(drafted, axis=1), probs=xp.stack(laws, axis=1),
                        state=DraftState(cache=cache, window=state.window))

    def laws(self, logits: Array, params: SamplingParams, *, check: bool) -> tuple[Array, Array]:
        """The law to sample from and the law q to report: the same, warp(logits)."""
        q = warp(logits, params, check=check)
        return q, q

    def draft_lengths(self, tokens: Array, lengths: Array, k: int) -> Array:
        """Every row drafts all k tokens: int64 [B]."""
        xp = namespace(lengths)
        return xp.full(lengths.shape, k, dtype=xp.int64, device=device(lengths))

    def advance(self, state: DraftState, lengths: Array) -> DraftState:
        """Roll the cache back to L - 2 entries; the next round feeds 2 tokens."""
        return DraftState(cache=rollback(state.cache, namespace(lengths).clip(lengths - 2, min=0)),
                          window=2)
