"""Draft trees grown by the draft's confidence (EAGLE-2's dynamic tree).

A round grows the tree level by level from the draft's own laws. The root's `branch` most
likely next tokens form the first level; each next level expands the `branch` nodes of the
level before with the highest path probability (the product of the draft's probabilities
along the path) into their `branch` most likely children. Of every node so grown, the
`nodes` with the highest path probability form the tree. A child's path probability is at
most its parent's (ties go to the parent, grown first), so the kept nodes always include
their ancestors.

The tree is a deterministic function of the draft's laws after the committed context: it
reads no uniform and nothing of the target. `verify_tree` then tries the nodes as
deterministic candidates (one-hot laws: at each node a draw from the target's residual
without replacement over the siblings), and the output law is the target's whatever the
tree looks like (proofs/tree_verification.md; `proofs/exact/tree.py` checks a grown tree
exactly through `grow_tree`). A tree that reads the target's draws (what it will sample)
does not keep the law: the exact checker's negative control.

The confidence is the draft's softmax at temperature 1, whatever the sampling settings,
as transformers' `assistant_confidence_threshold` reads it.

A `RatedBudget` sizes each round's tree instead of a fixed node count: whatever the tree, a
round accepts on average the sum over its nodes of the target's probability of the node's
path (the output law is the target's, and a node is accepted exactly when the emitted
tokens start with its path). The draft's path probability, scaled by the run's measured
ratio of accepted drafts to predicted ones, estimates it; Thm 3.8 with the verify's cost
per width measured on the machine then rates each node count, and each further level of
growth, against its cost. Rows whose drafts are unlikely take no tree: a round where no row
has one is a plain step. The choice reads the draft's laws and earlier rounds' outcomes,
never the current round's uniforms or the target's laws, so the law is kept
(proofs/tree_verification.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from specsample._array import Array, check_int, device, host_array, largest, namespace
from specsample.core.cache import rollback
from specsample.core.metrics import Costs
from specsample.core.protocols import TreeModel, TreeProposal
from specsample.drafters.head import FeatureHead, HeadDrafter, _needs_features
from specsample.drafters.model import DraftRating, DraftState, ModelDrafter

__all__ = ["ConfidenceTreeDrafter", "GrownState", "HeadConfidenceTreeDrafter", "RatedBudget",
           "confidence_law", "grow_tree", "grown_tree_budget", "is_grown_tree_name", "node_path"]

# The budget a drafter takes when none is given: 8 nodes over 4 levels.
NODES, DEPTH, BRANCH = 8, 4, 2

# tokens [B, E], parents [B, E] (-1: the root; topological) -> the draft's law after each
# node's path [B, E, V]
Expand = Callable[[Array, Array], Array]


def _check_positive(name: str, value: object) -> float:
    """`value` as a float, or a ValueError naming `name` unless it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RatedBudget:
    """Sizes each round's grown tree by Thm 3.8 with the verify's cost counted (see the
    module docstring).

    A round that grows `levels` levels and keeps `w` nodes costs levels c + width(B, w + 1)
    plain steps and commits 1 + kappa m tokens per row on average, m the row's kept path
    probability; the round keeps the w (the same for every row, as the verify's width is)
    that rates best, and grows one more level only while the most it could add (every
    expanded node's mass in one child) would rate better.

    Attributes:
        costs: the costs measured on this machine: `c`, one growth level (a draft forward)
            over a one-position target forward, and `width`, the verify's cost per width
            (required here).
        kappa: accepted drafts per unit of the draft's path probability before evidence, > 0.
        weight: the prior's weight, in units of predicted drafts, > 0.
    """

    costs: Costs
    kappa: float = 1.0
    weight: float = 2.0

    def __post_init__(self) -> None:
        if not isinstance(self.costs, Costs) or self.costs.width is None:
            raise TypeError(f"costs: expected Costs with the verify's cost per width, got {self.costs!r}")
        _check_positive("kappa", self.kappa)
        _check_positive("weight", self.weight)

    def calibration(self, accepted: float, predicted: float) -> float:
        """kappa after the run's evidence: `accepted` drafts where the draft's path
        probabilities summed to `predicted`."""
        return (accepted + self.kappa * self.weight) / (predicted + self.weight)

    def _rates(self, scores: np.ndarray, levels: int, kappa: float, extra: int = 0,
               added: float = 0.0) -> np.ndarray:
        """Tokens per cost of keeping w = 0..M of the nodes of `scores` [B, M] (each row's path
        probabilities, in decreasing order), with `extra` more positions holding `added` more
        mass per row."""
        width = self.costs.width
        assert width is not None  # checked at construction
        batch = int(scores.shape[0])
        masses = np.concatenate([[0.0], np.cumsum(scores.mean(axis=0))])
        cost = np.array([levels * self.costs.c + float(width(batch, w + extra + 1))
                         for w in range(len(masses))])
        rates: np.ndarray = (1 + kappa * (masses + added)) / cost
        return rates

    def keep(self, scores: np.ndarray, levels: int, kappa: float) -> int:
        """The node count that rates best for trees of `scores` [B, M] (each row's path
        probabilities, in decreasing order) grown over `levels` levels."""
        return int(np.argmax(self._rates(scores, levels, kappa)))

    def grow_on(self, scores: np.ndarray, expanded: np.ndarray, levels: int, kappa: float) -> bool:
        """Whether growing a further level over the nodes `expanded` [B, k] (their path
        probabilities) could rate better than the best tree of `scores` [B, M] now."""
        now = float(np.max(self._rates(scores, levels, kappa)))
        added = float(expanded.sum(axis=1).mean())
        later = self._rates(scores, levels + 1, kappa, extra=int(expanded.shape[1]), added=added)
        return float(np.max(later)) > now


