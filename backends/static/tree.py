"""Draft trees on the static engine: the target scores a whole tree in one captured forward.

A tree drafter (the suffix tree) proposes on the host, from the committed tokens, between
rounds; its nodes go into fixed buffers (rows with fewer nodes are masked by their size),
so the graphs depend on the budget only: per (batch, bucket, N, D), one set for each width
of `tree_widths(N)`, and nothing is compiled after warm-up whatever the trees look like.
A round feeds the last committed token and the nodes (the tree mask: each attends the
committed context, its ancestors and itself; position = depth), verifies by recursive
rejection sampling (`verify_tree`'s walk with one-hot q, the same operations in the same
order), commits, and moves the accepted path's K/V into place; the rejected branches are
dropped by length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from specsample_backends.torch._fast import move_path, tree_mask
from specsample_backends.torch._forward import llama_features
from torch import Tensor, nn

from specsample._array import check_int
from specsample.core.verify import check_lengths
from specsample.core.verify_tree import check_parents, tree_depth

from .pieces import EmbedStep
from .steps import Model, PieceSource, Slot
from .verify import commit, sample_tensor
from .warp import warp_tensor

__all__ = ["MovePathStep", "PiecewiseTreeRound", "TreeEmbedStep", "TreeRoundStep", "TreeVerifyStep",
           "checked_tree", "move_path", "tree_widths", "verify_tree_tensor"]


def verify_tree_tensor(tokens: Tensor, parents: Tensor, target_probs: Tensor, uniforms: Tensor,
                       sizes: Tensor, depth: int) -> tuple[Tensor, Tensor, Tensor]:
    """`verify_tree(tokens, parents, None, target_probs, uniforms, depth=depth,
    tree_sizes=sizes, check=False)` for deterministic candidates: (tokens [B, D+1],
    num_accepted [B], path [B, D]).

    Args:
        tokens: int64 [B, N]; parents: int64 [B, N] (-1: the root; < the node's index).
        target_probs: [B, N+1, V]; uniforms: [B, N+1]; sizes: int64 [B] in [0, N].
        depth: D, the verdict's width (>= the deepest node's depth).
    """
    p = target_probs
    batch, nodes = tokens.shape
    ids = torch.arange(p.shape[-1], device=p.device)[None, :]
    slots = torch.arange(depth, device=p.device)[None, :]
    current = torch.full((batch,), -1, dtype=torch.int64, device=p.device)
    accepted = torch.zeros(batch, dtype=torch.int64, device=p.device)
    path = torch.full((batch, depth), -1, dtype=torch.int64, device=p.device)
    residual = p[:, 0, :]  # unnormalised, with its mass
    mass = residual.sum(dim=-1)
    for i in range(nodes):
        tried = (parents[:, i] == current) & (i < sizes)
        x = tokens[:, i:i + 1]
        r_x = residual.gather(-1, x)[:, 0]
        accept = tried & (uniforms[:, i].to(p.dtype) * mass < r_x)
        left = torch.where(ids == x, (r_x - mass).clamp(min=0.0)[:, None], residual)
        reject = tried & ~accept
        left_mass = left.sum(dim=-1)
        reject_kept = reject & (left_mass > 0)
        residual = torch.where(accept[:, None], p[:, i + 1, :],
                               torch.where(reject_kept[:, None], left, residual))
        mass = torch.where(accept, torch.ones_like(mass), torch.where(reject_kept, left_mass, mass))
        path = torch.where(accept[:, None] & (slots == accepted[:, None]), i, path)
        accepted = accepted + accept.long()
        current = torch.where(accept, i, current)
    final = sample_tensor(residual, uniforms[:, nodes])
    on_path = tokens.gather(-1, path.clamp(min=0))  # [B, D]
    wide = torch.arange(depth + 1, device=p.device)[None, :]
    padded = torch.cat([on_path, torch.zeros_like(on_path[:, :1])], dim=1)
    out = torch.where(wide < accepted[:, None], padded,
                      torch.where(wide == accepted[:, None], final[:, None], -1))
    return out, accepted, path


def tree_widths(nodes: int) -> tuple[int, ...]:
    """The tree widths an N-node budget captures: the powers of two below N, then N (a
    round takes the smallest that holds its widest tree)."""
    check_int("nodes", nodes, 1)
    widths, w = [], 1
    while w < nodes:
        widths.append(w)
        w *= 2
    return (*widths, nodes)


def checked_tree(tree: Any, batch: int, nodes: int, depth: int) -> Any:
    """A tree drafter's proposal, checked on the host before it enters the graphs (which
    trust it): deterministic (probs None), [B, N] nodes and parents, sizes in [0, N], and
    no node deeper than the graphs' depth D."""
    if getattr(tree, "probs", None) is not None:
        raise TypeError("drafter: the static engine verifies deterministic trees (probs None); "
                        "a tree drawn from a law runs on the core loop (backend 'torch')")
    for name in ("tokens", "parents"):
        shape = list(getattr(getattr(tree, name, None), "shape", []))
        if shape != [batch, nodes]:
            raise ValueError(f"drafter: expected tree {name} of shape [{batch}, {nodes}], got {shape}")
    check_parents(tree.parents, batch, nodes)
    check_lengths("drafter: tree sizes", tree.sizes, batch, nodes)
    if tree_depth(tree.parents) > depth:
        raise ValueError(f"drafter: expected trees at most {depth} deep (its depth), got "
                         f"{tree_depth(tree.parents)}")
    return tree


