"""Counter-based uniforms: randomness is data, drawn from an explicit key.

The generator is Philox4x32-10 (Random123's known answers hold it in `tests/test_rng.py`),
written here in NumPy and Python integers: `numpy.random.Philox` is Philox4x64-10, another
stream, so taking it would change every uniform and every recorded token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from specsample._array import Array, check_int, device, namespace

__all__ = ["Seed", "Stream", "philox4x32", "round_uniforms", "row_seeds", "uniforms"]

Seed = int | Sequence[int]  # one key for the batch, or one key per row

# Philox4x32's multipliers and key increments, and the 32-bit mask: the Python-integer block
# (`_philox_block`) reads them as they are, the vectorised one (`philox4x32`) as uint64.
_MUL0, _MUL1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK = 0xFFFFFFFF
_M0, _M1, _LOW = np.uint64(_MUL0), np.uint64(_MUL1), np.uint64(_MASK)


class Stream:
    """Names of the independent streams drawn from one seed."""

    SPECULATIVE = 0
    PLAIN = 1
    FINAL = 2  # the final (correction or bonus) token of a round


def philox4x32(counter: NDArray[np.uint32],
               key: tuple[int | NDArray[np.uint64], int | NDArray[np.uint64]]) -> NDArray[np.uint32]:
    """Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3").

    Args:
        counter: uint32 [..., 4] counters.
        key: two 32-bit words (ints, or uint64 arrays broadcastable to counter[..., 0]).

    Returns:
        uint32 [..., 4]: a random block per counter, a pure function of (counter, key).
    """
    c = [counter[..., i].astype(np.uint64) for i in range(4)]
    k0 = np.asarray(key[0], dtype=np.uint64) & _LOW
    k1 = np.asarray(key[1], dtype=np.uint64) & _LOW
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(_W0)) & _LOW, (k1 + np.uint64(_W1)) & _LOW
        p0, p1 = _M0 * c[0], _M1 * c[2]  # 64-bit products of 32-bit words
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _LOW,
             (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _LOW]
    return np.stack(c, axis=-1).astype(np.uint32)


def row_seeds(seed: Seed, rows: int) -> NDArray[np.uint64] | None:
    """Validate a seed: None for one int key, else uint64 [rows] (one key per row)."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        check_int("seed", seed, 0, 2**64)
        return None
    if hasattr(seed, "tolist"):
        seed = seed.tolist()
    if isinstance(seed, (str, bytes)) or not isinstance(seed, (Sequence, np.ndarray)):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__} (or one int per row)")
    values = [check_int(f"seed[{i}]", s, 0, 2**64) for i, s in enumerate(seed)]
    if len(values) != rows:
        raise ValueError(f"seed: expected one seed per row ({rows}), got {len(values)}")
    return np.asarray(values, dtype=np.uint64)


def uniforms(seed: Seed, step: int, rows: int, width: int, *, stream: int = Stream.SPECULATIVE,
             like: Array | None = None, row_ids: NDArray[np.integer] | None = None) -> Array:
    """Uniforms [rows, width] in [0, 1) for one step, reproducible from the seed.

    With one int seed, row b's draws depend only on (seed, stream, step, b): the
    Philox counter is (draw pair, step, row, stream) and the key is the seed. With
    one seed per row, row b's draws depend only on (seed[b], stream, step): the key
    is the row's own seed and the counter's row word is 0, so a row gets the same
    numbers whatever batch it runs in and wherever it sits (as with per-request seeds);
    a one-row run with seed s equals a row with per-row seed s. Each double takes 53
    random bits from two 32-bit words; column j does not depend on `width`.

    Args:
        seed: the key, an int in [0, 2^64), or a sequence of `rows` such ints.
        step: the round (or decoding step) index, in [0, 2^32).
        rows: B.
        width: the number of draws per row.
        stream: which independent stream (see `Stream`).
        like: an array whose library and device the result takes (NumPy if None).
        row_ids: with one int seed, the row indices b of the `rows` rows (default
            0..rows-1), so that a subset of a larger batch, or a shard of it, draws
            exactly the numbers those rows draw in the whole batch.

    Returns:
        float64 [rows, width] (on `like`'s library and device).
    """
    step = check_int("step", step, 0, 2**32)
    rows = check_int("rows", rows, 0, 2**32)
    width = check_int("width", width, 0, 2**31)
    stream = check_int("stream", stream, 0, 2**32)
    per_row = row_seeds(seed, rows)
    ids = _row_ids(row_ids, rows, per_row is None)
    pairs = (width + 1) // 2
    if rows * pairs <= _FEW_BLOCKS:
        out = _few_uniforms(seed, per_row, ids, step, stream, rows, pairs)[:, :width]
    else:
        out = _many_uniforms(seed, per_row, ids, step, stream, rows, pairs)[:, :width]
    if like is None:
        return out
    xp = namespace(like)
    return xp.asarray(out, device=device(like))


