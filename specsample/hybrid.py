"""Hybrid drafting: prompt lookup where the context repeats itself, a draft model elsewhere.

Also the drafter-name syntax every backend shares on top of its own names:
"NAME@T" (a model draft that stops at confidence T) and "hybrid" / "hybrid:NAME".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from specsample._array import Array, device, host_ints, namespace
from specsample.cache import rollback
from specsample.drafters import DraftState, ModelDrafter
from specsample.lookup import PromptLookupDrafter
from specsample.params import SamplingParams
from specsample.protocols import Drafter, Proposal

__all__ = ["HybridDrafter", "HybridState", "compose_drafter"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class HybridState:
    """The draft model's state and how far its cache follows each row.

    Attributes:
        draft: the model drafter's state; its cache holds `seen[b]` committed tokens of row b.
        seen: int64 [B]: cache entries known to equal the row's committed tokens.
        modelled: bool [B]: rows whose drafts came from the model in the last round (their
            accepted drafts are in the cache too; `advance` counts them).
    """

    draft: DraftState
    seen: Array
    modelled: Array


class HybridDrafter:
    """Per row and round: prompt lookup's copy where the row's context ends in a confident
    match (`PromptLookupDrafter.draft_lengths` gives all K), the model draft elsewhere.

    The choice reads the row's committed tokens only, so the output law is the target's
    (a deterministic draft is verified as a one-hot q). When every active row copies,
    the model is not run at all: a copying round costs one target forward. The model's
    cache then falls behind and catches up in one wider forward when it next drafts.

    Args:
        model: the model drafter (with or without a confidence threshold).
        lookup: the prompt lookup drafter; its `confident` must not be None (else every
            row would always copy).
    """

    def __init__(self, model: ModelDrafter, lookup: PromptLookupDrafter | None = None) -> None:
        if not isinstance(model, ModelDrafter):
            raise TypeError(f"model: expected a ModelDrafter, got {type(model).__name__}")
        lookup = PromptLookupDrafter() if lookup is None else lookup
        if not isinstance(lookup, PromptLookupDrafter) or lookup.confident is None:
            raise ValueError(f"lookup: expected a PromptLookupDrafter with confident set, got {lookup!r}")
        self.model, self.lookup = model, lookup

    def start(self, tokens: Array, lengths: Array, capacity: int) -> HybridState:
        """The model's prefill (all but the last prompt token)."""
        draft = self.model.start(tokens, lengths, capacity)
        return HybridState(draft=draft, seen=lengths - 1, modelled=lengths < 0)

    def draft_lengths(self, tokens: Array, lengths: Array, k: int) -> Array:
        """Every row drafts k: copied where it matches, from the model elsewhere."""
        return self.model.draft_lengths(tokens, lengths, k)

    def propose(self, state: HybridState, tokens: Array, lengths: Array, k: int,
                params: SamplingParams, uniforms: Array) -> Proposal:
        """Copies for matching rows, model drafts (and their q) for the others."""
        xp = namespace(tokens)
        copy = self.lookup.draft_lengths(tokens, lengths, k) == k  # [B]
        copied = self.lookup.propose(None, tokens, lengths, k, params, uniforms)
        behind = host_ints(xp.concat([xp.astype(xp.all(copy)[None], xp.int64),
                                      xp.max(lengths - state.seen)[None]]))
        if behind[0]:
            return Proposal(tokens=copied.tokens, probs=None, state=dataclasses.replace(
                state, modelled=xp.zeros_like(copy)))
        drafted = self.model.propose(DraftState(cache=state.draft.cache, window=max(1, behind[1])),
                                     tokens, lengths, k, params, uniforms)
        made = int(drafted.tokens.shape[1])
        pad = k - made  # a thresholded model may stop early; copying rows keep all k
        own = xp.concat([drafted.tokens, xp.zeros((tokens.shape[0], pad), dtype=xp.int64,
                                                   device=device(tokens))], axis=1)
        q = drafted.probs
        assert q is not None
        vocab = int(q.shape[2])
        ids = xp.arange(vocab, dtype=xp.int64, device=device(tokens))
        q = xp.concat([q, xp.astype(xp.zeros((tokens.shape[0], pad, 1), dtype=xp.int64,
                                             device=device(tokens)) == ids, q.dtype)], axis=1)
        one_hot = xp.astype(copied.tokens[..., None] == ids, q.dtype)  # [B, k, V]
        model_lengths = drafted.lengths if drafted.lengths is not None else xp.full_like(lengths, made)
        return Proposal(
            tokens=xp.where(copy[:, None], copied.tokens, own),
            probs=xp.where(copy[:, None, None], one_hot, q),
            state=HybridState(draft=drafted.state, seen=lengths, modelled=~copy),
            lengths=xp.where(copy, k, model_lengths))

    def advance(self, state: HybridState, lengths: Array) -> HybridState:
        """Modelled rows: the cache holds L - 2 committed tokens (as `ModelDrafter.advance`);
        copying rows: what it held before their copies."""
        xp = namespace(lengths)
        seen = xp.minimum(xp.where(state.modelled, xp.clip(lengths - 2, min=0), state.seen), lengths - 1)
        return HybridState(draft=DraftState(cache=rollback(state.draft.cache, seen), window=2),
                           seen=seen, modelled=state.modelled)


def _threshold(name: str) -> tuple[str, float | None]:
    base, at, tail = name.rpartition("@")
    if not at:
        return name, None
    try:
        value = float(tail)
    except ValueError:
        raise ValueError(f"draft: expected NAME@THRESHOLD with a number after '@', got {name!r}") from None
    if not 0 < value < 1:
        raise ValueError(f"threshold: expected a number in (0, 1) after '@' in {name!r}, got {tail}")
    return base, value


def compose_drafter(name: str, load: Callable[[str], Drafter], *, default_model: str) -> Drafter:
    """A backend's drafter by name, with the shared syntax on top of its own names.

    "NAME@T": the model drafter NAME stopping each row at confidence T (see `ModelDrafter`);
    "hybrid" (the model `default_model`) or "hybrid:NAME": prompt lookup where the context
    repeats, NAME elsewhere; "hybrid@T" / "hybrid:NAME@T" combine both. Other names go to
    `load` unchanged.
    """
    if not isinstance(name, str):
        raise TypeError(f"draft: expected a name (str), got {type(name).__name__}")
    base, threshold = _threshold(name)
    hybrid = base == "hybrid" or base.startswith("hybrid:")
    inner = default_model if base == "hybrid" else base.removeprefix("hybrid:") if hybrid else base
    drafter = load(inner)
    if threshold is None and not hybrid:
        return drafter
    if not isinstance(drafter, ModelDrafter):
        raise ValueError(f"draft: {name!r} needs a model draft for {inner!r}, got a "
                         f"{type(drafter).__name__}")
    if threshold is not None:
        drafter = ModelDrafter(drafter.model, threshold=threshold)
    return HybridDrafter(drafter) if hybrid else drafter