def feed_of(tokens: Tensor, lengths: Tensor, nodes: Tensor, parents: Tensor) -> tuple[Tensor, Tensor]:
    """The tree forward's input: the last committed token, then the nodes; parents by feed
    index (-1 for the committed token, node i's parent a_i at feed index a_i + 1)."""
    last = tokens.gather(1, (lengths - 1)[:, None])  # [B, 1]
    return torch.cat([last, nodes], dim=1), torch.cat([torch.full_like(last, -1), parents + 1], dim=1)


def tree_layout(base: Tensor, parents: Tensor, capacity: int) -> tuple[Tensor, Tensor, Tensor]:
    """(positions [B, T], write slots [B, T], mask [B, 1, T, C]) of a tree fed at slots
    base .. base + T - 1, parents by feed index."""
    positions, mask = tree_mask(base, parents, torch.arange(capacity, device=parents.device))
    write = base[:, None] + torch.arange(parents.shape[1], device=parents.device)[None, :]
    return positions, write, mask


class TreeEmbedStep(EmbedStep):
    """feed, parents [B, T] (by feed index), base [B] (the slot of feed 0) -> (x, cos, sin,
    the write slots [B, 1, T], the tree's group mask), as `EmbedStep` gives a chain."""

    def forward(self, feed: Tensor, parents: Tensor, base: Tensor, weight: Tensor,  # type: ignore[override]
                keys: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """`keys` (any layer's K buffer [B, H_kv, C, hd]) only gives C."""
        positions, write, mask = tree_layout(base, parents, int(keys.shape[2]))
        return self.embedded(feed, positions, write, mask, weight)


class TreeVerifyStep(nn.Module):
    """Target logits of a tree -> verdict, committed into the slot's tokens/lengths/done in
    place; also the accepted path (for `move_path`). The depth D is fixed per graph."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.depth = depth

    def forward(self, logits: Tensor, nodes: Tensor, parents: Tensor, sizes: Tensor, u: Tensor,
                knob: Tensor, eos: Tensor, tokens: Tensor, lengths: Tensor, stop: Tensor,
                done: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(verdict tokens [B, D+1], num_accepted [B], emitted [B], active [B], nodes verified
        [B], path [B, D])."""
        verdict, n, path = verify_tree_tensor(nodes, parents, warp_tensor(logits, knob), u, sizes,
                                              self.depth)
        active = ~done
        emitted, new, ended, finished = commit(verdict, n, tokens, lengths, stop, done, eos)
        tokens.copy_(new)
        lengths.copy_(ended)
        done.copy_(finished)
        return verdict, n, emitted, active, torch.where(active, sizes, 0), path


class MovePathStep(nn.Module):
    """`move_path` on one layer's (keys, values), in place."""

    def forward(self, keys: Tensor, values: Tensor, first: Tensor, path: Tensor) -> Tensor:
        """Returns `first` (a graph needs an output)."""
        move_path(keys, values, first, path)
        return first


def settle(verify: Callable[..., Any], move: Callable[..., Any], slot: Slot, logits: Tensor,
           first: Tensor, nodes: Tensor, parents: Tensor, sizes: Tensor, u: Tensor, knob: Tensor,
           eos: Tensor) -> tuple[Tensor, ...]:
    """A tree round's end, after the target's logits: verify and commit (`TreeVerifyStep`),
    then move the accepted path's K/V into place layer by layer (`MovePathStep`); the round's
    outputs but the path."""
    *out, path = verify(logits, nodes, parents, sizes, u, knob, eos, slot.tokens, slot.lengths,
                        slot.stop, slot.done)
    for keys, values in slot.target_kv:
        move(keys, values, first, path)
    return tuple(out)


class TreeRoundStep(nn.Module):
    """One tree round over a slot's buffers, captured whole (CUDA or HPU graphs): the tree's
    nodes, parents and sizes are inputs, written by the host before each replay."""

    def __init__(self, engine: PieceSource, slot: Slot, depth: int) -> None:
        super().__init__()
        self.engine, self.slot = engine, slot
        self.verify, self.move = TreeVerifyStep(depth), MovePathStep()

    def mutable(self) -> tuple[Tensor, ...]:
        """State tensors a call changes besides K/V beyond the valid lengths."""
        return self.slot.tokens, self.slot.lengths, self.slot.done

    def forward(self, nodes: Tensor, parents: Tensor, sizes: Tensor, u: Tensor, knob: Tensor,
                eos: Tensor) -> tuple[Tensor, ...]:
        """(verdict tokens [B, D+1], num_accepted, emitted, active, nodes verified)."""
        s, stack = self.slot, self.engine.target
        first = s.lengths.clone()
        feed, feed_parents = feed_of(s.tokens, s.lengths, nodes, parents)
        positions, write, mask = tree_layout(s.lengths - 1, feed_parents, s.capacity)
        logits = stack.head(llama_features(stack, feed, positions, mask, s.target_kv, write))
        logits = logits if logits.dtype == torch.float64 else logits.float()
        return settle(self.verify, self.move, s, logits, first, nodes, parents, sizes, u, knob, eos)


class PiecewiseTreeRound:
    """`TreeRoundStep` from captured pieces (the tree embedding, the layer and head pieces a
    chain round of the same width shares, the tree verify, the path move), loops in Python."""

    def __init__(self, engine: PieceSource, slot: Slot, nodes: int, depth: int) -> None:
        """`nodes`: this round's width (the nodes it feeds after the last committed token)."""
        self.slot, self.stack = slot, engine.target
        kv, width = slot.target_kv, nodes + 1
        self.embed = engine.piece("tree-embed", engine.target, width, kv)
        self.layer = engine.piece("layer", engine.target, width, kv)
        self.head = engine.piece("head", engine.target, width, kv)
        self.verify = engine.piece(f"tree-verify-{depth}", None, width, kv)
        self.move = engine.piece("move-path", None, depth, kv)
        target = Model(engine, engine.target, kv)
        self.layers, self.head_weights = target.layers, target.head_weights

    def __call__(self, nodes: Tensor, parents: Tensor, sizes: Tensor, u: Tensor, knob: Tensor,
                 eos: Tensor) -> tuple[Tensor, ...]:
        """(verdict tokens [B, D+1], num_accepted, emitted, active, nodes verified)."""
        s = self.slot
        first = s.lengths.clone()
        feed, feed_parents = feed_of(s.tokens, s.lengths, nodes, parents)
        x, cos, sin, where, mask = self.embed(feed, feed_parents, s.lengths - 1, self.stack.embed,
                                              s.target_kv[0][0])
        for keys, values, weights in self.layers:
            x = self.layer(x, cos, sin, where, mask, keys, values, *weights)
        logits = self.head(x, *self.head_weights)
        return settle(self.verify, self.move, s, logits, first, nodes, parents, sizes, u, knob, eos)
