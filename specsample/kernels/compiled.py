"""The numba-compiled passes behind `specsample.kernels.dispatch` (imported only when they run).

Module-level functions, so that numba caches their machine code on disk: compiling them
takes seconds, loading them a fraction of one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils as _cgutils
from numba.extending import intrinsic

from specsample.kernels.layout import BUCKETS, COMPILED_STRIDE, MARGIN, SHIFT

jit = njit(cache=True, nogil=True, boundscheck=False)
cgutils: Any = _cgutils  # untyped


def _packed(typingctx: Any, src: Any, start: Any, level: Any, dst: Any, n: Any) -> Any:
    """`packed(src, start, level, dst, n)`: the entries >= level of src[start : start + L] (L
    = one 64-byte vector: 16 float32 or 8 float64), in order, written to dst[n:] (a whole
    vector is stored, so dst needs L slots past the last kept entry); returns how many.

    LLVM's `vector.compress` is a single instruction where the CPU has one (AVX-512's
    vcompressps into a register) and a short sequence elsewhere; the store is of the whole
    register, as a memory-destination compress is slow on some CPUs.
    """
    if src.dtype not in (types.float32, types.float64) or dst.dtype != src.dtype or level != src.dtype:
        return None
    lanes = 512 // src.dtype.bitwidth
    signature = types.intp(src, start, level, dst, n)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        source, first, floor, target, written = args
        element = context.get_value_type(sig.args[0].dtype)
        vector = ir.VectorType(element, lanes)
        mask_type = ir.VectorType(ir.IntType(1), lanes)
        source_data = context.make_array(sig.args[0])(context, builder, source).data
        target_data = context.make_array(sig.args[3])(context, builder, target).data
        values = builder.load(builder.bitcast(builder.gep(source_data, [first]), vector.as_pointer()),
                              align=sig.args[0].dtype.bitwidth // 8)
        first_lane = ir.Constant(ir.IntType(32), 0)
        splat = builder.insert_element(ir.Constant(vector, ir.Undefined), floor, first_lane)
        splat = builder.shuffle_vector(splat, ir.Constant(vector, ir.Undefined),
                                       ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))
        mask = builder.fcmp_ordered(">=", values, splat)
        suffix = f"v{lanes}f{sig.args[0].dtype.bitwidth}"
        compress = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector, [vector, mask_type, vector]),
            f"llvm.experimental.vector.compress.{suffix}")
        kept = builder.call(compress, [values, mask, ir.Constant(vector, ir.Undefined)])
        builder.store(kept, builder.bitcast(builder.gep(target_data, [written]), vector.as_pointer()),
                      align=sig.args[0].dtype.bitwidth // 8)
        bits = ir.IntType(lanes)
        count = builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(bits, [bits]),
                                                            f"llvm.ctpop.i{lanes}"),
                             [builder.bitcast(mask, bits)])
        return builder.zext(count, context.get_value_type(types.intp))

    return signature, codegen


packed: Any = intrinsic(_packed)


@jit
def bucket(x: Any) -> Any:
    return np.float32(x).view(np.int32) >> SHIFT


@jit
def compact(row: Any, level: Any, out: Any) -> int:
    # The entries >= level, in order, into out (which has LANES slots to spare): a
    # vector's worth at a time, then the tail branch-free (every entry written, the next
    # slot advancing past the kept ones).
    vocab = row.shape[0]
    lanes = 64 // row.itemsize
    whole = vocab - vocab % lanes
    n = 0
    for s in range(0, whole, lanes):
        n += packed(row, s, level, out, n)
    for j in range(whole, vocab):
        x = row[j]
        out[n] = x
        n += x >= level
    return n


# The histograms below are all zeros between calls: each pass clears only the buckets its
# entries reached ([lo, hi]), a few dozen where a clear of all 4096 costs more than the pass.


@jit
def clear(hist: Any, halves: Any, lo: int, hi: int) -> None:
    for b in range(lo, hi + 1):
        hist[b] = 0.0
        halves[b] = 0.0


@jit
def level_of(row: Any, p: float, hist: Any, squares: Any) -> Any:
    taken = 0
    lo, hi = BUCKETS, -1
    for j in range(0, row.shape[0], COMPILED_STRIDE):
        x = row[j]
        if x > 0:
            b = bucket(x)
            hist[b] += x
            squares[b] += np.float64(x) * x
            lo = min(lo, b)
            hi = max(hi, b)
        taken += 1
    level = np.float32(0.0)
    mass, square = 0.0, 0.0
    for b in range(lo, hi + 1):
        if hist[b] == 0:  # the same test as the bucket below's
            continue
        mass += hist[b]
        square += squares[b]
        # The sampled mass below bucket b's upper edge and its standard error.
        noise = COMPILED_STRIDE * np.sqrt(max(square * taken - mass * mass, 0.0) / taken)
        if COMPILED_STRIDE * mass + MARGIN * noise > 1.0 - p:
            level = np.int32(b << SHIFT).view(np.float32)
            break
    clear(hist, squares, lo, hi)
    return level


@jit
def crossing_of(row: Any, level: Any, p: float, candidates: Any, hist: Any, halves: Any) -> Any:
    """The entries >= level into candidates, their mass histogram (in two halves, whose
    sums do not wait on each other), and the bucket where the mass from the top reaches p
    with the mass above it; -1 where the candidates hold less than p. Also the range of
    buckets [lo, hi] the candidates reached: the caller reads the histogram, then clears it."""
    n = compact(row, level, candidates)
    lo, hi = BUCKETS, -1
    for i in range(0, n - 1, 2):
        b, c = bucket(candidates[i]), bucket(candidates[i + 1])
        hist[b] += candidates[i]
        halves[c] += candidates[i + 1]
        lo = min(lo, b, c)
        hi = max(hi, b, c)
    if n % 2:
        b = bucket(candidates[n - 1])
        hist[b] += candidates[n - 1]
        lo = min(lo, b)
        hi = max(hi, b)
    above = 0.0
    for b in range(hi, lo - 1, -1):
        hist[b] += halves[b]
        if above + hist[b] >= p:
            return n, above, b, lo, hi
        above += hist[b]
    return n, above, -1, lo, hi


@jit
def thresholds(rows: Any, p: float, error: float, smallest: Any, zero: bool, out: Any,
               proven: Any, hist: Any, squares: Any, candidates: Any) -> None:
    count, vocab = rows.shape
    for r in range(count):
        row = rows[r]
        proven[r] = False
        out[r] = 0
        level = max(row.dtype.type(level_of(row, p, hist, squares)), smallest)
        n, above, crossing, lo, hi = crossing_of(row, level, p, candidates, hist, squares)
        if crossing < 0 and level > smallest:  # the sample put the level too high: every positive
            clear(hist, squares, lo, hi)
            level = smallest
            n, above, crossing, lo, hi = crossing_of(row, level, p, candidates, hist, squares)
        if crossing < 0:  # the positive entries hold less than p: not decided here
            clear(hist, squares, lo, hi)
            continue
        members = np.empty(n, rows.dtype)
        m = 0
        for i in range(n):  # branch-free: every entry written, the next slot past the members
            x = candidates[i]
            members[m] = x
            m += bucket(x) == crossing
        ranked = np.sort(members[:m])[::-1]
        prior, kept = 0.0, 0
        for i in range(m):  # the sort's rule on exact sums: keep while the mass before < p
            if above + prior >= p:
                break
            kept = i + 1
            prior += np.float64(ranked[i])
        v = ranked[max(kept, 1) - 1]
        strict, at_least = above, above
        for i in range(m):
            if ranked[i] > v:
                strict += np.float64(ranked[i])
            if ranked[i] >= v:
                at_least += np.float64(ranked[i])
        # The row's mass is at most the candidates' plus the others', each below the level.
        # (crossing_of merged the halves of the buckets from the top down to the crossing).
        mass = above + hist[crossing]
        for b in range(lo, crossing):
            mass += hist[b] + squares[b]
        clear(hist, squares, lo, hi)
        bound = error * (mass + (vocab - n) * np.float64(level))
        out[r] = v
        proven[r] = (strict + bound < p) and (at_least - bound >= p)
        if zero and proven[r]:  # while the row is in cache
            for j in range(vocab):
                x = row[j]
                row[j] = x if x >= v else 0.0


@jit
def zero(rows: Any, floor: Any) -> None:
    count, vocab = rows.shape
    for r in range(count):
        f = floor[r]
        row = rows[r]
        for j in range(vocab):  # a select and a store each: vectorised
            x = row[j]
            row[j] = x if x >= f else 0.0


@jit
def kth_largest_of(x: Any, n: int, k: int, heap: Any) -> Any:
    """The k-th largest of x[:n] (1 <= k <= n; no NaN), ties counted: a min-heap of the k
    largest seen, whose root is replaced by each larger entry. On shuffled rows only about
    k ln(n / k) entries enter it, so the cost is about n comparisons."""
    for i in range(k):  # heapify the first k (sift each up)
        heap[i] = x[i]
        j = i
        while j > 0:
            parent = (j - 1) >> 1
            if heap[parent] <= heap[j]:
                break
            heap[parent], heap[j] = heap[j], heap[parent]
            j = parent
    for i in range(k, n):
        v = x[i]
        if v <= heap[0]:
            continue
        j = 0  # sift v down from the root
        while True:
            child = 2 * j + 1
            if child >= k:
                break
            if child + 1 < k and heap[child + 1] < heap[child]:
                child += 1
            if heap[child] >= v:
                break
            heap[j] = heap[child]
            j = child
        heap[j] = v
    return heap[0]


@jit
def top_k_candidates(rows: Any, maxima: Any, k: int, temperature: Any) -> Any:
    """The candidate stage of the grouped top-k warp for rows [R, V] and their group maxima
    [R, G] (V = G * group; torch's amax, NaN propagated).

    Per row: the scaled maxima (m / temperature, in the rows' dtype: the correctly rounded
    division torch's is), the row's peak, the groups whose scaled maximum reaches the k-th
    largest of them, their scaled entries (`scaled` [R, W], -inf past the row's own) with
    their indices into the flattened rows (`flat`, -1 past), and the k-th largest of those.
    Returns (scaled, flat, peak [R], kth [R], ok); ok is False where a row is not for this
    path: a NaN or +inf scaled maximum, a row of -inf, fewer than k groups picked or more
    than a quarter of them (the caller takes the full path, which checks and words it).
    """
    count, vocab = rows.shape
    groups = maxima.shape[1]
    group = vocab // groups
    scaled_maxima = np.empty(groups, rows.dtype)
    picked = np.empty((count, groups), np.int64)
    sizes = np.zeros(count, np.int64)
    peak = np.empty(count, rows.dtype)
    kth = np.empty(count, rows.dtype)
    heap = np.empty(max(k, 1), rows.dtype)
    divide = temperature != 1
    for r in range(count):
        if divide:
            for g in range(groups):
                scaled_maxima[g] = maxima[r, g] / temperature
        else:
            for g in range(groups):
                scaled_maxima[g] = maxima[r, g]
        top = scaled_maxima[0]
        bad = False
        for g in range(groups):
            m = scaled_maxima[g]
            bad |= (m != m) | (m == np.inf)
            top = max(top, m)
        if bad or top == -np.inf:
            return np.empty((0, 0), rows.dtype), np.empty((0, 0), np.int64), peak, kth, False
        peak[r] = top
        level = kth_largest_of(scaled_maxima, groups, k, heap)
        n = 0
        for g in range(groups):
            if scaled_maxima[g] >= level:
                picked[r, n] = g
                n += 1
        if n < k or 4 * n > groups:
            return np.empty((0, 0), rows.dtype), np.empty((0, 0), np.int64), peak, kth, False
        sizes[r] = n
    width = sizes.max() * group
    scaled = np.full((count, width), -np.inf, rows.dtype)
    flat = np.full((count, width), -1, np.int64)
    for r in range(count):
        row = rows[r]
        for i in range(sizes[r]):
            start = picked[r, i] * group
            if divide:
                for j in range(group):
                    scaled[r, i * group + j] = row[start + j] / temperature
            else:
                for j in range(group):
                    scaled[r, i * group + j] = row[start + j]
            for j in range(group):
                flat[r, i * group + j] = r * vocab + start + j
        kth[r] = kth_largest_of(scaled[r], sizes[r] * group, k, heap)
    return scaled, flat, peak, kth, True


@jit
def scatter_kept(out: Any, values: Any, scaled: Any, kth: Any, flat: Any) -> None:
    """out.flat[flat[r, i]] = values[r, i] where scaled[r, i] >= kth[r] (else 0), for the
    real slots (flat >= 0): the top-k entries written into a zeroed output."""
    for r in range(flat.shape[0]):
        for i in range(flat.shape[1]):
            at = flat[r, i]
            if at >= 0:
                out[at] = values[r, i] if scaled[r, i] >= kth[r] else 0.0


@jit
def divide_kept(out: Any, flat: Any, total: Any) -> None:
    """out.flat[flat[r, i]] /= total[r] for the real slots: the normalisation of the kept
    entries (every other entry is 0), correctly rounded as NumPy's and torch's division."""
    for r in range(flat.shape[0]):
        t = total[r]
        for i in range(flat.shape[1]):
            at = flat[r, i]
            if at >= 0:
                out[at] = out[at] / t
