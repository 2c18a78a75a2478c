"""Compiled per-row passes of the warp on host (NumPy or torch CPU) arrays: the top-p
threshold and the in-place zeroing below a floor, through numba.

Each pass reads a row once where NumPy and torch need several (a strided sample, a level,
a compaction, a sort of the candidates, cumulative sums), and the per-call overhead of
eager array libraries is what dominates at a few rows of a vocabulary. The threshold
follows `specsample.kernels.select`'s histogram proof (its docstring): a row it does not prove
is returned unproven, and the caller decides it another way, so the result is always the
full sort's. numba is the `fast` extra (`pip install 'specsample[fast]'`); without it
(`available()` is False) the callers keep their NumPy and torch paths, with the same results.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from specsample.kernels.layout import BUCKETS, LANES

__all__ = ["available", "top_k_candidates", "top_k_write", "top_p_rows", "zero_below"]


# The smallest positive value of each dtype (`np.finfo` is slow to ask on every call).
_SMALLEST = {dtype: dtype(np.finfo(dtype).smallest_subnormal) for dtype in (np.float32, np.float64)}

_compiled: dict[str, Any] | None = None
_failed = False
# Tests switch the kernels off to exercise the NumPy and torch paths.
enabled = True
# Each thread's working arrays for `top_p_rows`, kept between calls: the histograms (all
# zeros between calls; the pass clears what it wrote) and room for a row's candidates,
# whose fresh allocation (a row of a real vocabulary: past malloc's mmap threshold) costs
# page faults on every call.
_local = threading.local()


def _scratch(vocab: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    kept = getattr(_local, "arrays", None)
    if kept is None:
        kept = _local.arrays = {}
    arrays = kept.get(dtype)
    if arrays is None or arrays[2].shape[0] < vocab + LANES:
        arrays = kept[dtype] = (np.zeros(BUCKETS, np.float64), np.zeros(BUCKETS, np.float64),
                                np.empty(vocab + LANES, dtype))
    return arrays


def available() -> bool:
    """Whether the compiled passes run here (numba installed, and `enabled`)."""
    return enabled and _kernels() is not None


def _kernels() -> dict[str, Any] | None:
    """The compiled functions, loaded (or compiled, then cached by numba on disk) on first
    use and tried once on small rows of each dtype; None without numba, or where they fail
    to build here (the callers then keep their NumPy and torch paths)."""
    global _compiled, _failed
    if _compiled is None and not _failed:
        try:
            from specsample.kernels import compiled

            for dtype in (np.float32, np.float64):
                row = np.full((1, 64), 1 / 64, dtype=dtype)
                compiled.thresholds(row, 0.5, 1e-9, dtype(np.finfo(dtype).smallest_subnormal), True,
                                    np.zeros(1, dtype), np.zeros(1, np.bool_), *_scratch(64, np.dtype(dtype)))
                compiled.zero(row, np.ones(1, dtype))
                compiled.top_k_candidates(np.zeros((1, 512), dtype), np.zeros((1, 16), dtype), 1, dtype(0.5))
                slots = np.zeros((1, 4), np.int64)
                compiled.scatter_kept(np.zeros(8, dtype), np.zeros((1, 4), dtype), np.zeros((1, 4), dtype),
                                      np.zeros(1, dtype), slots)
                compiled.divide_kept(np.zeros(8, dtype), slots, np.ones(1, dtype))
            _compiled = {"thresholds": compiled.thresholds, "zero": compiled.zero,
                         "top_k_candidates": compiled.top_k_candidates, "scatter_kept": compiled.scatter_kept,
                         "divide_kept": compiled.divide_kept}
        except Exception:  # numba absent, or unable to build here: the callers' other paths
            _failed = True
    return _compiled


def top_p_rows(rows: np.ndarray, top_p: float, error: float, *,
               zero: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each row's top-p threshold and whether the histogram proof holds for it.

    Args:
        rows: [R, V] float32 or float64, C-contiguous, non-negative and finite.
        top_p: in (0, 1), as the rows' dtype rounds it (the sort compares in that dtype).
        error: the sort's cumulative-sum error bound per unit of a row's mass.
        zero: also write 0 over the entries below the threshold of each proven row, in place.

    Returns:
        threshold [R] of rows' dtype (meaningful where proven), proven bool [R].
    """
    kernels = _kernels()
    if kernels is None:
        raise RuntimeError("top_p_rows: numba is not installed; check available() first")
    if rows.ndim != 2 or rows.dtype not in (np.float32, np.float64) or not rows.flags.c_contiguous:
        raise ValueError(f"rows: expected a C-contiguous [R, V] float32 or float64 array, got "
                         f"{rows.dtype} of shape {rows.shape}")
    threshold = np.zeros(rows.shape[0], dtype=rows.dtype)
    proven = np.zeros(rows.shape[0], dtype=np.bool_)
    smallest = _SMALLEST[rows.dtype.type]  # the level's floor: every positive entry
    hist, squares, candidates = _scratch(rows.shape[1], rows.dtype)
    kernels["thresholds"](rows, float(top_p), float(error), smallest, bool(zero), threshold, proven,
                          hist, squares, candidates)
    return threshold, proven


