"""Hybrid drafting: prompt lookup where the context repeats itself, a draft model elsewhere.

The drafter names that build these ("hybrid", "auto", "NAME@T") are `specsample.api.draft_names`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from specsample._array import Array, check_int, device, host_ints, namespace
from specsample.core.cache import rollback
from specsample.core.metrics import predicted_speedup
from specsample.core.params import SamplingParams
from specsample.core.protocols import FeatureDrafter, Proposal
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.drafters.model import DraftState, ModelDrafter

__all__ = ["PRIOR_ALPHA", "FeatureHybridDrafter", "HybridDrafter", "HybridState", "one_draft_width"]


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


# The acceptance assumed for a model draft before any evidence, unless the drafter states
# its own (`prior_alpha`, e.g. a trained head's held-out acceptance from its card).
PRIOR_ALPHA = 0.8


class HybridDrafter:
    """Per row and round: prompt lookup's copy where the row's context ends in a confident
    match (`PromptLookupDrafter.draft_lengths` gives all K), the model draft elsewhere.

    The choice reads the row's committed tokens only, so the output law is the target's
    (a deterministic draft is verified as a one-hot q). When every active row copies,
    the model is not run at all: a copying round costs one target forward. The model's
    cache then falls behind and catches up in one wider forward when it next drafts.

    With a `cost_ratio` c (the `auto` drafter), a row that does not copy drafts from the
    model only while Thm 3.8 predicts that to beat a plain step, (1 - a^(K+1)) /
    ((1 - a)(K c + 1)) > 1, where a is the row's own acceptance of the model's drafts
    so far, starting from the prior (`prior_alpha`, worth `prior_weight` trials); otherwise
    the row takes a plain step (no draft: one token from p). Each row decides from its
    own history, so its tokens do not depend on its neighbours. A row that neither copies
    nor uses the model takes prompt lookup's own length (one draft after a short match);
    when the prior already rules the model out, rounds are exactly prompt lookup's, plain
    steps included.

    Args:
        model: the model drafter (with or without a confidence threshold).
        lookup: the prompt lookup drafter; its `confident` must not be None (else every
            row would always copy).
        cost_ratio: None (the model always drafts for non-copying rows), or c >= 0.
        prior_alpha: in [0, 1], the acceptance assumed before a row has evidence.
        prior_weight: >= 0, how many trials the prior is worth.
        width_cost: None, or (batch, width) -> the cost of a target forward of `width`
            positions per row over one position, at that batch size (measured by the
            backend). Given, the drafter rates each round (of one row or a batch) by its
            cost (`round_cost`), and the core loop narrows the round, down to a plain step,
            where Thm 3.8's acceptance model predicts the narrower one to end the call
            sooner (`specsample.engine.policy.batch_width`).
            A row's tokens then depend on the batch's width choices: the law is the target's
            either way, but a row sampled in a batch may differ from the same row alone.
        fan_out: 0 (the model drafts a chain), or m >= 1: a row that uses the model proposes
            the model's min(m, K) most likely next tokens as siblings below its last
            committed token, one draft step a round (`ModelDrafter.candidates`), verified as
            deterministic candidates by `verify_tree` (the round is then a tree round, copies
            as chains in it). Suits a draft whose top-1 acceptance is low and whose step is
            cheap (a feature head); a row's evidence is then one trial a round, a hit or not.
    """

    def __init__(self, model: ModelDrafter, lookup: PromptLookupDrafter | None = None, *,
                 cost_ratio: float | None = None, prior_alpha: float = PRIOR_ALPHA,
                 prior_weight: float = 8.0,
                 width_cost: Callable[[int, int], float] | None = None, fan_out: int = 0) -> None:
        if not isinstance(model, ModelDrafter):
            raise TypeError(f"model: expected a ModelDrafter, got {type(model).__name__}")
        lookup = PromptLookupDrafter() if lookup is None else lookup
        if not isinstance(lookup, PromptLookupDrafter) or lookup.confident is None:
            raise ValueError(f"lookup: expected a PromptLookupDrafter with confident set, got {lookup!r}")
        if cost_ratio is not None and not (isinstance(cost_ratio, (int, float)) and 0 <= cost_ratio < 1e6):
            raise ValueError(f"cost_ratio: expected None or a finite number >= 0, got {cost_ratio!r}")
        if not 0 <= prior_alpha <= 1 or not 0 <= prior_weight < 1e9:
            raise ValueError(f"prior_alpha, prior_weight: expected a rate in [0, 1] and a weight >= 0, "
                             f"got {prior_alpha!r}, {prior_weight!r}")
        if width_cost is not None and not callable(width_cost):
            raise TypeError(f"width_cost: expected None or a function (batch, width) -> cost, got "
                            f"{type(width_cost).__name__}")
        self.model, self.lookup = model, lookup
        self.cost_ratio = None if cost_ratio is None else float(cost_ratio)
        self.prior = (float(prior_alpha), float(prior_weight))
        self.width_cost = width_cost
        self.fan_out = check_int("fan_out", fan_out, 0)
        self.round_cost = None if width_cost is None else self._round_cost
        self.choice: str | None = None  # how `choose_model` picked the model, if it did

    def _round_cost(self, batch: int, drafts: int, *, modelled: bool = True) -> float:
        """A round of `drafts` per row at `batch` rows, in plain steps: the wider verify, plus,
        when some row drafts from the model (`modelled`), the model's drafts (each c of a
        target forward)."""
        assert self.width_cost is not None
        steps = 1 if self.fan_out else drafts  # a fan-out is one draft step, whatever its width
        model = (0.0 if self.cost_ratio is None or not modelled or self._never(drafts)
                 else steps * self.cost_ratio)
        return float(self.width_cost(batch, drafts + 1)) + model

    def describe(self, k: int) -> str:
        """What the drafter does at K = k, and why (for a command line to print)."""
        told = self._describe(k)
        return told if self.choice is None else f"{told}; {self.choice}"

    def _describe(self, k: int) -> str:
        if self.cost_ratio is None:
            return "prompt lookup where the context repeats, the draft model elsewhere"
        if self.width_cost is not None:
            even, wide = self._break_even(), self.verify_width()
            start = "the draft model" if self.prior[0] > even else "plain steps"
            drafts = (f"its {self.fan_out} most likely next tokens as sibling candidates, one draft "
                      f"step a round, for rows whose hit rate" if self.fan_out else
                      "the draft model only for rows whose acceptance of its drafts")
            return (f"prompt lookup where the context repeats; elsewhere {drafts} exceeds c + "
                    f"cost({wide} positions) - 1 "
                    f"(c = {self.cost_ratio:.2f}, cost {float(self.width_cost(1, wide)):.2f}: "
                    f"{even:.2f}), the rate at which that round beats a plain step (at "
                    f"the prior alpha {self.prior[0]:.2f}, rows start with {start}, then follow their own "
                    f"acceptance); each round as wide as Thm 3.8 predicts fastest (a plain step "
                    f"where no width pays, K = {k} at most), from the verify's cost at each width "
                    f"measured on this machine and the acceptance so far of proposals of each "
                    f"kind and length")
        speedup = predicted_speedup(self.prior[0], k, self.cost_ratio)
        start = "the draft model" if speedup > 1 else "plain steps"
        return (f"prompt lookup where the context repeats; elsewhere the draft model only where "
                f"Thm 3.8 predicts it faster than plain steps (c = {self.cost_ratio:.2f}: at the "
                f"prior alpha {self.prior[0]:.2f} and K = {k} it predicts {speedup:.2f}x, so rows "
                f"start with {start}, then follow their own acceptance)")

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
        if self.cost_ratio is None:
            return xp.ones(state.seen.shape, dtype=xp.bool, device=device(state.seen))
        alpha, weight = self.prior
        rate = (xp.astype(state.accepted, xp.float64) + alpha * weight) / (
            xp.astype(state.trials, xp.float64) + weight)
        if self.width_cost is not None:
            return rate > self._break_even()
        if self.fan_out:  # one hit or none a round, for one draft step
            return rate > self.cost_ratio
        rate = xp.clip(rate, min=0.0, max=1.0 - 1e-12)
        tokens = (1 - rate ** (k + 1)) / (1 - rate)
        return tokens > k * self.cost_ratio + 1

    def _break_even(self) -> float:
        """With the verify's cost measured per width, the acceptance above which one model
        draft a round (a chain draft, or a fan-out: one step, `verify_width` positions) beats a
        plain step at batch 1: 1 + a > c + cost(verify_width positions). Rounds
        are then narrowed to the width that pays (`round_cost`), so a row is worth drafting
        for as soon as the narrowest round pays: a row whose one draft does not pay has
        fewer tokens to gain per draft at any wider width than that draft costs."""
        assert self.width_cost is not None and self.cost_ratio is not None
        return self.cost_ratio + float(self.width_cost(1, self.verify_width())) - 1

    def verify_width(self) -> int:
        """Positions per row of a round where a row drafts from the model once (`one_draft_width`)."""
        return one_draft_width(self.fan_out)

    def draft_lengths(self, tokens: Array, lengths: Array, k: int) -> Array:
        """k for every row (copied where it matches, from the model elsewhere); when the model
        can never run (gated off at the prior, and a row gains evidence only by drafting),
        prompt lookup's own lengths, so a round where nothing matches is a plain step."""
        if self._never(k):
            return self.lookup.draft_lengths(tokens, lengths, k)
        return self.model.draft_lengths(tokens, lengths, k)

    def _never(self, k: int) -> bool:
        if self.cost_ratio is None or k == 0:
            return False
        if self.width_cost is not None:
            return self.prior[0] <= self._break_even()
        return predicted_speedup(self.prior[0], k, self.cost_ratio) <= 1

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


def one_draft_width(fan_out: int) -> int:
    """Positions per row of a round where a row drafts from the model once: 2 for one chain
    draft, 1 + fan_out for a fan-out."""
    return 1 + max(1, fan_out)
