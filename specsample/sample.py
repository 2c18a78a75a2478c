"""Inverse-CDF sampling from (unnormalised) probabilities with given uniforms."""

from __future__ import annotations

from specsample._array import Array, check_probs, check_shape, check_uniforms, device, namespace

__all__ = ["sample"]


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
    threshold = xp.astype(u, cdf.dtype)[..., None] * cdf[..., -1:]  # [..., 1]
    index = xp.sum(xp.astype(cdf <= threshold, xp.int64), axis=-1)  # first j with cdf[j] > threshold
    # u * total may round up to total; fall back to the last token with mass.
    ids = xp.arange(probs.shape[-1], dtype=xp.int64, device=device(probs))
    last = xp.max(xp.where(probs > 0, ids, 0), axis=-1)
    return xp.minimum(index, last)

