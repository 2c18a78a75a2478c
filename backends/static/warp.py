"""`specsample.core.warp.warp` with the sampling parameters as tensors: one graph for every setting."""

from __future__ import annotations

import torch
from torch import Tensor

from specsample.core.params import SamplingParams

__all__ = ["knobs", "warp_tensor"]

# Top-k and top-p from the `_CAP` largest values when k <= _CAP and the top-p threshold is
# proven among them (see `specsample.kernels.select`); otherwise the sort over V.
_CAP = 256


def knobs(params: SamplingParams, vocab: int, *, dtype: torch.dtype,
          device: torch.device | str = "cpu", threshold: float | None = None) -> Tensor:
    """The four sampling parameters and the draft's confidence threshold as one tensor [5],
    'off' written as a sentinel.

    Args:
        params: the sampling parameters.
        vocab: V (the top-k sentinel).
        dtype: the logits' dtype, so every comparison rounds as `warp`'s Python floats do.
        threshold: the drafter's confidence threshold in (0, 1), or None.

    Returns:
        [5] = (temperature, top_k or V, top_p or 1, min_p or 0, threshold or 0).
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params: expected SamplingParams, got {type(params).__name__}")
    top_k = vocab if params.top_k is None else min(params.top_k, vocab)
    values = (params.temperature, top_k, 1.0 if params.top_p is None else params.top_p,
              0.0 if params.min_p is None else params.min_p, threshold or 0.0)
    return torch.tensor(values, dtype=dtype, device=device)


def _renormalise(probs: Tensor) -> Tensor:
    return probs / probs.sum(dim=-1, keepdim=True)


def _probs(scaled: Tensor, kept: Tensor, knob: Tensor) -> Tensor:
    """`warp`'s probabilities before top-p: torch's softmax of the scaled logits where top-k
    is off, exp(kept - max) over its sum where it is on (kept: -inf outside the top k)."""
    filtered = _renormalise(torch.exp(kept - kept.amax(dim=-1, keepdim=True)))
    return torch.where(knob[1] < scaled.shape[-1], filtered, torch.softmax(scaled, dim=-1))


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
        # One graph, all branches: top-k and top-p from the top _CAP values when that
        # proves the sort's result, the sort over V otherwise. Eager and captured-eager
        # callers (CUDA, HPU graphs) cannot branch on a device value, so they take the sort.
        filtered = (temperature > 0) & ((knob[1] < vocab) | (top_p < 1))
        probs = torch.cond(filtered, _selected, _softmax, (scaled, knob))
    else:
        probs = _top_k_top_p(scaled, knob)
    floor = min_p * probs.amax(dim=-1, keepdim=True)
    floored = _renormalise(torch.where(probs >= floor, probs, 0.0))
    probs = torch.where(min_p > 0, floored, probs)
    return torch.where(temperature > 0, probs, greedy)


def _softmax(scaled: Tensor, knob: Tensor) -> Tensor:
    """`_top_k_top_p` when neither is on (top_k = V, top_p = 1): torch's softmax, as `warp`."""
    return torch.softmax(scaled, dim=-1)


def _top_k_top_p(scaled: Tensor, knob: Tensor) -> Tensor:
    """Top-k (ties at the k-th value kept), softmax, then top-p, each selected by its knob."""
    top_p, vocab = knob[2], scaled.shape[-1]
    ranked, order = scaled.sort(dim=-1, descending=True)  # [..., V]
    rank = (knob[1].long().clamp(1, vocab) - 1).expand(*ranked.shape[:-1], 1)
    kth = ranked.gather(-1, rank)  # [..., 1]: the k-th largest scaled logit
    probs = _probs(scaled, torch.where(scaled >= kth, scaled, float("-inf")), knob)
    # top-p over the same order (exact values gathered, so the threshold is an entry).
    by_rank = probs.gather(-1, order)  # [..., V], non-increasing
    before = by_rank.cumsum(dim=-1) - by_rank
    kept = (before < top_p).sum(dim=-1, keepdim=True)  # >= 1
    threshold = by_rank.gather(-1, kept - 1)
    nucleus = _renormalise(torch.where(probs >= threshold, probs, 0.0))
    return torch.where(top_p < 1, nucleus, probs)


def _selected(scaled: Tensor, knob: Tensor) -> Tensor:
    """`_top_k_top_p` from the top `_CAP` values when they decide it, else `_top_k_top_p`."""
    top_p, vocab = knob[2], scaled.shape[-1]
    cap = min(_CAP, vocab)
    k = knob[1].long().clamp(1, vocab)
    top = scaled.topk(cap, dim=-1).values  # [..., cap], descending
    kth = top.gather(-1, (k.clamp(max=cap) - 1).expand(*top.shape[:-1], 1))
    kth = torch.where(k < vocab, kth, float("-inf"))  # top-k off: keep every value, as the sort does
    kept = torch.where(scaled >= kth, scaled, float("-inf"))
    probs = _probs(scaled, kept, knob)
    threshold, proven = _nucleus(probs, top_p, cap)
    decided = ((k <= cap) | (k >= vocab)) & ((top_p >= 1) | proven.all())
    out: Tensor = torch.cond(decided, _apply_threshold, _sorted, (scaled, knob, probs, threshold))
    return out


def _nucleus(probs: Tensor, top_p: Tensor, cap: int) -> tuple[Tensor, Tensor]:
    """The top-p threshold from the `cap` largest probabilities, and whether it is proven.

    With A the mass above the candidate v and M the mass at or above it among the top values
    (all of A; M at most the row's), A < top_p - E and M >= top_p + E prove that the sort
    keeps v and nothing below it, E bounding the rounding of its cumsum over V.
    """
    vocab, p = probs.shape[-1], top_p.double()
    ranked = probs.topk(cap, dim=-1).values.double()  # [..., cap], exact
    before = ranked.cumsum(dim=-1) - ranked
    kept = (before < p).sum(dim=-1, keepdim=True).clamp(min=1)
    candidate = ranked.gather(-1, kept - 1)  # [..., 1]
    strict = torch.where(ranked > candidate, ranked, 0.0).sum(dim=-1)
    at_least = torch.where(ranked >= candidate, ranked, 0.0).sum(dim=-1)
    out = torch.finfo(probs.dtype).eps / 2
    acc = 2.0**-53 if probs.device.type == "cpu" else out  # torch on CPU sums in float64
    total = probs.double().sum(dim=-1)
    error = 1.001 * total * (2 * (vocab + 2) * acc + 2 * out + 4 * (vocab + cap + 4) * 2.0**-53)
    proven = (strict + error < p) & (at_least - error >= p)
    return candidate.to(probs.dtype), proven


def _apply_threshold(scaled: Tensor, knob: Tensor, probs: Tensor, threshold: Tensor) -> Tensor:
    nucleus = _renormalise(torch.where(probs >= threshold, probs, 0.0))
    return torch.where(knob[2] < 1, nucleus, probs)


def _sorted(scaled: Tensor, knob: Tensor, probs: Tensor, threshold: Tensor) -> Tensor:
    return _top_k_top_p(scaled, knob)
