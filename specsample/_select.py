"""Selection without a full sort: the k-th largest value and the top-p threshold of each row.

Both give exactly the value that the full descending sort gives. The array API has no
selection, so NumPy (`np.partition`, `np.bincount`) and torch (`topk`, `bincount`) take a
fast path and any other library sorts.

Top-p (the sort's rule): with `ranked` the row sorted descending and `before = cumsum(ranked)
- ranked`, keep `kept = #{j: before[j] < top_p}` entries; the threshold is `ranked[kept - 1]`.
Without the sort: a mass histogram over the values' bit patterns finds the bucket where the
mass crosses top_p; sorting that bucket alone gives a candidate threshold v. With A = the mass
above v and M = A + the mass at v (exact sums, bounded error), the sort's `before` at the
first v is within E of A and the one after the last v within E of M, E bounding the cumsum's
rounding. A < top_p - E and M >= top_p + E prove the sort keeps v and nothing below it, so v
is its threshold; a row that is not proven (top_p within E of A or M) is sorted.
"""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np

from specsample._array import Array, device, namespace

__all__ = ["kth_largest", "sorted_threshold", "top_p_threshold"]

# Histogram buckets: 2^_SUB per octave over [2^-_OCTAVES, 2), everything smaller in bucket 0.
_SUB = 5
_OCTAVES = 64
_BUCKETS = (_OCTAVES + 1) << _SUB
# (mantissa bits, exponent bias, integer type of the same width) of the bucketed dtypes.
_LAYOUT = {"float32": (23, 127, "int32"), "float64": (52, 1023, "int64")}


def kth_largest(x: Array, k: int) -> Array:
    """The k-th largest value of each row (ties counted): x [..., V], 1 <= k <= V -> [..., 1]."""
    vocab = int(x.shape[-1])
    if array_api_compat.is_torch_array(x):
        return x.topk(k, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)
    if array_api_compat.is_numpy_array(x):
        return np.partition(x, vocab - k, axis=-1)[..., vocab - k : vocab - k + 1]
    return namespace(x).sort(x, axis=-1, descending=True)[..., k - 1 : k]


def sorted_threshold(probs: Array, top_p: float) -> Array:
    """The top-p threshold by the full sort (the definition): probs [..., V] -> [..., 1]."""
    xp = namespace(probs)
    ranked = _sort_descending(probs)  # [..., V]
    before = xp.cumulative_sum(ranked, axis=-1) - ranked
    kept = xp.sum(xp.astype(before < top_p, xp.int64), axis=-1, keepdims=True)  # >= 1
    return xp.take_along_axis(ranked, kept - 1, axis=-1)


def top_p_threshold(probs: Array, top_p: float) -> Array:
    """`sorted_threshold(probs, top_p)`, sorting only the rows it cannot prove otherwise.

    Args:
        probs: [..., V] non-negative, each row summing to about 1 (a softmax).
        top_p: in (0, 1).

    Returns:
        [..., 1] of probs' dtype: the value `sorted_threshold` returns.
    """
    xp = namespace(probs)
    shape = tuple(int(d) for d in probs.shape)
    if _layout(probs) is None or _roundoff(probs)[0] * shape[-1] > 0.25:
        return sorted_threshold(probs, top_p)
    rows = xp.reshape(probs, (-1, shape[-1]))  # [R, V]
    threshold, proven = _bucket_threshold(xp, rows, top_p)  # [R], [R]
    if not bool(xp.all(proven)):
        redo = xp.nonzero(~proven)[0]
        threshold[redo] = sorted_threshold(xp.take(rows, redo, axis=0), top_p)[:, 0]
    return xp.reshape(threshold, (*shape[:-1], 1))


def _sort_descending(x: Array) -> Array:
    if array_api_compat.is_torch_array(x) and x.device.type == "cpu":
        # NumPy's sort is several times faster than torch's on CPU; the values are the same.
        import torch

        return torch.from_numpy(np.flip(np.sort(x.numpy(force=True), axis=-1), axis=-1).copy())
    return namespace(x).sort(x, axis=-1, descending=True)


def _layout(x: Array) -> tuple[int, int, str] | None:
    if not (array_api_compat.is_torch_array(x) or array_api_compat.is_numpy_array(x)):
        return None
    return _LAYOUT.get(str(x.dtype).removeprefix("torch."))


