"""Caches: per-row valid lengths over buffers of fixed capacity, consumed by a forward.

The contract (every `Model` follows it): a forward *consumes* the cache it is given.
It may write into the buffers in place (donation, as JAX's `donate_argnames`), and the
cache it returns is the only valid one from then on. Using a consumed cache again
(feeding it to a forward, or starting a round from a state that holds it) raises
`ConsumedCacheError`, on every backend, instead of silently reading buffers that a
later forward overwrote. Moving lengths (`commit`, `rollback`) consumes nothing: the
rolled-back cache is valid as long as the one it came from is. To branch, keep the
committed tokens and prefill a fresh cache.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specsample._array import Array, namespace

__all__ = ["Cache", "ConsumedCacheError", "Lineage", "check_live", "commit", "consume", "rollback"]


class ConsumedCacheError(ValueError):
    """A cache that a forward already consumed was used again."""


class Lineage:
    """The one mutable counter that the caches over one set of buffers share.

    Each forward bumps it; a cache whose own `generation` is behind is consumed.
    """

    __slots__ = ("generation",)

    def __init__(self) -> None:
        self.generation = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cache:
    """A model's cache: `lengths` valid positions per row, over fixed `capacity`.

    Attributes:
        lengths: int64 [B]; row b holds valid entries at positions [0, lengths[b]).
        capacity: the fixed number of positions the buffers hold.
        buffers: backend-specific storage (a table of tokens, K/V tensors, ...).
            Only model adapters read it; the core moves lengths only, so a
            rollback never copies or shrinks buffers.
        lineage: shared by every cache over these buffers (new for a new cache).
        generation: the lineage's generation this cache belongs to; the cache is
            live while it equals `lineage.generation`.
    """

    lengths: Array
    capacity: int
    buffers: Any = None
    lineage: Lineage = dataclasses.field(default_factory=Lineage, compare=False, repr=False)
    generation: int = 0

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

    @property
    def live(self) -> bool:
        """False once a forward has consumed this cache (or one of its lineage after it)."""
        return self.generation == self.lineage.generation


def check_live(cache: Cache, name: str = "cache") -> None:
    """Raise ConsumedCacheError if `cache` was consumed by a forward."""
    if not isinstance(cache, Cache):
        raise TypeError(f"{name}: expected a Cache, got {type(cache).__name__}")
    if not cache.live:
        raise ConsumedCacheError(
            f"{name}: this cache was consumed by a later forward (generation {cache.generation}, "
            f"its buffers are at generation {cache.lineage.generation}); a forward donates its "
            f"cache, so use the cache it returned, or prefill a fresh cache to branch")


def consume(cache: Cache, *, lengths: Array, buffers: Any, name: str = "cache") -> Cache:
    """For a model's forward: check `cache` is live, consume it, return its successor.

    Args:
        cache: the cache the forward was given (consumed from now on).
        lengths: the successor's lengths [B].
        buffers: the successor's buffers (the same objects when written in place).
    """
    check_live(cache, name)
    cache.lineage.generation += 1
    return Cache(lengths=lengths, capacity=cache.capacity, buffers=buffers, lineage=cache.lineage,
                 generation=cache.lineage.generation)


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