@dataclasses.dataclass(frozen=True, kw_only=True)
class GrownState(DraftState):
    """A grown-tree drafter's state: the draft's, and the evidence a `RatedBudget` reads.

    Attributes:
        proposed: each row's committed length when its last tree was grown (host int64
            [B]), or None before the first.
        mass: each row's last tree's kept path probability (host float64 [B]), or None
            (before the first, or with no budget: no evidence is kept).
        accepted: drafts accepted in the run's rounds so far.
        predicted: the path probability those rounds' trees kept, summed.
    """

    proposed: np.ndarray | None = None
    mass: np.ndarray | None = None
    accepted: float = 0.0
    predicted: float = 0.0


def _evidence(state: DraftState, lengths: Array | None) -> tuple[float, float]:
    """The run's accepted drafts and predicted ones, after the round that committed up to
    `lengths` (None: before it): a row that moved from `proposed` to L accepted
    L - proposed - 1 drafts (the round's final token is not a draft); a row that did not
    move had finished."""
    if not isinstance(state, GrownState):
        return 0.0, 0.0
    if lengths is None or state.proposed is None or state.mass is None:
        return state.accepted, state.predicted
    now = host_array(lengths).astype(np.int64)
    moved = now > state.proposed
    accepted = float(np.clip(now - state.proposed - 1, 0, None)[moved].sum())
    return state.accepted + accepted, state.predicted + float(state.mass[moved].sum())


def confidence_law(logits: Array) -> Array:
    """The draft's softmax at temperature 1 over the last axis (-inf logits: probability 0)."""
    xp = namespace(logits)
    shifted = xp.exp(logits - xp.max(logits, axis=-1, keepdims=True))
    return shifted / xp.sum(shifted, axis=-1, keepdims=True)


def node_path(fed: Array, parents: Array, row: int, node: int) -> tuple[int, ...]:
    """The tokens from the tree's first level down to `node` (itself last) in row `row` of an
    `Expand` call's tokens and parents: the path whose law that call is asked for."""
    path, at = [], node
    while at >= 0:
        path.append(int(fed[row, at]))
        at = int(parents[row, at])
    return tuple(reversed(path))


def grow_tree(root: Array, expand: Expand, *, nodes: int, depth: int, branch: int,
              budget: RatedBudget | None = None, kappa: float | None = None) -> TreeProposal:
    """The tree of the `nodes` most probable paths under the draft (see the module docstring).

    Args:
        root: [B, V], the draft's law after each row's committed context.
        expand: the draft's laws after the paths of a partial tree (see `Expand`); it is
            called depth - 1 times, with the tree expanded so far (the last `branch` nodes,
            or fewer, are the new ones; their laws are the ones read).
        nodes: the node budget, >= 1.
        depth: the deepest level, >= 1.
        branch: children tried per expanded node and nodes expanded per level, >= 1.
        budget: None (keep min(nodes, grown) nodes after `depth` levels), or a RatedBudget
            that stops growing and keeps the node count (at most `nodes`, possibly 0) that
            rate best; `kappa` is then its calibration (default `budget.kappa`).

    Returns:
        A deterministic TreeProposal (probs None) of min(nodes, grown) nodes per row (with a
        budget, as many as it keeps: `sizes` 0 and one unused column where it keeps none),
        in topological order, the siblings of a node in order of decreasing probability.
    """
    return _grow(root, expand, nodes=nodes, depth=depth, branch=branch, budget=budget, kappa=kappa)[0]


