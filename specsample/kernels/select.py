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

Where numba is installed, NumPy and torch CPU rows take a compiled pass of both steps
(`specsample.kernels.dispatch`): a strided sample places a level, the entries above it are the only
ones histogrammed, and the histogram's proof decides; rows it does not prove go on below.
Without numba, NumPy and torch CPU rows try a cheaper candidate set: every entry
above a level that a strided sample puts, with a margin for its error, below (1 - top_p) of mass.
Sorted, the candidates are the head of the full sort, so the sort's own rule on them, in the
same library and dtype, gives the sort's bits there; no rounding bound is needed
(`_candidate_threshold`). Rows it does not prove go on to the histogram.
"""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np

from specsample._array import Array, device, namespace
from specsample.kernels import dispatch
from specsample.kernels.layout import BUCKETS, MARGIN, SHIFT, STRIDE

__all__ = ["kth_largest", "sorted_threshold", "top_p_threshold", "zero_outside_top_p"]

# Group size of the two-stage top-k selection (`top_groups`), and the shortest rows it takes
# (shorter ones gain nothing from it).
GROUP = 32
_GROUPED_FROM = 4096
# Rows shorter than this are sorted: the histogram's fixed cost exceeds the sort's.
_SORTED_BELOW = 512


def kth_largest(x: Array, k: int) -> Array:
    """The k-th largest value of each row (ties counted): x [..., V], 1 <= k <= V -> [..., 1]."""
    vocab = int(x.shape[-1])
    if array_api_compat.is_torch_array(x):
        if grouped(vocab, k):
            x = top_groups(x, k)
        return x.topk(k, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)
    if array_api_compat.is_numpy_array(x):
        return np.partition(x, vocab - k, axis=-1)[..., vocab - k : vocab - k + 1]
    return namespace(x).sort(x, axis=-1, descending=True)[..., k - 1 : k]


def grouped(vocab: int, k: int) -> bool:
    """Whether `top_groups` takes rows of `vocab` entries for a top-`k` selection."""
    return vocab >= _GROUPED_FROM and vocab % GROUP == 0 and k <= vocab // (4 * GROUP)


def top_groups(x: Any, k: int) -> Any:
    """The entries of the k groups (of `GROUP` consecutive entries) of each row with the
    largest maxima, for a torch x [..., V] (V a multiple of `GROUP`): [..., k * GROUP].

    Every entry among x's k largest lies in a chosen group, or the chosen groups' k maxima
    are all at least as large as it; either way the chosen entries hold k values >= the k-th
    largest, and no more than x holds, so their k-th largest is x's. Two small selections
    replace one over the whole row (torch's `topk` costs about its row length).
    """
    import torch

    groups = x.unflatten(-1, (-1, GROUP))  # [..., V / G, G]
    chosen = groups.amax(dim=-1).topk(k, dim=-1, sorted=False).indices  # [..., k]
    return torch.gather(groups, -2, chosen[..., None].expand(*chosen.shape, GROUP)).flatten(-2)


def sorted_threshold(probs: Array, top_p: float) -> Array:
    """The top-p threshold by the full sort (the definition): probs [..., V] -> [..., 1]."""
    xp = namespace(probs)
    ranked = _sort_descending(probs)  # [..., V]
    kept = xp.sum(xp.astype(_inside(xp, ranked, top_p), xp.int64), axis=-1, keepdims=True)  # >= 1
    return xp.take_along_axis(ranked, kept - 1, axis=-1)


def _inside(xp: Any, ranked: Array, top_p: float) -> Array:
    """The sort's rule on rows sorted descending: whether the mass before each entry, as the
    cumulative sum computes it, is < top_p. The candidate path calls it on a prefix of the
    sort, where it gives the same bits (cumulative sums run from the start of the row)."""
    return xp.cumulative_sum(ranked, axis=-1) - ranked < top_p


def top_p_threshold(probs: Array, top_p: float) -> Array:
    """`sorted_threshold(probs, top_p)`, sorting only the rows it cannot prove otherwise.

    Args:
        probs: [..., V] non-negative, each row summing to about 1 (a softmax).
        top_p: in (0, 1).

    Returns:
        [..., 1] of probs' dtype: the value `sorted_threshold` returns, or the smallest positive
        value where the sort's threshold is 0; `probs >= threshold` keeps the same entries.
    """
    xp = namespace(probs)
    shape = tuple(int(d) for d in probs.shape)
    if not _layout(probs) or shape[-1] < _SORTED_BELOW or _roundoff(probs)[0] * shape[-1] > 0.25:
        return sorted_threshold(probs, top_p)
    rows = xp.reshape(probs, (-1, shape[-1]))  # [R, V]
    host = _host(rows)
    if host is not None:
        threshold = xp.asarray(_host_threshold(rows, host, top_p)[0])  # torch on CPU shares the memory
    else:
        threshold = _bucket_or_sort(xp, rows, top_p)
    return xp.reshape(threshold, (*shape[:-1], 1))


def zero_outside_top_p(probs: Array, top_p: float) -> bool:
    """Write 0 over the entries that top-p drops, in place, through the compiled pass:
    `where(probs >= top_p_threshold(probs, top_p), probs, 0)` bit for bit. False (nothing
    done) where the pass does not take `probs`: numba absent, not a C-contiguous float32 or
    float64 NumPy or torch CPU array, short rows, a cumulative sum whose rounding the proof
    cannot bound tightly (NumPy's float32), autograd recording, or a graph capture.

    Args:
        probs: [..., V] non-negative, each row summing to about 1; the caller's to overwrite.
        top_p: in (0, 1).
    """
    if not dispatch.available() or not _layout(probs) or probs.ndim == 0:
        return False
    vocab = int(probs.shape[-1])
    error = _error(1.0, vocab, _roundoff(probs))
    if vocab < _SORTED_BELOW or error > _COMPILED_ERROR:
        return False
    if array_api_compat.is_torch_array(probs):
        if probs.device.type != "cpu" or not probs.is_contiguous() or _recorded(probs):
            return False
    elif not probs.flags.c_contiguous:
        return False
    rows = probs.reshape(-1, vocab)  # a view (contiguous): the writes land in probs
    host = _host(rows)
    if host is None:
        return False
    found, zeroed = _host_threshold(rows, host, top_p, zero=True, error=error)
    if zeroed.all():
        return True
    for r in np.flatnonzero(~zeroed).tolist():  # the rows the proof left, decided another way
        host[r] = np.where(host[r] >= found[r], host[r], 0.0)
    return True


# The largest cumulative-sum error bound (per unit of mass) at which the compiled pass runs:
# torch CPU's float64 accumulation gives about 1e-11 at V = 49152; NumPy's float32 about 6e-3,
# too loose to prove a threshold, so its rows go to the candidates (the sort's own rule).
_COMPILED_ERROR = 1e-6


def _host_threshold(rows: Array, host: np.ndarray, top_p: float, *, zero: bool = False,
                    error: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The sort's threshold of each host row [R], and which rows the compiled pass zeroed
    below theirs (with `zero`): the compiled pass where it runs, then the candidates', then
    the histogram's or the sort's for the rows left unproven. `error`: `_error(1.0, V,
    _roundoff(rows))` where the caller has it."""
    count, vocab = host.shape
    if error is None:
        error = _error(1.0, vocab, _roundoff(rows))
    if dispatch.available() and error <= _COMPILED_ERROR:
        p = float(host.dtype.type(top_p))  # the sort compares in rows' dtype
        found, proven = dispatch.top_p_rows(host, p, error, zero=zero)
        zeroed = proven if zero else np.zeros(count, dtype=bool)
    else:
        found, proven = np.zeros(count, dtype=host.dtype), np.zeros(count, dtype=bool)
        zeroed = proven.copy()
    if not bool(proven.all()):
        xp = namespace(rows)
        redo = np.flatnonzero(~proven)
        some = xp.take(rows, xp.asarray(redo), axis=0) if redo.size < count else rows
        found[redo], settled = _candidate_threshold(some, np.ascontiguousarray(host[redo]), top_p)
        if not bool(settled.all()):
            left = redo[~settled]
            found[left] = np.asarray(_bucket_or_sort(xp, xp.take(rows, xp.asarray(left), axis=0), top_p))
    return found, zeroed


def _recorded(x: Any) -> bool:
    """Whether autograd records torch `x` (an in-place write would break its backward)."""
    import torch

    return bool(x.requires_grad and torch.is_grad_enabled()) or torch.compiler.is_compiling()


def _bucket_or_sort(xp: Any, rows: Array, top_p: float) -> Array:
    """The sort's threshold of each row [R]: the histogram's where proven, else the sort's."""
    threshold, proven = _bucket_threshold(xp, rows, top_p)  # [R], [R]
    if not bool(xp.all(proven)):
        redo = xp.nonzero(~proven)[0]
        threshold[redo] = sorted_threshold(xp.take(rows, redo, axis=0), top_p)[:, 0]
    return threshold


def _host(rows: Array) -> np.ndarray | None:
    """rows as a NumPy array without a copy (NumPy, or torch on CPU), else None."""
    if array_api_compat.is_numpy_array(rows):
        return np.ascontiguousarray(rows)
    if array_api_compat.is_torch_array(rows) and rows.device.type == "cpu":
        import torch

        if not torch.compiler.is_compiling():
            return rows.detach().contiguous().numpy()
    return None


def _error(total: Array, vocab: int, roundoff: tuple[float, float]) -> Array:
    """A bound on |the sort's `before` - the exact mass before| plus our own float64 sums'
    error, for rows of V = `vocab` entries and mass at most `total`."""
    acc, out = roundoff
    # cumsum: |error| <= gamma_V * mass in acc, then two roundings to out; plus our own sums' error.
    return 1.001 * total * (2 * (vocab + 2) * acc + 2 * out + 4 * (vocab + BUCKETS + 4) * 2.0**-53)


def _candidate_threshold(rows: Array, host: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Candidate threshold of each row and whether it is proven, from the entries above a
    level guessed from a strided sample: rows [R, V] (NumPy, or torch on CPU) and their
    NumPy view `host` -> [R] (rows' dtype), bool [R].

    The candidates C are all the entries >= the level, so sorted they are the first |C|
    entries of the row's full sort, and the sort's own rule (`_inside`, in rows' library and
    dtype) on them gives the sort's bits there. The entries after C are smaller than C's last
    and their cumulative sums no smaller: where C's last entry is outside top_p, so is every
    later one, and the count of entries inside (hence the threshold) is the sort's. Rows
    whose C lies wholly inside top_p, or that hold more than V / 4 candidates (where the
    histogram is cheaper), are not proven.
    """
    xp = namespace(rows)
    count, vocab = host.shape
    p = float(np.asarray(top_p, dtype=host.dtype))
    sample = np.sort(host[:, ::STRIDE], axis=-1)  # [R, S], ascending
    # The mass below a level, from the sample: each sample value stands for the STRIDE
    # entries about it. The many small entries make this a good estimate where the few
    # large ones (which the sample mostly misses) would not be; the row sums to about 1.
    below = np.cumsum(sample, axis=-1, dtype=np.float64) * STRIDE
    at = np.arange(count)
    crossing = np.maximum(np.count_nonzero(below <= 1 - p, axis=-1) - 1, 0)  # [R]
    # The sampled mass's standard error there, from the sample's spread below it.
    squares = np.cumsum(np.square(sample, dtype=np.float64), axis=-1)[at, crossing]
    mean = below[at, crossing] / (STRIDE * (crossing + 1))
    noise = STRIDE * np.sqrt(np.maximum(squares - (crossing + 1) * mean * mean, 0.0))
    reach = np.count_nonzero(below <= (1 - p) - MARGIN * noise[:, None], axis=-1)  # [R]: below the level
    # At least the smallest positive value: rows mostly of zeros (top-k's) keep their positives.
    level = np.maximum(sample[at, np.maximum(reach - 1, 0)],
                       np.finfo(host.dtype).smallest_subnormal)  # [R]
    # Compaction costs about its number of entries, so it runs once over all rows.
    flat = _flat_positions(rows, host >= level[:, None])  # row by row
    bounds = np.searchsorted(flat, np.arange(count + 1) * vocab)
    sizes = np.diff(bounds)  # [R] = |C|
    threshold = np.zeros(count, dtype=host.dtype)
    proven = np.zeros(count, dtype=bool)
    usable = (sizes >= 1) & (sizes <= vocab // 4)
    if not usable.any():
        return threshold, proven
    if not usable.all():  # leave out the rows not taken
        flat = flat[np.repeat(usable, sizes)]
        sizes = np.where(usable, sizes, 0)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
    width = int(sizes.max())
    # Row r's candidates go to slots r * width + 0, 1, ...: one flat gather and one flat write.
    slots = np.arange(flat.size) + np.repeat(np.arange(count) * width - bounds[:-1], sizes)
    ranked = np.zeros(count * width, dtype=host.dtype)
    ranked[slots] = -host.reshape(-1)[flat]
    # Ascending negated values: the candidates descending, the padding (zeros) last; the
    # padding's verdicts are not read.
    ranked = -np.sort(ranked.reshape(count, width), axis=-1)
    inside = np.asarray(_inside(xp, xp.asarray(ranked), top_p))  # torch on CPU shares the memory
    inside &= np.arange(width) < sizes[:, None]
    kept = np.count_nonzero(inside, axis=-1)  # >= 1 in usable rows: the first entry's mass before is 0
    last = np.minimum(np.maximum(sizes, 1), width) - 1
    proven[usable] = ~inside[at, last][usable]
    threshold[usable] = ranked[at, np.maximum(kept - 1, 0)][usable]
    return threshold, proven


def _flat_positions(rows: Array, mask: np.ndarray) -> np.ndarray:
    """The flat indices of `mask`'s True entries, ascending: torch's `nonzero` for torch rows
    (faster than NumPy's on CPU), NumPy's otherwise."""
    if array_api_compat.is_torch_array(rows):
        import torch

        return torch.from_numpy(mask).view(-1).nonzero().view(-1).numpy()
    return np.flatnonzero(mask)


def _sort_descending(x: Array) -> Array:
    if array_api_compat.is_torch_array(x) and x.device.type == "cpu" and _layout(x):
        # NumPy's sort is faster than torch's on CPU; the values are the same.
        import torch

        return torch.from_numpy(np.flip(np.sort(x.numpy(force=True), axis=-1), axis=-1).copy())
    return namespace(x).sort(x, axis=-1, descending=True)


def _layout(x: Array) -> bool:
    """Whether the histogram path takes x (NumPy or torch, float32 or float64)."""
    if not (array_api_compat.is_torch_array(x) or array_api_compat.is_numpy_array(x)):
        return False
    return str(x.dtype).removeprefix("torch.") in ("float32", "float64")


def _roundoff(x: Array) -> tuple[float, float]:
    """(accumulation, output) unit roundoff of `cumulative_sum` on x.

    torch on CPU accumulates float32 and float64 cumulative sums in float64 (checked by the
    tests); NumPy, and torch elsewhere, accumulate in the array's own dtype.
    """
    torch_cpu = array_api_compat.is_torch_array(x) and x.device.type == "cpu"
    name = str(x.dtype).removeprefix("torch.")
    out = _HALF_EPS.get(name)  # every top-p warp asks: a lookup, not a namespace's finfo
    if out is None:
        out = float(namespace(x).finfo(x.dtype).eps) / 2
    return (2.0**-53 if torch_cpu else out), out


_HALF_EPS = {"float32": 2.0**-24, "float64": 2.0**-53}


def _bincount(keys: Array, weights: Array | None, length: int) -> Array:
    if array_api_compat.is_torch_array(keys):
        import torch

        return torch.bincount(keys, weights=weights, minlength=length)[:length]
    return np.bincount(keys, weights=weights, minlength=length)[:length]


def _buckets(xp: Any, rows: Array) -> Array:
    """Bucket of each value plus 4096 * its row: rows [R, V] -> int32 [R, V]."""
    single = xp.astype(rows, xp.float32, copy=False)
    if array_api_compat.is_torch_array(rows):
        import torch

        bits = single.contiguous().view(torch.int32)
    else:
        bits = np.ascontiguousarray(single).view(np.int32)
    offset = xp.arange(int(rows.shape[0]), dtype=xp.int32, device=device(rows))[:, None] * BUCKETS
    return (bits >> SHIFT) + offset


def _crossing(xp: Any, rows: Array, key: Array, p: float) -> tuple[Array, Array, Array, Array]:
    """The bucket where each row's mass from the top reaches p (else its lowest with mass).

    Returns:
        crossing [R] (plus 4096 * row, as `key`), the mass above it [R], the row's mass [R],
        and whether a bucket below it holds mass [R].
    """
    count = int(rows.shape[0])
    weight = xp.reshape(xp.astype(rows, xp.float64, copy=False), (-1,))  # exact
    hist = xp.reshape(_bincount(xp.reshape(key, (-1,)), weight, count * BUCKETS), (count, BUCKETS))
    upto = xp.flip(xp.cumulative_sum(xp.flip(hist, axis=-1), axis=-1), axis=-1)  # mass in buckets >= b
    lowest = xp.argmax(xp.astype(hist > 0, xp.int8), axis=-1)
    local = xp.maximum(xp.sum(xp.astype(upto >= p, xp.int64), axis=-1) - 1, lowest)[:, None]  # [R, 1]
    ids = xp.arange(BUCKETS, device=device(rows))
    above = xp.sum(xp.where(ids > local, hist, 0.0), axis=-1)
    below = xp.any((ids < local) & (hist > 0), axis=-1)
    crossing = xp.astype(local[:, 0], xp.int32) + xp.astype(xp.arange(count, device=device(rows)),
                                                             xp.int32) * BUCKETS
    return crossing, above, upto[:, 0], below


def _bucket_threshold(xp: Any, rows: Array, top_p: float) -> tuple[Array, Array]:
    """Candidate threshold of each row and whether it is proven: rows [R, V] -> [R], bool [R]."""
    count, vocab = (int(d) for d in rows.shape)
    p = float(xp.asarray(top_p, dtype=rows.dtype))  # `before < top_p` compares in rows' dtype
    key = _buckets(xp, rows)  # [R, V]
    crossing, above, total, below = _crossing(xp, rows, key, p)

    # The crossing bucket's members, sorted row by row, descending.
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
    kept = _bincount(row, xp.astype(before < p, xp.float64), count)
    pick = start + xp.maximum(xp.astype(kept, xp.int64), xp.ones_like(start)) - 1
    threshold = xp.take(value, pick)  # [R], the candidate v

    # The proof: A < p - E and M >= p + E (M's side is moot when nothing positive is below v).
    level = xp.take(xp.take(mass, pick), row)  # v, per member
    strict = above + _bincount(row, xp.where(mass > level, mass, 0.0), count)  # A
    at_least = above + _bincount(row, xp.where(mass >= level, mass, 0.0), count)  # M
    below = below | (_bincount(row, xp.astype((mass < level) & (mass > 0), xp.float64), count) > 0)
    error = _error(total, vocab, _roundoff(rows))
    return threshold, (strict + error < p) & ((at_least - error >= p) | ~below)
