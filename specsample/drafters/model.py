"""Drafters in the core: a draft model (any `Model`) sampled with warp + sample."""

from __future__ import annotations

import dataclasses

import array_api_compat

from specsample._array import Array, check_int, check_shape, device, host_ints, largest, namespace
from specsample.core.cache import Cache, rollback
from specsample.core.metrics import Costs
from specsample.core.params import SamplingParams
from specsample.core.protocols import Model, Proposal, forward_select
from specsample.core.sample import sample
from specsample.core.warp import warp

__all__ = ["DraftRating", "DraftState", "ModelDrafter", "confidence_lengths", "draft_support",
           "token_confidence"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftState:
    """A draft model's cache and how many committed tokens it has not yet seen.

    `window` is 1 after the prompt and 2 after every round: the cache is rolled
    back to L - 2 entries so that rows which accepted all K drafts (whose
    cache lacks the last draft) and rows that did not take one static shape.
    A drafter that lets the cache fall further behind (`HybridDrafter`, whose
    copying rounds skip the model) passes a wider window: row b's cache then
    holds max(L_b - window, 0) entries.
    """

    cache: Cache
    window: int


def confidence_lengths(confidence: Array, threshold: float) -> Array:
    """Per row, the drafts kept by a confidence threshold: int64 [B] in [1, K].

    A row keeps drafts up to and including the first one whose confidence is below
    `threshold` (all K if none is). The low-confidence draft is kept: the decision to
    stop after draft i reads drafts 1..i only, a stopping time of the draft process,
    so the output law is unchanged (proofs/stopping.md). Dropping that draft would make
    the kept drafts' law differ from the q they are verified against.

    Args:
        confidence: [B, K], the draft's probability of each drafted token.
        threshold: in (0, 1).
    """
    xp = namespace(confidence)
    check_shape("confidence", confidence, (None, None))
    _check_threshold(threshold, optional=False)
    if confidence.shape[1] < 1:
        raise ValueError(f"confidence: expected at least one draft per row, got shape "
                         f"{list(confidence.shape)}")
    k = int(confidence.shape[1])
    slots = xp.arange(k, dtype=xp.int64, device=device(confidence))[None, :]
    return xp.min(xp.where(confidence < threshold, slots + 1, k), axis=1)


def _check_threshold(threshold: float | None, *, optional: bool = True) -> float | None:
    if threshold is None and optional:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise ValueError(f"threshold: expected {'None or ' if optional else ''}a number in (0, 1), "
                         f"got {threshold!r}")
    return float(threshold)


def token_confidence(logits: Array, x: Array) -> Array:
    """The draft's confidence in its tokens: softmax(logits [B, V])[b, x[b]] at temperature 1,
    [B] in the logits' dtype."""
    xp = namespace(logits)
    top = xp.max(logits, axis=-1, keepdims=True)
    log_total = xp.log(xp.sum(xp.exp(logits - top), axis=-1))  # [B]
    picked = xp.take_along_axis(logits, x[:, None], axis=-1)[:, 0] - top[:, 0]
    return xp.exp(picked - log_total)


def draft_support(model: Model) -> Array | None:
    """The ids a draft model can propose, from its optional `support` attribute: int64 [S],
    ascending and distinct, in [0, V); None where the model has none or it covers all V.

    A model with a support (a draft head over the most frequent tokens) gives logits of -inf
    at every other id; a `ModelDrafter` then warps and samples over those S ids only (its q
    is 0 elsewhere either way), where the full warp would pass over all V per draft.
    """
    support = getattr(model, "support", None)
    if support is None:
        return None
    vocab = int(model.vocab_size)
    xp = namespace(support)
    if len(support.shape) != 1 or not 1 <= int(support.shape[0]) <= vocab or \
            not xp.isdtype(support.dtype, "integral"):
        raise ValueError(f"model.support: expected None or a 1-D integer array of 1 to {vocab} "
                         f"token ids, got dtype {support.dtype} and shape {tuple(support.shape)}")
    ends = host_ints(xp.stack([xp.min(support), xp.max(support)]))
    ascending = int(support.shape[0]) == 1 or bool(xp.all(support[1:] > support[:-1]))
    if ends[0] < 0 or ends[1] >= vocab or not ascending:
        raise ValueError(f"model.support: expected ascending distinct ids in [0, {vocab}), got "
                         f"ids from {ends[0]} to {ends[1]}{'' if ascending else ', not ascending'}")
    return None if int(support.shape[0]) == vocab else xp.astype(support, xp.int64)


def _spread(q: Array, support: Array, vocab: int) -> Array:
    """q over the support [B, S] -> [B, V], zeros elsewhere."""
    if array_api_compat.is_torch_array(q):
        return q.new_zeros((int(q.shape[0]), vocab)).index_copy_(-1, support, q)
    xp = namespace(q)
    out = xp.zeros((int(q.shape[0]), vocab), dtype=q.dtype, device=device(q))
    out[:, support] = q
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftRating:
    """What a model draft states about itself, for `auto` and for rating its K.

    Attributes:
        prior_alpha: its acceptance before evidence (e.g. a trained head's held-out alpha
            from its card), or None (the scheduler's prior).
        fan_out_hits: hits[m - 1] = the held-out chance that its m likeliest tokens hold the
            target's, or None.
        costs: its costs measured on this machine, where a backend measured them at load.
        note: how the backend chose this drafter's shape, for a command line to print.
    """

    prior_alpha: float | None = None
    fan_out_hits: tuple[float, ...] | None = None
    costs: Costs | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        if self.prior_alpha is not None and not 0 <= self.prior_alpha <= 1:
            raise ValueError(f"prior_alpha: expected None or a rate in [0, 1], got {self.prior_alpha!r}")
        if self.fan_out_hits is not None and (not self.fan_out_hits or any(
                not 0 <= h <= 1 for h in self.fan_out_hits)):
            raise ValueError(f"fan_out_hits: expected None or rates in [0, 1], got {self.fan_out_hits!r}")


class ModelDrafter:
    """Draft K tokens autoregressively from a draft `Model` (the law q is returned).

    With a `threshold`, a row stops drafting after the first draft whose confidence
    (the draft model's softmax probability of that token at temperature 1, as
    transformers' `assistant_confidence_threshold` reads it, so that it means the same
    at T = 0) falls below it; the round stops drafting once every row has stopped, and
    each row verifies only its own drafts (`Proposal.lengths`). See `confidence_lengths`.

    A model with a `support` (see `draft_support`) is warped, sampled and read for its
    confidence over those ids only.

    Args:
        model: the draft model; its vocabulary must equal the target's.
        threshold: None (always K drafts) or a confidence in (0, 1).
        rating: what the draft states about itself (`DraftRating`).
    """

    def __init__(self, model: Model, *, threshold: float | None = None,
                 rating: DraftRating | None = None) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"model: expected a specsample Model, got {type(model).__name__}")
        if rating is not None and not isinstance(rating, DraftRating):
            raise TypeError(f"rating: expected a DraftRating, got {type(rating).__name__}")
        self.model = model
        self.rating = DraftRating() if rating is None else rating
        self.threshold = _check_threshold(threshold)
        self.support = draft_support(model)

    def start(self, tokens: Array, lengths: Array, capacity: int) -> DraftState:
        """Prefill the draft cache with each prompt but its last token."""
        cache = self.model.new_cache(int(tokens.shape[0]), capacity)
        width = int(namespace(lengths).max(lengths))
        if width > 1:
            _, _, cache = forward_select(self.model, tokens[:, : width - 1], cache, None)
        return DraftState(cache=rollback(cache, lengths - 1), window=1)

    def _feed(self, state: DraftState, tokens: Array, lengths: Array) -> tuple[Array, Cache]:
        """Feed each row's last `window` committed tokens: logits at its last one [B, V], and
        the cache holding all L committed tokens."""
        xp = namespace(tokens)
        first = xp.clip(lengths - state.window, min=0)  # [B]
        span = first[:, None] + xp.arange(state.window, dtype=xp.int64, device=device(tokens))[None, :]
        feed = xp.take_along_axis(tokens, xp.clip(span, max=int(tokens.shape[1]) - 1), axis=1)
        # Only the last committed token's logits are read (a row shorter than the window
        # fed tokens past its end: its own last column).
        logits, _, cache = forward_select(self.model, feed, rollback(state.cache, first), lengths - 1 - first)
        assert logits is not None
        return logits, rollback(cache, lengths)

    def propose(self, state: DraftState, tokens: Array, lengths: Array, k: int,
                params: SamplingParams, uniforms: Array) -> Proposal:
        """Sample k tokens from q, feeding each back; returns q [B, k', V].

        k' = k without a threshold; with one, the longest row's length (`Proposal.lengths`).
        """
        xp = namespace(tokens)
        logits, cache = self._feed(state, tokens, lengths)
        drafted: list[Array] = []
        laws: list[Array] = []
        sure: list[Array] = []
        stopped = None
        for i in range(k):
            if i:
                step, cache = self.model.forward(drafted[-1][:, None], cache)
                logits = step[:, -1, :]
            if self.support is not None:  # the ids outside it have logits -inf: q is 0 there
                logits = xp.take(logits, self.support, axis=-1)  # [B, S]
            law, q = self.laws(logits, params, check=i == 0)  # [B, V] each ([B, S] with a support)
            x = sample(law, uniforms[:, i], check=False)  # [B]
            if self.threshold is not None:
                sure.append(token_confidence(logits, x))
            if self.support is not None:
                x, q = xp.take(self.support, x, axis=0), _spread(q, self.support, int(self.model.vocab_size))
            drafted.append(x)
            laws.append(q)
            if self.threshold is not None:
                low = sure[-1] < self.threshold
                stopped = low if stopped is None else stopped | low
                if i + 1 < k and bool(xp.all(stopped)):  # no row drafts on: save the forwards
                    break
        lengths_kept = None
        if self.threshold is not None:
            lengths_kept = self.kept(xp.stack(sure, axis=1), self.threshold)
        return Proposal(tokens=xp.stack(drafted, axis=1), probs=xp.stack(laws, axis=1),
                        state=DraftState(cache=cache, window=state.window), lengths=lengths_kept)

    @property
    def proposable(self) -> int:
        """How many ids the draft can propose: its support's size, else the vocabulary's."""
        return int(self.model.vocab_size) if self.support is None else int(self.support.shape[0])

    def candidates(self, state: DraftState, tokens: Array, lengths: Array, m: int
                   ) -> tuple[Array, DraftState]:
        """The draft model's m most likely next tokens per row (int64 [B, m], distinct, the
        likeliest first; ties to the lower id) over its support, after the committed
        context, and the state after feeding it: deterministic candidates for a draft tree
        of siblings (`specsample.verify_tree`), one draft step whatever m."""
        check_int("m", m, 1)
        xp = namespace(tokens)
        if m > self.proposable:
            raise ValueError(f"m: expected at most the draft's {self.proposable} proposable ids, got {m}")
        logits, cache = self._feed(state, tokens, lengths)  # [B, V]
        if self.support is not None:
            logits = xp.take(logits, self.support, axis=-1)  # [B, S]
        _, chosen = largest(logits, m)
        if self.support is not None:
            chosen = xp.reshape(xp.take(self.support, xp.reshape(chosen, (-1,)), axis=0), chosen.shape)
        return chosen, DraftState(cache=cache, window=state.window)

    def kept(self, confidence: Array, threshold: float) -> Array:
        """The drafts each row keeps given their confidences [B, k']: `confidence_lengths`."""
        return confidence_lengths(confidence, threshold)

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