def zero_below(rows: np.ndarray, floor: np.ndarray) -> None:
    """Write 0 over the entries of each row below its floor, in place: `where(rows >= floor,
    rows, 0)` for finite rows. rows [R, V] float32/float64 C-contiguous, floor [R] the same dtype."""
    kernels = _kernels()
    if kernels is None:
        raise RuntimeError("zero_below: numba is not installed; check available() first")
    if rows.ndim != 2 or rows.dtype not in (np.float32, np.float64) or not rows.flags.c_contiguous \
            or floor.shape != rows.shape[:1] or floor.dtype != rows.dtype:
        raise ValueError(f"rows, floor: expected a C-contiguous [R, V] float32 or float64 array and "
                         f"[R] floors of its dtype, got {rows.dtype} {rows.shape} and {floor.dtype} "
                         f"{floor.shape}")
    kernels["zero"](rows, floor)


def top_k_candidates(rows: np.ndarray, maxima: np.ndarray, k: int,
                     temperature: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The candidate stage of the grouped top-k warp (`_compiled.top_k_candidates`).

    Args:
        rows: [R, V] float32 or float64, C-contiguous.
        maxima: [R, G] of rows' dtype, C-contiguous: the maxima of G groups of V / G
            consecutive entries (NaN where a group holds one).
        k: 1 <= k <= G / 4.
        temperature: > 0, rounded to the rows' dtype as torch rounds a Python scalar.

    Returns:
        scaled [R, W] (the picked groups' entries divided by the temperature, -inf past a
        row's own), flat [R, W] (their indices into rows' flattened entries, -1 past),
        peak [R] and kth [R] (the k-th largest scaled entry); None where a row is not for
        this path (NaN, +inf, a row of -inf, or more than a quarter of the groups picked).
    """
    kernels = _kernels()
    if kernels is None:
        raise RuntimeError("top_k_candidates: numba is not installed; check available() first")
    if rows.ndim != 2 or rows.dtype not in (np.float32, np.float64) or not rows.flags.c_contiguous \
            or maxima.ndim != 2 or maxima.dtype != rows.dtype or not maxima.flags.c_contiguous \
            or maxima.shape[0] != rows.shape[0] or maxima.shape[1] < 1 or rows.shape[1] % maxima.shape[1] \
            or not 1 <= k <= maxima.shape[1] // 4:
        raise ValueError(f"rows, maxima, k: expected C-contiguous [R, V] and [R, G] arrays of one float "
                         f"dtype, G dividing V, and 1 <= k <= G / 4, got {rows.dtype} {rows.shape}, "
                         f"{maxima.dtype} {maxima.shape} and k = {k}")
    scaled, flat, peak, kth, ok = kernels["top_k_candidates"](rows, maxima, k, rows.dtype.type(temperature))
    return (scaled, flat, peak, kth) if ok else None


def top_k_write(out: np.ndarray, values: np.ndarray, scaled: np.ndarray, kth: np.ndarray, flat: np.ndarray,
                total: Callable[[], np.ndarray]) -> None:
    """Write the top-k warp's kept entries into `out` (zeros, flattened [R * V]) and
    normalise them: values [R, W] (exp of the scaled candidates less the peak), scaled [R, W]
    and kth [R] (which candidates are kept: scaled >= kth), flat [R, W] (their indices into
    out, -1 for pads); `total()` gives the row sums [R] of the written output (torch's own,
    whose bits the normalisation divides by), after the writes and before the division."""
    kernels = _kernels()
    if kernels is None:
        raise RuntimeError("top_k_write: numba is not installed; check available() first")
    if out.ndim != 1 or values.shape != scaled.shape or flat.shape != scaled.shape \
            or kth.shape != scaled.shape[:1] or not all(a.dtype == out.dtype for a in (values, scaled, kth)):
        raise ValueError(f"out, values, scaled, kth, flat: expected a flat output and [R, W] candidates "
                         f"of its dtype with [R] levels, got {out.shape}, {values.shape}, {scaled.shape}, "
                         f"{kth.shape}, {flat.shape}")
    kernels["scatter_kept"](out, values, scaled, kth, flat)
    kernels["divide_kept"](out, flat, np.ascontiguousarray(total(), dtype=out.dtype))
