"""Caches as values: per-row valid lengths over buffers of fixed capacity."""

from __future__ import annotations

import dataclasses
from typing import Any

from specsample._array import Array, namespace

__all__ = ["Cache", "commit", "rollback"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cache:
    """A model's cache: `lengths` valid positions per row, over fixed `capacity`.

    Attributes:
        lengths: int64 [B]; row b holds valid entries at positions [0, lengths[b]).
        capacity: the fixed number of positions the buffers hold.
        buffers: backend-specific storage (a table of tokens, K/V tensors, ...).
            Only model adapters read it; the core moves lengths only, so a
            rollback never copies or shrinks buffers.
    """

    lengths: Array
    capacity: int
    buffers: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
            raise TypeError(f"capacity: expected an int, got {type(self.capacity).__name__}")
        if self.capacity < 1:
            raise ValueError(f"capacity: expected >= 1, got {self.capacity}")
        if getattr(self.lengths, "ndim", None) != 1:
            raise ValueError(
                f"lengths: expected a 1-D integer array [B], got {type(self.lengths).__name__} "
                f"with shape {getattr(self.lengths, 'shape', None)}"
            )

    @property
    def batch(self) -> int:
        """Number of rows B."""
        return int(self.lengths.shape[0])


def commit(cache: Cache, advance: Array) -> Cache:
    """Advance every row's valid length by `advance` [B] (accepted tokens)."""
    return rollback(cache, cache.lengths + advance)


def rollback(cache: Cache, lengths: Array) -> Cache:
    """Set the valid lengths to `lengths` [B]; buffers are untouched (no copy)."""
    xp = namespace(lengths)
    new = xp.astype(lengths, xp.int64)
    if new.shape != cache.lengths.shape:
        raise ValueError(
            f"lengths: expected shape {tuple(cache.lengths.shape)}, got {tuple(new.shape)}"
        )
    return dataclasses.replace(cache, lengths=new)