# Up to this many Philox blocks, Python integers draw them faster than NumPy's vector
# operations on tiny arrays (a round at batch 1 needs a handful); both give the same bits.
_FEW_BLOCKS = 12


def _many_uniforms(seed: Seed, per_row: NDArray[np.uint64] | None, ids: NDArray[np.uint32], step: int,
                   stream: int, rows: int, pairs: int) -> NDArray[np.float64]:
    """`uniforms`' draws [rows, 2 * pairs] by NumPy's vectorised Philox."""
    counter = np.zeros((rows, pairs, 4), dtype=np.uint32)
    counter[..., 0] = np.arange(pairs, dtype=np.uint32)[None, :]
    counter[..., 1] = step
    if per_row is None:
        counter[..., 2] = ids[:, None]
        key: tuple[int | NDArray[np.uint64], int | NDArray[np.uint64]] = (
            int(seed) & _MASK, int(seed) >> 32)  # type: ignore[arg-type]
    else:
        key = ((per_row & _LOW)[:, None], (per_row >> np.uint64(32))[:, None])
    counter[..., 3] = stream
    words = philox4x32(counter, key).astype(np.uint64)  # [B, pairs, 4]
    high = (words[..., 0::2] >> np.uint64(5)).astype(np.float64)  # 27 bits
    low = (words[..., 1::2] >> np.uint64(6)).astype(np.float64)  # 26 bits
    return ((high * 67108864.0 + low) / 9007199254740992.0).reshape(rows, 2 * pairs)


def _few_uniforms(seed: Seed, per_row: NDArray[np.uint64] | None, ids: NDArray[np.uint32], step: int,
                  stream: int, rows: int, pairs: int) -> NDArray[np.float64]:
    """`_many_uniforms` by Python integers: the same counters, keys and arithmetic."""
    draws = []
    for b in range(rows):
        key = int(seed) if per_row is None else int(per_row[b])  # type: ignore[arg-type]
        row = int(ids[b]) if per_row is None else 0
        for pair in range(pairs):
            w0, w1, w2, w3 = _philox_block(pair, step, row, stream, key & _MASK, key >> 32)
            # Exact in float64: 27 + 26 bits, scaled by a power of two.
            draws += [((w0 >> 5) * 67108864.0 + (w1 >> 6)) / 9007199254740992.0,
                      ((w2 >> 5) * 67108864.0 + (w3 >> 6)) / 9007199254740992.0]
    return np.array(draws, dtype=np.float64).reshape(rows, 2 * pairs)


def _philox_block(c0: int, c1: int, c2: int, c3: int, k0: int, k1: int) -> tuple[int, int, int, int]:
    """`philox4x32` of one counter (four 32-bit words) under the key (k0, k1), in Python integers."""
    for r in range(10):
        if r:
            k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
        p0, p1 = _MUL0 * c0, _MUL1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & _MASK, (p0 >> 32) ^ c3 ^ k1, p0 & _MASK
    return c0, c1, c2, c3


def _row_ids(row_ids: NDArray[np.integer] | None, rows: int, one_seed: bool) -> NDArray[np.uint32]:
    """The row words of the counters: `row_ids` checked, or 0..rows-1."""
    if row_ids is None:
        return np.arange(rows, dtype=np.uint32)
    if not one_seed:
        raise ValueError("row_ids: expected None with one seed per row (each row's key is its own "
                         "seed), got row indices")
    ids = np.asarray(row_ids)
    if ids.shape != (rows,) or not np.issubdtype(ids.dtype, np.integer) or \
            (rows and (int(ids.min()) < 0 or int(ids.max()) >= 2**32)):
        raise ValueError(f"row_ids: expected {rows} integers in [0, 2^32), got an array of shape "
                         f"{list(ids.shape)} and dtype {ids.dtype}")
    return ids.astype(np.uint32)


def round_uniforms(seed: Seed, step: int, rows: int, k: int, *, like: Array | None = None,
                   row_ids: NDArray[np.integer] | None = None) -> Array:
    """The uniforms of one speculative round: [rows, 2k+1], laid out as `round_step` reads them.

    Columns 0..k-1 draw the drafts, k..2k-1 decide acceptance, 2k draws the final token.
    Draft slot i and acceptance slot i take draws 2i and 2i+1 of the round's stream and
    the final token takes its own stream, so no draw depends on k: a row that drafts
    fewer tokens than its neighbours (a per-row draft length) sees the numbers it would
    see alone. A round with k = 0 (a plain step) is the final draw alone.
    """
    check = check_int("k", k, 0, 2**30)
    final = uniforms(seed, step, rows, 1, stream=Stream.FINAL, like=None, row_ids=row_ids)  # [B, 1]
    if check == 0:
        out = final
    else:
        paired = uniforms(seed, step, rows, 2 * check, like=None, row_ids=row_ids)  # [B, 2k]
        out = np.concatenate([paired[:, 0::2], paired[:, 1::2], final], axis=1)
    if like is None:
        return out
    xp = namespace(like)
    return xp.asarray(out, device=device(like))
