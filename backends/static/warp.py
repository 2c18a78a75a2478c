"""`specsample.warp.warp` with the sampling parameters as tensors: one graph for every setting."""

from __future__ import annotations

import torch
from torch import Tensor

from specsample.params import SamplingParams

__all__ = ["knobs", "warp_tensor"]


def knobs(params: SamplingParams, vocab: int, *, dtype: torch.dtype,
          device: torch.device | str = "cpu") -> Tensor:
    """The four parameters as one tensor [4], 'off' written as a sentinel.

    Args:
        params: the sampling parameters.
        vocab: V (the top-k sentinel).
        dtype: the logits' dtype, so every comparison rounds as `warp`'s Python floats do.

    Returns:
        [4] = (temperature, top_k or V, top_p or 1, min_p or 0).
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params: expected SamplingParams, got {type(params).__name__}")
    top_k = vocab if params.top_k is None else min(params.top_k, vocab)
    values = (params.temperature, top_k, 1.0 if params.top_p is None else params.top_p,
              0.0 if params.min_p is None else params.min_p)
    return torch.tensor(values, dtype=dtype, device=device)


def _renormalise(probs: Tensor) -> Tensor:
    return probs / probs.sum(dim=-1, keepdim=True)


def warp_tensor(logits: Tensor, knob: Tensor) -> Tensor:
    """`warp(logits, params)` for `knob = knobs(params, V)`, with no branch on values.

    Every stage is computed and the sentinels select it out (`torch.where`), so
    a change of parameters never changes the graph. Same order and ties as
    `warp`: temperature, top-k (ties at the k-th value kept), top-p (keep while
    the mass before < top_p; ties at the threshold kept), min-p; temperature 0
    is a one-hot at the first argmax.

    Args:
        logits: [..., V] float (-inf: masked).
        knob: [4] in the logits' dtype, from `knobs`.

    Returns:
        probs [..., V], normalised, masked entries exactly 0.
    """
    temperature, top_p, min_p = knob[0], knob[2], knob[3]
    vocab = logits.shape[-1]
    ids = torch.arange(vocab, device=logits.device)
    greedy = (ids == logits.argmax(dim=-1, keepdim=True)).to(logits.dtype)  # [..., V]
    scaled = logits / torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    if torch.compiler.is_compiling():
        # One graph, both branches: the sort over V (most of a draft step's sampling
        # cost) runs only when top-k or top-p is on. Eager and captured-eager callers
        # (CUDA, HPU graphs) cannot branch on a device value, so they take the sort.
        filtered = (temperature > 0) & ((knob[1] < vocab) | (top_p < 1))
        probs = torch.cond(filtered, _top_k_top_p, _softmax, (scaled, knob))
    else:
        probs = _top_k_top_p(scaled, knob)
    floor = min_p * probs.amax(dim=-1, keepdim=True)
    floored = _renormalise(torch.where(probs >= floor, probs, 0.0))
    probs = torch.where(min_p > 0, floored, probs)
    return torch.where(temperature > 0, probs, greedy)


def _softmax(scaled: Tensor, knob: Tensor) -> Tensor:
    """`_top_k_top_p` when neither is on (top_k = V, top_p = 1): the same operations."""
    return _renormalise(torch.exp(scaled - scaled.amax(dim=-1, keepdim=True)))


def _top_k_top_p(scaled: Tensor, knob: Tensor) -> Tensor:
    """Top-k (ties at the k-th value kept), softmax, then top-p, each selected by its knob."""
    top_p, vocab = knob[2], scaled.shape[-1]
    ranked, order = scaled.sort(dim=-1, descending=True)  # [..., V]
    rank = (knob[1].long().clamp(1, vocab) - 1).expand(*ranked.shape[:-1], 1)
    kth = ranked.gather(-1, rank)  # [..., 1]: the k-th largest scaled logit
    scaled = torch.where(scaled >= kth, scaled, float("-inf"))
    probs = _renormalise(torch.exp(scaled - scaled.amax(dim=-1, keepdim=True)))
    # top-p over the same order (exact values gathered, so the threshold is an entry).
    by_rank = probs.gather(-1, order)  # [..., V], non-increasing
    before = by_rank.cumsum(dim=-1) - by_rank
    kept = (before < top_p).sum(dim=-1, keepdim=True)  # >= 1
    threshold = by_rank.gather(-1, kept - 1)
    nucleus = _renormalise(torch.where(probs >= threshold, probs, 0.0))
    return torch.where(top_p < 1, nucleus, probs)