def _roundoff(x: Array) -> tuple[float, float]:
    """(accumulation, output) unit roundoff of `cumulative_sum` on x.

    torch on CPU accumulates float32 and float64 cumulative sums in float64 (checked by the
    tests); NumPy, and torch elsewhere, accumulate in the array's own dtype.
    """
    out = float(namespace(x).finfo(x.dtype).eps) / 2
    if array_api_compat.is_torch_array(x) and x.device.type == "cpu":
        return 2.0**-53, out
    return out, out


def _bincount(keys: Array, weights: Array | None, length: int) -> Array:
    if array_api_compat.is_torch_array(keys):
        import torch

        return torch.bincount(keys, weights=weights, minlength=length)[:length]
    return np.bincount(keys, weights=weights, minlength=length)[:length]


def _buckets(xp: Any, rows: Array) -> Array:
    """Bucket of each value, non-decreasing in the value: rows [R, V] -> int64 [R, V]."""
    mantissa, bias, width = _layout(rows)  # type: ignore[misc]
    bits: Array
    if array_api_compat.is_torch_array(rows):
        import torch

        bits = rows.contiguous().view(getattr(torch, width)).to(torch.int64)
    else:
        bits = np.ascontiguousarray(rows).view(width).astype(np.int64)
    key = (bits >> (mantissa - _SUB)) - ((bias - _OCTAVES) << _SUB)
    return xp.clip(key, 0, _BUCKETS - 1)


def _bucket_threshold(xp: Any, rows: Array, top_p: float) -> tuple[Array, Array]:
    """Candidate threshold of each row and whether it is proven: rows [R, V] -> [R], bool [R]."""
    count, vocab = (int(d) for d in rows.shape)
    p = float(xp.asarray(top_p, dtype=rows.dtype))  # `before < top_p` compares in rows' dtype
    dev = device(rows)
    weight = xp.astype(rows, xp.float64)  # [R, V], exact
    key = _buckets(xp, rows)  # [R, V]
    offset = xp.arange(count, device=dev)[:, None] * _BUCKETS
    hist = xp.reshape(_bincount(xp.reshape(key + offset, (-1,)), xp.reshape(weight, (-1,)),
                                count * _BUCKETS), (count, _BUCKETS))  # mass per bucket
    upto = xp.flip(xp.cumulative_sum(xp.flip(hist, axis=-1), axis=-1), axis=-1)  # mass in buckets >= b
    total = upto[:, 0]
    # The crossing bucket: the last whose mass from the top reaches p, or the lowest with mass.
    lowest = xp.argmax(xp.astype(hist > 0, xp.int8), axis=-1)
    crossing = xp.maximum(xp.sum(xp.astype(upto >= p, xp.int64), axis=-1) - 1, lowest)  # [R]
    padded = xp.concat([upto, xp.zeros((count, 1), dtype=xp.float64, device=dev)], axis=-1)
    above = xp.take_along_axis(padded, crossing[:, None] + 1, axis=-1)[:, 0]  # mass above the bucket

    # Sort the crossing bucket's members, row by row, descending.
    row, col = xp.nonzero(key == crossing[:, None])
    value = rows[row, col]
    first = xp.argsort(value, descending=True, stable=True)
    order = xp.take(first, xp.argsort(xp.take(row, first), stable=True))
    row, value = xp.take(row, order), xp.take(value, order)
    mass = xp.astype(value, xp.float64)
    size = _bincount(row, None, count)  # >= 1: the crossing bucket has mass
    start = xp.cumulative_sum(size) - size
    prior = xp.cumulative_sum(mass) - mass
    before = xp.take(above, row) + prior - xp.take(xp.take(prior, start), row)  # mass before each member
    kept = xp.maximum(_bincount(row, xp.astype(before < p, xp.float64), count), 1.0)
    pick = start + xp.astype(kept, xp.int64) - 1
    threshold = xp.take(value, pick)  # [R]

    # The proof: A < p - E and M >= p + E (or nothing positive below the threshold).
    level = xp.take(xp.take(mass, pick), row)  # the candidate, per member
    strict = above + _bincount(row, xp.where(mass > level, mass, 0.0), count)  # A
    at_least = above + _bincount(row, xp.where(mass >= level, mass, 0.0), count)  # M
    lower = _bincount(row, xp.astype((mass < level) & (mass > 0), xp.float64), count)
    below = (lower > 0) | (lowest < crossing)
    acc, out = _roundoff(rows)
    # |cumsum rounding| <= gamma_V * mass in acc, then two roundings to out; plus our own sums' error.
    error = 1.001 * total * (2 * (vocab + 2) * acc + 2 * out + 4 * (vocab + _BUCKETS + 4) * 2.0**-53)
    proven = (strict + error < p) & ((at_least - error >= p) | ~below)
    return threshold, proven
