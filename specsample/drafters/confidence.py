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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specsample._array import Array, check_int, device, namespace
from specsample.core.cache import rollback
from specsample.core.protocols import TreeModel, TreeProposal
from specsample.drafters.head import FeatureHead, HeadDrafter, _needs_features
from specsample.drafters.model import DraftRating, DraftState, ModelDrafter

__all__ = ["ConfidenceTreeDrafter", "HeadConfidenceTreeDrafter", "confidence_law", "grow_tree",
           "grown_tree_budget", "is_grown_tree_name", "node_path"]

# The budget a drafter takes when none is given: 8 nodes over 4 levels.
NODES, DEPTH, BRANCH = 8, 4, 2

# tokens [B, E], parents [B, E] (-1: the root; topological) -> the draft's law after each
# node's path [B, E, V]
Expand = Callable[[Array, Array], Array]


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


def _top(law: Array, b: int) -> tuple[Array, Array]:
    """The b largest entries of `law` [..., V] and their ids (ties to the lower id)."""
    xp = namespace(law)
    order = xp.argsort(-law, axis=-1, stable=True)[..., :b]
    return xp.take_along_axis(law, order, axis=-1), xp.astype(order, xp.int64)


def grow_tree(root: Array, expand: Expand, *, nodes: int, depth: int, branch: int) -> TreeProposal:
    """The tree of the `nodes` most probable paths under the draft (see the module docstring).

    Args:
        root: [B, V], the draft's law after each row's committed context.
        expand: the draft's laws after the paths of a partial tree (see `Expand`); it is
            called depth - 1 times, with the tree expanded so far (the last `branch` nodes,
            or fewer, are the new ones; their laws are the ones read).
        nodes: the node budget, >= 1.
        depth: the deepest level, >= 1.
        branch: children tried per expanded node and nodes expanded per level, >= 1.

    Returns:
        A deterministic TreeProposal (probs None) of min(nodes, grown) nodes per row, in
        topological order, the siblings of a node in order of decreasing probability.
    """
    check_int("nodes", nodes, 1)
    check_int("depth", depth, 1)
    check_int("branch", branch, 1)
    xp = namespace(root)
    if root.ndim != 2:
        raise ValueError(f"root: expected the draft's laws [B, V], got shape {list(root.shape)}")
    batch, vocab = (int(d) for d in root.shape)
    where = device(root)
    b = min(branch, vocab)
    score, token = _top(root, b)  # [B, b]
    # Every grown candidate, level by level: token, path probability, the expanded node (an
    # index into the fed tree) it hangs below (-1: the root).
    tokens, scores, below = [token], [score], [xp.full((batch, b), -1, dtype=xp.int64, device=where)]
    fed_tokens = xp.zeros((batch, 0), dtype=xp.int64, device=where)
    fed_parents = xp.zeros((batch, 0), dtype=xp.int64, device=where)
    fed_candidate = xp.zeros((batch, 0), dtype=xp.int64, device=where)  # fed node -> candidate
    start, level = 0, (token, score, below[0])
    for _ in range(1, depth):
        width = int(level[0].shape[1])
        k = min(b, width)
        pick = xp.astype(xp.argsort(-level[1], axis=1, stable=True)[:, :k], xp.int64)  # [B, k]
        first = int(fed_tokens.shape[1])
        fed_tokens = xp.concat([fed_tokens, xp.take_along_axis(level[0], pick, axis=1)], axis=1)
        fed_parents = xp.concat([fed_parents, xp.take_along_axis(level[2], pick, axis=1)], axis=1)
        fed_candidate = xp.concat([fed_candidate, start + pick], axis=1)
        laws = expand(fed_tokens, fed_parents)
        if tuple(laws.shape) != (batch, first + k, vocab):
            raise ValueError(f"expand: expected laws of shape {[batch, first + k, vocab]}, got "
                             f"{list(laws.shape)}")
        child_score, child_token = _top(laws[:, first:, :], b)  # [B, k, b]
        child_score = xp.take_along_axis(level[1], pick, axis=1)[:, :, None] * child_score
        parent = first + xp.arange(k, dtype=xp.int64, device=where)  # the fed indices of the expanded
        child_below = xp.broadcast_to(parent[None, :, None], (batch, k, b))
        start += width
        level = tuple(xp.reshape(a, (batch, k * b)) for a in (child_token, child_score, child_below))
        tokens.append(level[0])
        scores.append(level[1])
        below.append(level[2])
    token_all, score_all, below_all = (xp.concat(a, axis=1) for a in (tokens, scores, below))
    kept = min(nodes, int(token_all.shape[1]))
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
    sizes = xp.full((batch,), kept, dtype=xp.int64, device=where)
    return TreeProposal(tokens=xp.take_along_axis(token_all, chosen, axis=1), parents=parents, sizes=sizes)


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
    """

    def __init__(self, model: TreeModel, *, nodes: int = NODES, depth: int = DEPTH, branch: int = BRANCH,
                 rating: DraftRating | None = None) -> None:
        if not isinstance(model, TreeModel):
            raise TypeError(f"model: expected a TreeModel (forward_tree and commit_path), got "
                            f"{type(model).__name__}")
        self.nodes = check_int("nodes", nodes, 1)
        self.depth = check_int("depth", depth, 1)
        self.branch = check_int("branch", branch, 1)
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
        return DraftState(cache=rollback(state.cache, xp.clip(lengths - self.depth - 1, min=0)),
                          window=self.depth + 1)

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

        tree = grow_tree(confidence_law(logits), expand, nodes=nodes, depth=depth, branch=self.branch)
        return tree, DraftState(cache=cache, window=state.window)

    def propose_tree(self, tokens: Array, lengths: Array, nodes: int, depth: int) -> TreeProposal:
        """The same tree from the committed tokens alone (a fresh draft cache): for callers
        that keep no state, such as `specsample.testing.tree_samples`."""
        xp = namespace(lengths)
        state = self.start(tokens, lengths, int(xp.max(lengths)) + 1)
        return self.propose_from(state, tokens, lengths, nodes, depth)[0]

    def describe(self) -> dict[str, Any]:
        """The tree's budget, for a card or a report."""
        return {"nodes": self.nodes, "depth": self.depth, "branch": self.branch}


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
    """

    def __init__(self, head: FeatureHead, *, nodes: int = NODES, depth: int = DEPTH, branch: int = BRANCH,
                 rating: DraftRating | None = None) -> None:
        if not isinstance(head, FeatureHead):
            raise TypeError(f"head: expected a FeatureHead (a Model with with_features), got "
                            f"{type(head).__name__}")
        super().__init__(head, nodes=nodes, depth=depth, branch=branch, rating=rating)  # type: ignore[arg-type]
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
        return self.reader.advance_features(state, lengths, features, first)


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