def _grow(root: Array, expand: Expand, *, nodes: int, depth: int, branch: int, budget: RatedBudget | None,
          kappa: float | None) -> tuple[TreeProposal, np.ndarray | None]:
    """`grow_tree`, and with a budget each row's kept path probability (float64 [B] on the
    host; None without one)."""
    check_int("nodes", nodes, 1)
    check_int("depth", depth, 1)
    check_int("branch", branch, 1)
    if budget is not None and not isinstance(budget, RatedBudget):
        raise TypeError(f"budget: expected None or a RatedBudget, got {type(budget).__name__}")
    prior = budget.kappa if budget is not None else 1.0
    calibration = prior if kappa is None else _check_positive("kappa", kappa)
    xp = namespace(root)
    if root.ndim != 2:
        raise ValueError(f"root: expected the draft's laws [B, V], got shape {list(root.shape)}")
    batch, vocab = (int(d) for d in root.shape)
    where = device(root)
    b = min(branch, vocab)
    score, token = largest(root, b)  # [B, b]
    # Every grown candidate, level by level: token, path probability, the expanded node (an
    # index into the fed tree) it hangs below (-1: the root).
    tokens, scores, below = [token], [score], [xp.full((batch, b), -1, dtype=xp.int64, device=where)]
    fed_tokens = xp.zeros((batch, 0), dtype=xp.int64, device=where)
    fed_parents = xp.zeros((batch, 0), dtype=xp.int64, device=where)
    fed_candidate = xp.zeros((batch, 0), dtype=xp.int64, device=where)  # fed node -> candidate
    start, level, levels = 0, (token, score, below[0]), 1
    for _ in range(1, depth):
        width = int(level[0].shape[1])
        k = min(b, width)
        pick = xp.astype(xp.argsort(-level[1], axis=1, stable=True)[:, :k], xp.int64)  # [B, k]
        if budget is not None:
            grown = -np.sort(-host_array(xp.concat(scores, axis=1)).astype(np.float64), axis=1)[:, :nodes]
            expanded = host_array(xp.take_along_axis(level[1], pick, axis=1)).astype(np.float64)
            if not budget.grow_on(grown, expanded, levels, calibration):
                break
        levels += 1
        first = int(fed_tokens.shape[1])
        fed_tokens = xp.concat([fed_tokens, xp.take_along_axis(level[0], pick, axis=1)], axis=1)
        fed_parents = xp.concat([fed_parents, xp.take_along_axis(level[2], pick, axis=1)], axis=1)
        fed_candidate = xp.concat([fed_candidate, start + pick], axis=1)
        laws = expand(fed_tokens, fed_parents)
        if tuple(laws.shape) != (batch, first + k, vocab):
            raise ValueError(f"expand: expected laws of shape {[batch, first + k, vocab]}, got "
                             f"{list(laws.shape)}")
        child_score, child_token = largest(laws[:, first:, :], b)  # [B, k, b]
        child_score = xp.take_along_axis(level[1], pick, axis=1)[:, :, None] * child_score
        parent = first + xp.arange(k, dtype=xp.int64, device=where)  # the fed indices of the expanded
        child_below = xp.broadcast_to(parent[None, :, None], (batch, k, b))
        start += width
        level = tuple(xp.reshape(a, (batch, k * b)) for a in (child_token, child_score, child_below))
        tokens.append(level[0])
        scores.append(level[1])
        below.append(level[2])
    token_all, score_all, below_all = (xp.concat(a, axis=1) for a in (tokens, scores, below))
    kept = used = min(nodes, int(token_all.shape[1]))
    mass = None
    if budget is not None:
        ordered = -np.sort(-host_array(score_all).astype(np.float64), axis=1)[:, :kept]  # [B, kept]
        used = budget.keep(ordered, levels, calibration)
        mass = ordered[:, :used].sum(axis=1)
        kept = max(used, 1)  # a tree of no node keeps one unused column (sizes 0)
    # The most probable paths (a stable sort: among equal ones, the earlier grown), then back
    # in growth order, which is topological.
    best = xp.argsort(-score_all, axis=1, stable=True)[:, :kept]
    chosen = xp.astype(xp.sort(best, axis=1), xp.int64)  # [B, n] candidate indices
    parent_fed = xp.take_along_axis(below_all, chosen, axis=1)
    parent_candidate = xp.where(
        parent_fed >= 0,
        xp.take_along_axis(fed_candidate, xp.clip(parent_fed, min=0), axis=1) if fed_candidate.shape[1]
        else parent_fed, -1)
    # A kept node's parent is kept, and the kept are in ascending candidate order: its index
    # among them is how many kept candidates come before it.
    position = xp.sum(xp.astype(chosen[:, None, :] < parent_candidate[:, :, None], xp.int64), axis=2)
    parents = xp.where(parent_candidate >= 0, position, -1)
    sizes = xp.full((batch,), used, dtype=xp.int64, device=where)
    tree = TreeProposal(tokens=xp.take_along_axis(token_all, chosen, axis=1), parents=parents, sizes=sizes)
    return tree, mass


