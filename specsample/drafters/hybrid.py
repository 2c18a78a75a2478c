"""Hybrid drafting: prompt lookup where the context repeats itself, a draft model elsewhere.

The drafter names that build these ("hybrid", "auto", "NAME@T") are `specsample.api.draft_names`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from specsample._array import Array, check_int, device, host_ints, namespace
from specsample.core.cache import rollback
from specsample.core.params import SamplingParams
from specsample.core.protocols import FeatureDrafter, Proposal
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.drafters.model import DraftState, ModelDrafter

__all__ = ["FeatureHybridDrafter", "Gate", "HybridDrafter", "HybridState"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class HybridState:
    """The draft model's state and how far its cache follows each row.

    Attributes:
        draft: the model drafter's state; its cache holds `seen[b]` committed tokens of row b.
        seen: int64 [B]: cache entries known to equal the row's committed tokens.
        modelled: bool [B]: rows whose drafts came from the model in the last round (their
            accepted drafts are in the cache too; `advance` counts them).
        drafted: int64 [B]: how many model drafts each modelled row verified.
        accepted, trials: int64 [B]: each row's own evidence on the model draft: accepted
            drafts, and accepted drafts plus rejections (what `Metrics.alpha` counts).
    """

    draft: DraftState
    seen: Array
    modelled: Array
    drafted: Array
    accepted: Array
    trials: Array


@runtime_checkable
class Gate(Protocol):
    """Decides, per row and round, whether a row that does not copy drafts from the model
    (`auto`'s rule: `specsample.engine.scheduler.Scheduler`). It reads each row's own record
    of the model's drafts, so a row's choice never depends on the target's laws."""

    fan_out: int

    @property
    def narrows(self) -> bool:
        """Whether rounds are narrowed to the width that pays."""
        ...

    def worth(self, accepted: Array, trials: Array, k: int) -> Array:
        """bool [B]: rows whose model drafts are predicted to beat a plain step."""
        ...

    def never(self, k: int) -> bool:
        """Whether no row can draft from the model at K = k."""
        ...

    def describe(self, k: int) -> str:
        """The rule in words."""
        ...


class HybridDrafter:
    """Per row and round: prompt lookup's copy where the row's context ends in a confident
    match (`PromptLookupDrafter.draft_lengths` gives all K), the model draft elsewhere.

    The choice reads the row's committed tokens only, so the output law is the target's
    (a deterministic draft is verified as a one-hot q). When every active row copies,
    the model is not run at all: a copying round costs one target forward. The model's
    cache then falls behind and catches up in one wider forward when it next drafts.

    With a `scheduler` (the `auto` drafter), a row that does not copy drafts from the model
    only while the scheduler's gate (`Gate.worth`) predicts that to beat a plain step, from
    the row's own acceptance of the model's drafts so far; otherwise the row takes a plain
    step (no draft: one token from p). Each row decides from its own history, so its
    tokens do not depend on its neighbours. A row that neither copies nor uses the model
    takes prompt lookup's own length (one draft after a short match); when the gate already
    rules the model out before any evidence, rounds are exactly prompt lookup's, plain
    steps included. A scheduler that narrows rounds to the width that pays makes a row's
    tokens depend on the batch's width choices: the law is the target's either way, but a
    row sampled in a batch may differ from the same row alone.

    Args:
        model: the model drafter (with or without a confidence threshold).
        lookup: the prompt lookup drafter; its `confident` must not be None (else every
            row would always copy).
        scheduler: None (the model always drafts for non-copying rows), or the gate.
            Its `fan_out` m >= 1 makes a row that uses the model propose the model's
            min(m, K) most likely next tokens as siblings below its last committed token,
            one draft step a round (`ModelDrafter.candidates`), verified as deterministic
            candidates by `verify_tree` (the round is then a tree round, copies as chains in
            it); a row's evidence is then one trial a round, a hit or not.
    """

    def __init__(self, model: ModelDrafter, lookup: PromptLookupDrafter | None = None, *,
                 scheduler: Gate | None = None) -> None:
        if not isinstance(model, ModelDrafter):
            raise TypeError(f"model: expected a ModelDrafter, got {type(model).__name__}")
        lookup = PromptLookupDrafter() if lookup is None else lookup
        if not isinstance(lookup, PromptLookupDrafter) or lookup.confident is None:
            raise ValueError(f"lookup: expected a PromptLookupDrafter with confident set, got {lookup!r}")
        if scheduler is not None and not isinstance(scheduler, Gate):
            raise TypeError(f"scheduler: expected None or a Gate (specsample.engine.scheduler.Scheduler), "
                            f"got {type(scheduler).__name__}")
        self.model, self.lookup, self.scheduler = model, lookup, scheduler
        self.fan_out = 0 if scheduler is None else check_int("scheduler.fan_out", scheduler.fan_out, 0)

    def describe(self, k: int) -> str:
        """What the drafter does at K = k, and why (for a command line to print)."""
        if self.scheduler is None:
            return "prompt lookup where the context repeats, the draft model elsewhere"
        return self.scheduler.describe(k)

    def start(self, tokens: Array, lengths: Array, capacity: int) -> HybridState:
        """An empty model cache: the model reads the prompt when it first drafts (the catch-up
        of a row whose cache fell behind), so a call whose rows copy or take plain steps never
        pays the model's prefill."""
        empty = self.model.model.new_cache(int(tokens.shape[0]), capacity)
        return self._started(DraftState(cache=empty, window=1), lengths, 0 * lengths)

    def _started(self, draft: DraftState, lengths: Array, seen: Array) -> HybridState:
        zeros = namespace(lengths).zeros_like(lengths)
        return HybridState(draft=draft, seen=seen, modelled=lengths < 0, drafted=zeros,
                           accepted=zeros, trials=zeros)

    def _worth(self, xp: Any, state: HybridState, k: int) -> Array:
        """bool [B]: rows for which the model's drafts are predicted to beat a plain step."""
        if self.scheduler is None:
            return xp.ones(state.seen.shape, dtype=xp.bool, device=device(state.seen))
        return self.scheduler.worth(state.accepted, state.trials, k)

    def draft_lengths(self, tokens: Array, lengths: Array, k: int) -> Array:
        """k for every row (copied where it matches, from the model elsewhere); when the model
        can never run (gated off at the prior, and a row gains evidence only by drafting),
        prompt lookup's own lengths, so a round where nothing matches is a plain step."""
        if self._never(k):
            return self.lookup.draft_lengths(tokens, lengths, k)
        return self.model.draft_lengths(tokens, lengths, k)

    def _never(self, k: int) -> bool:
        return self.scheduler is not None and self.scheduler.never(k)

    def draft_plan(self, state: HybridState, tokens: Array, lengths: Array, k: int
                   ) -> tuple[Array, Array]:
        """What `propose` at `k` will draft per row, before the round: each row's length
        (int64 [B]: k where it copies or uses the model, prompt lookup's own length
        elsewhere) and whether the row's proposal is a copy (bool [B]), so that the round's
        width can be rated with each kind's own acceptance (`Metrics.alpha_at`). It reads
        the same inputs as `propose` and decides alike."""
        xp = namespace(tokens)
        matched = self.lookup.draft_lengths(tokens, lengths, k)  # k, 1 or 0
        if self._never(k):
            return matched, matched > 0
        use = self._uses_model(xp, state, matched, k)
        own = xp.full_like(matched, min(self.fan_out, k)) if self.fan_out else \
            self.model.draft_lengths(tokens, lengths, k)
        return xp.where(use, own, matched), ~use & (matched > 0)

    def _uses_model(self, xp: Any, state: HybridState, matched: Array, k: int) -> Array:
        """bool [B]: rows that draft from the model this round: those that do not copy all k
        (prompt lookup's `matched` below k) and whose own record makes the model worth it.
        `draft_plan` and `propose` both decide by it, so the plan is what gets drafted."""
        return (matched != k) & self._worth(xp, state, k)

    def skip(self, state: HybridState) -> HybridState:
        """After a plain step: the model saw nothing new (`advance` keeps what its cache holds)."""
        return dataclasses.replace(state, modelled=namespace(state.seen).zeros_like(state.modelled))

    def propose(self, state: HybridState, tokens: Array, lengths: Array, k: int,
                params: SamplingParams, uniforms: Array) -> Proposal:
        """Copies for matching rows, model drafts (and their q) for the rows that use the
        model; the others take prompt lookup's own length (one draft after a short match,
        none without a match)."""
        xp = namespace(tokens)
        matched, copied = self.lookup.lengths_and_copies(tokens, lengths, k)  # matched: k, 1 or 0
        copy = matched == k
        use = self._uses_model(xp, state, matched, k)
        flags = host_ints(xp.concat([xp.astype(xp.stack([xp.all(copy), xp.any(use)]), xp.int64),
                                     xp.max(lengths - state.seen)[None]]))
        idle = self.skip(state)
        if flags[0]:
            return Proposal(tokens=copied.tokens, probs=None, state=idle)
        if not flags[1]:  # nobody uses the model: prompt lookup alone
            return Proposal(tokens=copied.tokens, probs=None, state=idle, lengths=matched)
        fed = DraftState(cache=state.draft.cache, window=max(1, flags[2]))
        if self.fan_out:
            return self._fan_out(state, fed, tokens, lengths, k, use, matched, copied.tokens)
        drafted = self.model.propose(fed, tokens, lengths, k, params, uniforms)
        made = int(drafted.tokens.shape[1])
        pad = k - made  # a thresholded model may stop early; copying rows keep all k
        own = xp.concat([drafted.tokens, xp.zeros((tokens.shape[0], pad), dtype=xp.int64,
                                                   device=device(tokens))], axis=1)
        q = drafted.probs
        assert q is not None
        ids = xp.arange(int(q.shape[2]), dtype=xp.int64, device=device(tokens))
        q = xp.concat([q, xp.astype(xp.zeros((tokens.shape[0], pad, 1), dtype=xp.int64,
                                             device=device(tokens)) == ids, q.dtype)], axis=1)
        one_hot = xp.astype(copied.tokens[..., None] == ids, q.dtype)  # [B, k, V]
        model_lengths = drafted.lengths if drafted.lengths is not None else xp.full_like(lengths, made)
        own_lengths = xp.where(use, model_lengths, 0)
        return Proposal(
            tokens=xp.where(use[:, None], own, copied.tokens),
            probs=xp.where(use[:, None, None], q, one_hot),
            state=dataclasses.replace(state, draft=drafted.state, seen=lengths, modelled=use,
                                      drafted=own_lengths),
            lengths=xp.where(use, own_lengths, matched))

    def _fan_out(self, state: HybridState, fed: DraftState, tokens: Array, lengths: Array, k: int,
                 use: Array, matched: Array, copies: Array) -> Proposal:
        """A tree proposal: the model's min(fan_out, k) candidates as siblings for the rows that
        use it, prompt lookup's chain (k, 1 or 0 drafts) for the others."""
        xp = namespace(tokens)
        m = min(self.fan_out, k)
        candidates, draft = self.model.candidates(fed, tokens, lengths, m)
        batch, dev = int(tokens.shape[0]), device(tokens)
        pad = xp.zeros((batch, k - m), dtype=xp.int64, device=dev)
        nodes = xp.arange(k, dtype=xp.int64, device=dev)[None, :]
        parents = xp.where(use[:, None], -1, nodes - 1)  # siblings, or a chain
        return Proposal(
            tokens=xp.where(use[:, None], xp.concat([candidates, pad], axis=1), copies), probs=None,
            state=dataclasses.replace(state, draft=draft, seen=lengths, modelled=use,
                                      drafted=xp.astype(use, xp.int64)),  # one trial: a hit or not
            lengths=xp.where(use, m, matched), parents=xp.broadcast_to(parents, (batch, k)))

    def advance(self, state: HybridState, lengths: Array) -> HybridState:
        """Modelled rows: the cache holds L - 2 committed tokens (as `ModelDrafter.advance`),
        and their acceptance evidence grows; other rows: what it held before the round."""
        xp = namespace(lengths)
        seen = self._valid(xp, state, lengths)
        # A modelled row committed its accepted drafts and one more token (fewer only at a stop).
        accepted = xp.where(state.modelled, xp.clip(lengths - state.seen - 1, min=0), 0)
        accepted = xp.minimum(accepted, state.drafted)
        rejected = xp.astype(state.modelled & (accepted < state.drafted), xp.int64)
        return dataclasses.replace(
            state, draft=DraftState(cache=rollback(state.draft.cache, seen), window=2), seen=seen,
            accepted=state.accepted + accepted, trials=state.trials + accepted + rejected)


    def _valid(self, xp: Any, state: HybridState, lengths: Array) -> Array:
        """Per row, how many cache positions stay valid after the round (`seen`)."""
        return xp.minimum(xp.where(state.modelled, xp.clip(lengths - 2, min=0), state.seen), lengths - 1)


class FeatureHybridDrafter(HybridDrafter):
    """`HybridDrafter` over a feature head (`specsample.drafters.head.HeadDrafter`): the round hands
    it the target's features of every forward, copy rounds and plain steps included, and the
    head's cache stays valid only up to the positions it computed from the target's features
    (never past the round's first drafted position), so catching up recomputes the rest."""

    def __init__(self, model: ModelDrafter, lookup: PromptLookupDrafter | None = None, **kwargs: Any
                 ) -> None:
        if not isinstance(model, FeatureDrafter):
            raise TypeError(f"model: expected a feature head drafter, got {type(model).__name__}")
        super().__init__(model, lookup, **kwargs)
        self.head: Any = model

    def start_features(self, tokens: Array, lengths: Array, capacity: int,
                       features: Array | None) -> HybridState:
        """The target's features of the prompt in an empty head cache: as with `start`, the
        head reads the prompt when it first drafts (the catch-up over the rows' positions
        from `seen`), so a call whose rows copy or take plain steps never pays its prefill."""
        cache = self.head.unfed_cache(tokens, lengths, capacity, features)
        return self._started(DraftState(cache=cache, window=1), lengths, 0 * lengths)

    def advance_features(self, state: HybridState, lengths: Array, features: Array,
                         first: Array) -> HybridState:
        """Hand the head the round's features, then `advance`."""
        cache = self.head.head.with_features(state.draft.cache, features, first, lengths - 1)
        return self.advance(dataclasses.replace(state, draft=DraftState(cache=cache, window=1)), lengths)

    def _valid(self, xp: Any, state: HybridState, lengths: Array) -> Array:
        # `state.seen` is the length at the last proposal: positions from there on were
        # drafted from the head's own predicted features.
        return xp.minimum(state.seen, lengths - 1)

