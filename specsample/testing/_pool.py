"""Pooling of sparse bins for chi-square-type tests, decided by expected counts only."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["merge", "pool_by_expected"]


def pool_by_expected(expected: NDArray[np.float64], *, minimum: float = 5.0) -> NDArray[np.intp]:
    """Group labels that merge every bin whose expected count is below `minimum` into one bin.

    The rule reads expected counts only, never observed ones: pooling by observed count would
    hide exactly the bins a faulty sampler never hits. If the pooled bin is itself below
    `minimum`, it is merged with the smallest remaining bin.

    Args:
        expected: expected counts [M], >= 0.
        minimum: the smallest expected count a bin may keep on its own.

    Returns:
        intp [M]: labels[j] in [0, G) is the pooled bin of bin j (labels are dense).
    """
    small = expected < minimum  # [M]
    labels = np.cumsum(~small) - 1  # the large bins keep their order as 0 .. B-1
    large = int(np.count_nonzero(~small))
    labels[small] = large
    if large > 0 and small.any() and float(expected[small].sum()) < minimum:
        smallest = int(np.argmin(np.where(small, np.inf, expected)))
        labels[small] = labels[smallest]
    return labels.astype(np.intp)


def merge(values: NDArray[np.float64] | NDArray[np.int64], labels: NDArray[np.intp]
          ) -> NDArray[np.float64]:
    """Sum `values` [M] within the groups `labels` [M] gives (see `pool_by_expected`).

    Args:
        values: per-bin counts or expected counts [M].
        labels: dense group labels [M].

    Returns:
        float64 [G], G = labels.max() + 1.
    """
    return np.bincount(labels, weights=values, minlength=int(labels.max()) + 1).astype(np.float64)