class ConfidenceTreeDrafter:
    """Draft trees grown by a draft model's confidence (see the module docstring): a
    `specsample.core.protocols.StatefulTreeDrafter`.

    A round feeds the committed tokens the draft has not read, then grows the tree with one
    tree forward of the draft per level (`TreeModel.forward_tree`, the partial tree fed
    again from the committed context), and rolls the draft back to the committed tokens.

    Args:
        model: the draft model, a TreeModel over the target's vocabulary.
        nodes: the node budget per round, >= 1 (the target verifies that many positions).
        depth: the deepest level, >= 1.
        branch: children per expanded node and nodes expanded per level, >= 1.
        rating: what the draft states about itself (see `ModelDrafter`).
        budget: None (every round grows `depth` levels and keeps `nodes` nodes), or a
            RatedBudget that sizes each round's tree within them, calibrated by the run's
            outcomes so far.
    """

    def __init__(self, model: TreeModel, *, nodes: int = NODES, depth: int = DEPTH, branch: int = BRANCH,
                 rating: DraftRating | None = None, budget: RatedBudget | None = None) -> None:
        if not isinstance(model, TreeModel):
            raise TypeError(f"model: expected a TreeModel (forward_tree and commit_path), got "
                            f"{type(model).__name__}")
        self.nodes = check_int("nodes", nodes, 1)
        self.depth = check_int("depth", depth, 1)
        self.branch = check_int("branch", branch, 1)
        if budget is not None and not isinstance(budget, RatedBudget):
            raise TypeError(f"budget: expected None or a RatedBudget, got {type(budget).__name__}")
        self.budget = budget
        self.drafter = ModelDrafter(model, rating=rating)
        self.model, self.rating = model, self.drafter.rating

    def _room(self, depth: int) -> int:
        """Positions a round's growth writes past the committed tokens."""
        return self.branch * max(depth - 1, 0) + 1

    def start(self, tokens: Array, lengths: Array, capacity: int) -> DraftState:
        """Prefill the draft with each prompt but its last token (room for a grown tree)."""
        room = check_int("capacity", capacity, 1) + self._room(self.depth)
        return self.drafter.start(tokens, lengths, room)

    def advance(self, state: DraftState, lengths: Array) -> DraftState:
        """Roll back to the tokens every row had committed before the round (a round commits
        at most depth + 1), to feed the rest next round."""
        xp = namespace(lengths)
        accepted, predicted = _evidence(state, lengths)
        return GrownState(cache=rollback(state.cache, xp.clip(lengths - self.depth - 1, min=0)),
                          window=self.depth + 1, accepted=accepted, predicted=predicted)

    def propose_from(self, state: DraftState, tokens: Array, lengths: Array, nodes: int, depth: int
                     ) -> tuple[TreeProposal, DraftState]:
        """A grown tree of at most min(nodes, self.nodes) nodes and min(depth, self.depth)
        levels per row, and the state after it (the draft at the committed tokens)."""
        nodes = min(check_int("nodes", nodes, 1), self.nodes)
        depth = min(check_int("depth", depth, 1), self.depth)
        logits, cache = self.drafter._feed(state, tokens, lengths)  # [B, V], L entries

        def expand(fed: Array, parents: Array) -> Array:
            nonlocal cache
            out, grown = self.model.forward_tree(fed, parents, cache)
            cache = rollback(grown, lengths)  # the tree's entries are dropped
            return confidence_law(out)

        accepted, predicted = _evidence(state, None)
        kappa = None if self.budget is None else self.budget.calibration(accepted, predicted)
        tree, mass = _grow(confidence_law(logits), expand, nodes=nodes, depth=depth, branch=self.branch,
                           budget=self.budget, kappa=kappa)
        proposed = None if mass is None else host_array(lengths).astype(np.int64)  # evidence a budget reads
        return tree, GrownState(cache=cache, window=state.window, proposed=proposed, mass=mass,
                                accepted=accepted, predicted=predicted)

    def propose_tree(self, tokens: Array, lengths: Array, nodes: int, depth: int) -> TreeProposal:
        """The same tree from the committed tokens alone (a fresh draft cache): for callers
        that keep no state, such as `specsample.testing.tree_samples`."""
        xp = namespace(lengths)
        state = self.start(tokens, lengths, int(xp.max(lengths)) + 1)
        return self.propose_from(state, tokens, lengths, nodes, depth)[0]

    def describe(self) -> dict[str, Any]:
        """The tree's budget, for a card or a report."""
        rated = {} if self.budget is None else {"rated": True, "c": self.budget.costs.c}
        return {"nodes": self.nodes, "depth": self.depth, "branch": self.branch, **rated}


