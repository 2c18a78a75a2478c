"""Compiled per-row passes of the warp on host (NumPy or torch CPU) arrays: the top-p
threshold and the in-place zeroing below a floor, through numba.

Each pass reads a row once where NumPy and torch need several (a strided sample, a level,
a compaction, a sort of the candidates, cumulative sums), and the per-call overhead of
eager array libraries is what dominates at a few rows of a vocabulary. The threshold
follows `specsample._select`'s histogram proof (its docstring): a row it does not prove
is returned unproven, and the caller decides it another way, so the result is always the
full sort's. Without numba (`available()` is False) the callers keep their NumPy and torch
paths.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["available", "top_p_rows", "zero_below"]

# The top 12 bits of a float32 (sign, exponent, 3 mantissa bits): 4096 buckets, ordered as
# the non-negative values are (as `specsample._select`'s histogram).
_BUCKETS = 1 << 12
_SHIFT = 32 - 12
# Every _STRIDE-th entry of a row is the sample that places the candidate level: the lower
# edge of the lowest bucket where the sampled mass below, plus _MARGIN of its standard
# errors, exceeds 1 - top_p (as `specsample._select`'s candidate level).
_STRIDE = 32
_MARGIN = 4.0
# Entries of the widest vector `specsample._compiled.packed` packs (16 float32 in 64 bytes).
_LANES = 16

# The smallest positive value of each dtype (`np.finfo` is slow to ask on every call).
_SMALLEST = {dtype: dtype(np.finfo(dtype).smallest_subnormal) for dtype in (np.float32, np.float64)}

_compiled: dict[str, Any] | None = None
_failed = False
# Tests switch the kernels off to exercise the NumPy and torch paths.
enabled = True


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
            from specsample import _compiled as compiled

            for dtype in (np.float32, np.float64):
                row = np.full((1, 64), 1 / 64, dtype=dtype)
                compiled.thresholds(row, 0.5, 1e-9, dtype(np.finfo(dtype).smallest_subnormal), True,
                                    np.zeros(1, dtype), np.zeros(1, np.bool_))
                compiled.zero(row, np.ones(1, dtype))
            _compiled = {"thresholds": compiled.thresholds, "zero": compiled.zero}
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
    kernels["thresholds"](rows, float(top_p), float(error), smallest, bool(zero), threshold, proven)
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
