"""Logits -> probabilities: temperature, top-k, top-p, min-p, the same for p and q."""

from __future__ import annotations

from specsample._array import Array, check_logits, device, namespace
from specsample.params import SamplingParams

__all__ = ["warp"]


def _renormalise(xp: object, probs: Array) -> Array:
    return probs / xp.sum(probs, axis=-1, keepdims=True)  # type: ignore[attr-defined]


def _top_p(xp: object, probs: Array, top_p: float) -> Array:
    # Keep the most likely tokens while the mass *before* them is < top_p; the
    # last kept value is the threshold (ties at the threshold are all kept).
    ranked = xp.sort(probs, axis=-1, descending=True)  # type: ignore[attr-defined]  # [..., V]
    before = xp.cumulative_sum(ranked, axis=-1) - ranked  # type: ignore[attr-defined]
    kept = xp.sum(xp.astype(before < top_p, xp.int64), axis=-1, keepdims=True)  # type: ignore[attr-defined]
    threshold = xp.take_along_axis(ranked, kept - 1, axis=-1)  # type: ignore[attr-defined]
    return _renormalise(xp, xp.where(probs >= threshold, probs, 0.0))  # type: ignore[attr-defined]


def warp(logits: Array, params: SamplingParams, *, check: bool = True) -> Array:
    """Turn logits into the sampling distribution that `params` describe.

    Args:
        logits: [..., V] float; -inf marks a masked token; NaN and +inf are errors.
        params: the sampling parameters.
        check: validate the input (switch off inside graphs once validated).

    Returns:
        probs [..., V] of the same dtype, normalised; masked entries are exactly 0.
        Temperature 0 gives a one-hot at the argmax (ties: the lowest index).
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params: expected SamplingParams, got {type(params).__name__}")
    xp = namespace(logits)
    if check:
        check_logits("logits", logits)
    vocab = logits.shape[-1]
    if params.greedy:
        best = xp.argmax(logits, axis=-1, keepdims=True)  # first maximum = lowest index
        ids = xp.arange(vocab, device=device(logits))
        return xp.astype(ids == best, logits.dtype)
    scaled = logits / params.temperature
    if params.top_k is not None and params.top_k < vocab:
        kth = xp.sort(scaled, axis=-1, descending=True)[..., params.top_k - 1 : params.top_k]
        scaled = xp.where(scaled >= kth, scaled, -xp.inf)
    shifted = xp.exp(scaled - xp.max(scaled, axis=-1, keepdims=True))
    probs = _renormalise(xp, shifted)
    if params.top_p is not None and params.top_p < 1:
        probs = _top_p(xp, probs, params.top_p)
    if params.min_p is not None and params.min_p > 0:
        floor = params.min_p * xp.max(probs, axis=-1, keepdims=True)
        probs = _renormalise(xp, xp.where(probs >= floor, probs, 0.0))
    return probs