class HeadConfidenceTreeDrafter(ConfidenceTreeDrafter):
    """Trees grown by a feature-level draft head's confidence (EAGLE-2 over an EAGLE head): a
    `specsample.core.protocols.FeatureTreeDrafter`. Each level is one tree forward of the
    head, each node reading its parent's predicted feature; the round hands the head the
    target's features of the accepted path, as `HeadDrafter` takes them for a chain.

    Args:
        head: the draft head, a FeatureHead with a tree forward.
        nodes: as `ConfidenceTreeDrafter`.
        depth: as `ConfidenceTreeDrafter`.
        branch: as `ConfidenceTreeDrafter`.
        rating: as `ConfidenceTreeDrafter`.
        budget: as `ConfidenceTreeDrafter`.
    """

    def __init__(self, head: FeatureHead, *, nodes: int = NODES, depth: int = DEPTH, branch: int = BRANCH,
                 rating: DraftRating | None = None, budget: RatedBudget | None = None) -> None:
        if not isinstance(head, FeatureHead):
            raise TypeError(f"head: expected a FeatureHead (a Model with with_features), got "
                            f"{type(head).__name__}")
        super().__init__(head, nodes=nodes, depth=depth, branch=branch, rating=rating,  # type: ignore[arg-type]
                         budget=budget)
        self.reader = HeadDrafter(head, rating=rating)
        self.drafter, self.head, self.rating = self.reader, head, self.reader.rating

    def start(self, tokens: Array, lengths: Array, capacity: int) -> DraftState:
        """Not available: the head needs the target's features (`start_features`)."""
        raise _needs_features(f"{type(self).__name__}.start", "start_features")

    def advance(self, state: DraftState, lengths: Array) -> DraftState:
        """Not available: the head needs the target's features (`advance_features`)."""
        raise _needs_features(f"{type(self).__name__}.advance", "advance_features")

    def propose_tree(self, tokens: Array, lengths: Array, nodes: int, depth: int) -> TreeProposal:
        """Not available: the head drafts from its state (`propose_from`)."""
        raise _needs_features(f"{type(self).__name__}.propose_tree", "propose_from")

    def start_features(self, tokens: Array, lengths: Array, capacity: int,
                       features: Array | None) -> DraftState:
        """As `HeadDrafter.start_features`, with room for a grown tree."""
        room = check_int("capacity", capacity, 1) + self._room(self.depth)
        return self.reader.start_features(tokens, lengths, room, features)

    def advance_features(self, state: DraftState, lengths: Array, features: Array,
                         first: Array) -> DraftState:
        """As `HeadDrafter.advance_features`, with the accepted path's features."""
        accepted, predicted = _evidence(state, lengths)
        moved = self.reader.advance_features(state, lengths, features, first)
        return GrownState(cache=moved.cache, window=moved.window, accepted=accepted, predicted=predicted)


def is_grown_tree_name(name: object) -> bool:
    """Whether a drafter name asks for a confidence-grown tree ("grown-tree", "grown-tree:...");
    `grown_tree_budget` then parses it."""
    return isinstance(name, str) and (name == "grown-tree" or name.startswith("grown-tree:"))


def grown_tree_budget(name: str) -> dict[str, int]:
    """The budget a name spells: "grown-tree" (the defaults), "grown-tree:N" (N nodes) or
    "grown-tree:NxD" (N nodes, D levels), as keyword arguments of `ConfidenceTreeDrafter`."""
    budget = name.removeprefix("grown-tree").removeprefix(":") if is_grown_tree_name(name) else ""
    parts = budget.split("x") if budget else []
    if not is_grown_tree_name(name) or len(parts) > 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"draft: expected 'grown-tree', 'grown-tree:N' or 'grown-tree:NxD' with N, D "
                         f"ints >= 1 (the node budget and the depth), got {name!r}")
    return {"nodes": NODES, "depth": DEPTH,
            **dict(zip(("nodes", "depth"), (int(p) for p in parts), strict=False))}
