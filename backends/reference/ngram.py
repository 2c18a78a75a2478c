"""Toy language models defined by explicit tables: their sequence law is known."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import array_api_compat
import numpy as np
from numpy.typing import NDArray

from specsample.core.cache import Cache, check_live, consume

__all__ = ["NGramModel", "random_ngram"]


class NGramModel:
    """A context-dependent model: the next token's law given the last `order` tokens.

    `table[c_1, ..., c_order]` is the law [V] of the next token after the
    tokens c_1..c_order (oldest first). Positions before the start of a row
    read as token 0, so the first tokens of a sequence are context-dependent too.
    The cache is the token history itself, a buffer of fixed capacity.

    Args:
        table: float64 [V] * order + [V], each row non-negative, summing to 1.
    """

    def __init__(self, table: NDArray[np.float64]) -> None:
        table = np.asarray(table, dtype=np.float64)
        vocab = table.shape[-1]
        if table.ndim < 2 or any(d != vocab for d in table.shape):
            raise ValueError(f"table: expected shape [V] * (order + 1), got {list(table.shape)}")
        if not np.all(np.isfinite(table)) or np.any(table < 0):
            raise ValueError("table: expected finite, non-negative probabilities")
        if not np.allclose(table.sum(axis=-1), 1.0, atol=1e-12):
            raise ValueError("table: expected every row to sum to 1")
        self.table = table
        self.order = table.ndim - 1
        with np.errstate(divide="ignore"):
            self._logits = np.log(table)  # -inf marks probability 0

    @property
    def vocab_size(self) -> int:
        """V."""
        return int(self.table.shape[-1])

    def new_cache(self, batch: int, capacity: int) -> Cache:
        """An empty history: token ids [B, capacity], lengths 0."""
        return Cache(lengths=np.zeros(batch, dtype=np.int64), capacity=capacity,
                     buffers=np.zeros((batch, capacity), dtype=np.int64))

    def forward(self, tokens: Any, cache: Cache) -> tuple[Any, Cache]:
        """Logits [B, T, V] after each of tokens [B, T] written at the lengths.

        The table and the history are NumPy; the logits and the new lengths come back in
        the array library of `tokens` (NumPy, torch on CPU, JAX, ...), so that the core
        around this model runs on that library.
        """
        xp = array_api_compat.array_namespace(tokens)
        tokens, lengths = np.asarray(tokens), np.asarray(cache.lengths)
        batch, width = tokens.shape
        if np.any(lengths + width > cache.capacity):
            raise ValueError(f"tokens: writing {width} tokens at lengths {lengths.tolist()} "
                             f"exceeds the cache capacity {cache.capacity}")
        check_live(cache)
        history = cache.buffers  # written in place: the forward consumes `cache`
        rows = np.arange(batch)[:, None]
        positions = lengths[:, None] + np.arange(width)[None, :]  # [B, T]
        history[rows, positions] = tokens
        # Context of position t: the `order` tokens ending at t (0 before the start).
        offsets = positions[:, :, None] - np.arange(self.order - 1, -1, -1)[None, None, :]  # [B, T, order]
        context = np.where(offsets >= 0, history[rows[:, :, None], np.maximum(offsets, 0)], 0)
        logits = self._logits[tuple(np.moveaxis(context, -1, 0))]  # [B, T, V]
        return xp.asarray(logits), consume(cache, lengths=xp.asarray(lengths + width), buffers=history)

    def law(self, context: tuple[int, ...]) -> list[Fraction]:
        """The exact next-token law after `context` (the whole prefix), as Fractions."""
        padded = (0,) * self.order + tuple(context)
        row = self.table[padded[len(padded) - self.order:]]
        return _exact(row)


def _exact(row: NDArray[np.float64]) -> list[Fraction]:
    # The float64 entries are dyadic rationals: Fraction(float) is exact, and the
    # table rows sum to 1 in exact arithmetic by construction (see random_ngram).
    return [Fraction(float(x)) for x in row]


def random_ngram(vocab: int, *, order: int = 1, seed: int = 0, concentration: float = 1.0,
                 zeros: float = 0.0) -> NGramModel:
    """A seeded random n-gram model whose rows sum to exactly 1 in binary.

    Args:
        vocab: V >= 2.
        order: how many previous tokens the law depends on (>= 1).
        seed: NumPy seed of the table.
        concentration: Dirichlet concentration (small: peaked laws).
        zeros: the chance that an entry is forced to 0 (never a whole row).
    """
    if vocab < 2 or order < 1:
        raise ValueError(f"vocab/order: expected V >= 2 and order >= 1, got {vocab}, {order}")
    rng = np.random.default_rng(seed)
    table = rng.dirichlet(np.full(vocab, concentration), size=(vocab,) * order)
    mask = rng.random(table.shape) < zeros
    mask[..., 0] = False
    for index in itertools.product(range(vocab), repeat=order):
        keep = int(rng.integers(vocab))
        mask[(*index, keep)] = False
    table = np.where(mask, 0.0, table)
    # Round to multiples of 2^-20, then put the rounding error on the largest entry:
    # each row is then exactly representable and sums to exactly 1.
    table = np.round(table / table.sum(axis=-1, keepdims=True) * 2**20) / 2**20
    top = np.argmax(table, axis=-1)[..., None]
    fix = 1.0 - table.sum(axis=-1, keepdims=True)
    np.put_along_axis(table, top, np.take_along_axis(table, top, axis=-1) + fix, axis=-1)
    return NGramModel(table)
