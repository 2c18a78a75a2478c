"""Logits -> probabilities: temperature, top-k, top-p, min-p, the same for p and q."""

from __future__ import annotations

from specsample._array import Array, check_logits, device, namespace
from specsample._select import kth_largest, top_p_threshold
from specsample.params import SamplingParams

__all__ = ["warp"]


def _renormalise(xp: object, probs: Array) -> Array:
    return probs / xp.sum(probs, axis=-1, keepdims=True)  # type: ignore[attr-defined]


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
    scaled = logits if params.temperature == 1 else logits / params.temperature  # x / 1 == x
    # The row maximum always survives top-k. Masking after exp gives the same zeros as exp(-inf)
    # and spares exp the -inf entries, its slow path.
    shifted = xp.exp(scaled - xp.max(scaled, axis=-1, keepdims=True))
    if params.top_k is not None and params.top_k < vocab:
        shifted = xp.where(scaled >= kth_largest(scaled, params.top_k), shifted, 0.0)
    probs = _renormalise(xp, shifted)
    if params.top_p is not None and params.top_p < 1:
        # Keep the most likely tokens while the mass *before* them is < top_p; the
        # last kept value is the threshold (ties at the threshold are all kept).
        threshold = top_p_threshold(probs, params.top_p)
        probs = _renormalise(xp, xp.where(probs >= threshold, probs, 0.0))
    if params.min_p is not None and params.min_p > 0:
        floor = params.min_p * xp.max(probs, axis=-1, keepdims=True)
        probs = _renormalise(xp, xp.where(probs >= floor, probs, 0.0))
    return probs

