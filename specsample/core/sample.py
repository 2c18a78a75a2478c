"""Inverse-CDF sampling from (unnormalised) probabilities with given uniforms."""

from __future__ import annotations

from specsample._array import Array, check_probs, check_shape, check_uniforms, namespace

__all__ = ["first_above", "sample"]


def sample(probs: Array, u: Array, *, check: bool = True) -> Array:
    """The smallest index j with cumsum(probs)[j] > u * sum(probs).

    Args:
        probs: [..., V] non-negative, finite, positive mass per row; need not
            be normalised.
        u: [...] uniforms in [0, 1), one per row.
        check: validate the inputs.

    Returns:
        int64 [...] token ids. A zero-probability token is never returned.
    """
    xp = namespace(probs, u)
    if check:
        check_probs("probs", probs)
        check_shape("u", u, tuple(int(d) for d in probs.shape[:-1]))
        check_uniforms("u", u)
    cdf = xp.cumulative_sum(probs, axis=-1)  # [..., V], non-decreasing in floating point too
    total = cdf[..., -1:]  # [..., 1]
    # u * total may round up to total; below it, the first j with cdf[j] > threshold
    # always has probs[j] > 0 (a zero entry repeats the previous cdf value).
    threshold = xp.minimum(xp.astype(u, cdf.dtype)[..., None] * total, xp.nextafter(total, 0 * total))
    return first_above(cdf, threshold)[..., 0]


def first_above(cdf: Array, threshold: Array) -> Array:
    """int64 [..., 1]: the first index j with cdf[..., j] > threshold (cdf non-decreasing)."""
    xp = namespace(cdf)
    if hasattr(cdf, "is_cuda"):  # torch: a batched binary search
        import torch

        return torch.searchsorted(cdf.contiguous(), threshold.contiguous(), right=True)
    return xp.sum(xp.astype(cdf <= threshold, xp.int64), axis=-1, keepdims=True)
