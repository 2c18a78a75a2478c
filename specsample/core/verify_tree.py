"""Tree verification: recursive rejection sampling over a draft tree (SpecInfer, Sequoia).

A draft tree of N nodes hangs below the last committed token (the root). Node i holds
token x_i and its parent a_i (-1: the root), with a_i < i, so that nodes come in
topological order and siblings in the order they are tried. Starting at the root with
the target's law there as the residual R, the walk repeats:

    for the children c of the current node, in order:
        accept c with probability min(1, R(x_c) / Q_c(x_c))
        accepted: descend to c, R := P(. | path to c), try c's children
        rejected: R := norm(max(R - Q_c, 0)), try the next child
    no child accepted: emit the accepted path's tokens and y ~ R.

Q_c is the law node c was drawn from. Two kinds of tree keep the output law exactly the
target's (proofs/tree_verification.md):

- stochastic siblings drawn i.i.d. from one law Q (with replacement): the residual
  after each rejection is the one SpecInfer's multi-step speculative sampling uses;
- deterministic candidates (prompt lookup, suffix trees: `draft_probs=None`, Q one-hot):
  the rule is then "accept x with probability R(x), else remove x's mass", i.e. a draw
  from R without replacement over the siblings; a duplicate sibling has R(x) = 0 and
  is never accepted.

A chain (a_i = i - 1) is token-wise verification (`specsample.verify`) with the same
uniforms. The residual is kept unnormalised with its mass z: the test u Q(x) z < R(x)
is division-free, strict (R(x) = 0 is never accepted) and needs no host sync.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from specsample._array import Array, check_shape, device, host_ints, namespace
from specsample.core.sample import sample
from specsample.core.verify import check_inputs, check_lengths

__all__ = ["TreeVerdict", "check_parents", "tree_depth", "tree_walk", "verify_tree"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TreeVerdict:
    """The outcome of one tree verification.

    Attributes:
        tokens: int64 [B, D+1]: the accepted path's tokens, the final token at index
            `num_accepted`, then -1 (D: the tree's depth).
        num_accepted: int64 [B], in [0, D].
        path: int64 [B, D]: the accepted nodes' indices (root first), then -1.
    """

    tokens: Array
    num_accepted: Array
    path: Array


def check_parents(parents: Array, batch: int, nodes: int) -> Array:
    """`parents` ([N] or [B, N], ints with -1 <= a_i < i) as int64 [B, N]."""
    xp = namespace(parents)
    if parents.ndim not in (1, 2):
        raise ValueError(f"parents: expected shape [N] or [B, N] with N = {nodes}, got "
                         f"{list(parents.shape)}")
    check_shape("parents", parents, (nodes,) if parents.ndim == 1 else (batch, nodes))
    if not xp.isdtype(parents.dtype, "integral"):
        raise TypeError(f"parents: expected an integer array, got dtype {parents.dtype}")
    full = xp.broadcast_to(xp.astype(parents, xp.int64), (batch, nodes))
    index = xp.arange(nodes, dtype=xp.int64, device=device(parents))[None, :]
    if batch and nodes and (bool(xp.any(full < -1)) or bool(xp.any(full >= index))):
        raise ValueError("parents: expected -1 (the root) or an earlier node's index for every "
                         "node (a_i < i: topological order), got a parent out of that range")
    return full


def tree_depth(parents: Array) -> int:
    """The depth of the deepest node (1 for children of the root), over every row; read
    once on the host: the depth fixes the verdict's static width."""
    xp = namespace(parents)
    rows = parents if parents.ndim == 2 else parents[None, :]
    deepest = 0
    for row in range(int(rows.shape[0])):
        depth: list[int] = []
        for parent in host_ints(xp.reshape(rows[row, :], (-1,))):
            depth.append(1 if parent < 0 else depth[parent] + 1)
        deepest = max([deepest, *depth])
    return deepest


def verify_tree(draft_tokens: Array, parents: Array, draft_probs: Array | None, target_probs: Array,
                uniforms: Array, *, depth: int | None = None, tree_sizes: Array | None = None,
                check: bool = True) -> TreeVerdict:
    """Walk the draft tree by recursive rejection sampling; emit the accepted path and one token.

    Static shapes; no host synchronisation with check=False and `depth` given.

    Args:
        draft_tokens: int [B, N], node i's token.
        parents: int [N] or [B, N]: node i's parent, -1 for the root, always < i.
        draft_probs: [B, N, V], the law node i was drawn from (i.i.d. siblings share
            it), or None for deterministic candidates (one-hot Q).
        target_probs: [B, N+1, V]: the target's law at the root, then after each node.
        uniforms: [B, N+1] in [0, 1): node i's test, then one for the final token.
        depth: the verdict's width D (>= the tree's depth; read from `parents` if None).
        tree_sizes: int [B] in [0, N], or None (all N): row b uses its first S_b nodes.
        check: validate the inputs (switch off inside graphs once validated).

    Returns:
        The TreeVerdict.
    """
    xp = namespace(draft_tokens, target_probs, uniforms)
    batch, nodes = (int(d) for d in draft_tokens.shape) if draft_tokens.ndim == 2 else (-1, -1)
    if check:
        _check_inputs(draft_tokens, parents, draft_probs, target_probs, uniforms, tree_sizes)
    full = check_parents(parents, batch, nodes) if check else \
        xp.broadcast_to(xp.astype(parents, xp.int64), (batch, nodes))
    if depth is None:
        depth = tree_depth(parents)
    elif check and depth < tree_depth(parents):
        raise ValueError(f"depth: expected at least the tree's depth {tree_depth(parents)}, got {depth}")
    p = target_probs
    tokens = xp.astype(draft_tokens, xp.int64)

    def law(i: int) -> tuple[Array, Array]:
        q = xp.astype(draft_probs[:, i, :], p.dtype)  # type: ignore[index]
        return q, q

    return tree_walk(tokens, full, None if draft_probs is None else law, p, uniforms, depth=depth,
                     tree_sizes=tree_sizes)


Laws = Callable[[int], tuple[Array, Array]]


def tree_walk(tokens: Array, parents: Array, laws: Laws | None, target_probs: Array, uniforms: Array, *,
              depth: int, tree_sizes: Array | None = None) -> TreeVerdict:
    """The walk of `verify_tree` on validated inputs (int64 tokens and parents [B, N]).

    `laws(i)` gives node i's law twice, [B, V] each: the one its acceptance ratio divides by
    and the one a rejection removes from the residual (the same law in the proved rule;
    the negative controls in `specsample.testing.broken` make them differ). None means
    deterministic candidates, Q one-hot at each node's token: the same arithmetic without
    building the one-hot laws (Q(x) = 1, and a rejection changes the residual at x only,
    to max(R(x) - z, 0); every other entry r - z * 0 is r exactly).
    """
    xp = namespace(tokens, target_probs, uniforms)
    p = target_probs
    batch, nodes = (int(d) for d in tokens.shape)
    dev = device(p)
    slots = xp.arange(depth, dtype=xp.int64, device=dev)[None, :]
    current = xp.full((batch,), -1, dtype=xp.int64, device=dev)
    accepted = xp.zeros((batch,), dtype=xp.int64, device=dev)
    path = xp.full((batch, depth), -1, dtype=xp.int64, device=dev)
    residual = p[:, 0, :]  # [B, V], unnormalised
    mass = xp.sum(residual, axis=-1)  # [B]
    ids = xp.arange(int(p.shape[-1]), dtype=xp.int64, device=dev)[None, :] if laws is None else None
    for i in range(nodes):
        tried = parents[:, i] == current
        if tree_sizes is not None:
            tried = tried & (i < tree_sizes)
        x = tokens[:, i:i + 1]  # [B, 1]
        r_x = xp.take_along_axis(residual, x, axis=-1)[:, 0]
        u = xp.astype(uniforms[:, i], p.dtype)
        if laws is None:
            # Accept with probability min(1, R(x) / z): u z < R(x), strict and division-free.
            accept = tried & (u * mass < r_x)
            left = xp.where(ids == x, xp.clip(r_x - mass, min=0.0)[:, None], residual)
        else:
            q_test, q_left = laws(i)
            q_x = xp.take_along_axis(q_test, x, axis=-1)[:, 0]
            # Accept with probability min(1, (R(x) / z) / Q(x)), strict and division-free.
            accept = tried & (u * q_x * mass < r_x)
            left = xp.clip(residual - mass[:, None] * q_left, min=0.0)
        reject = tried & ~accept
        left_mass = xp.sum(left, axis=-1)
        # In exact arithmetic a rejection leaves mass; p ~= q in floating point may not:
        # keep the residual as it was then (as `final_token` falls back to p).
        reject_kept = reject & (left_mass > 0)
        residual = xp.where(accept[:, None], p[:, i + 1, :],
                            xp.where(reject_kept[:, None], left, residual))
        mass = xp.where(accept, xp.ones_like(mass), xp.where(reject_kept, left_mass, mass))
        path = xp.where(accept[:, None] & (slots == accepted[:, None]), i, path)
        accepted = accepted + xp.astype(accept, xp.int64)
        current = xp.where(accept, i, current)
    final = sample(residual, uniforms[:, nodes], check=False)
    on_path = xp.take_along_axis(tokens, xp.clip(path, min=0), axis=-1)  # [B, D]
    wide = xp.arange(depth + 1, dtype=xp.int64, device=dev)[None, :]
    padded = xp.concat([on_path, xp.zeros_like(on_path[:, :1])], axis=1)
    out = xp.where(wide < accepted[:, None], padded,
                   xp.where(wide == accepted[:, None], final[:, None], -1))
    return TreeVerdict(tokens=out, num_accepted=accepted, path=path)


def _check_inputs(draft_tokens: Array, parents: Array, draft_probs: Array | None, target_probs: Array,
                  uniforms: Array, tree_sizes: Array | None) -> None:
    """A tree of N nodes has a chain's shapes with K = N (and parents, sizes on top)."""
    namespace(parents, *(a for a in (tree_sizes,) if a is not None))
    check_inputs(draft_tokens, draft_probs, target_probs, uniforms)
    if tree_sizes is not None:
        check_lengths("tree_sizes", tree_sizes, int(draft_tokens.shape[0]), int(draft_tokens.shape[1]))
