"""Counter-based uniforms: randomness is data, drawn from an explicit key."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from specsample._array import Array, device, namespace

__all__ = ["Stream", "philox4x32", "uniforms"]

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_LOW = np.uint64(0xFFFFFFFF)


class Stream:
    """Names of the independent streams drawn from one seed."""

    SPECULATIVE = 0
    PLAIN = 1


def philox4x32(counter: NDArray[np.uint32], key: tuple[int, int]) -> NDArray[np.uint32]:
    """Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3").

    Args:
        counter: uint32 [..., 4] counters.
        key: two 32-bit words.

    Returns:
        uint32 [..., 4]: a random block per counter, a pure function of (counter, key).
    """
    c = [counter[..., i].astype(np.uint64) for i in range(4)]
    k0, k1 = key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF
    for r in range(10):
        if r:
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        p0, p1 = _M0 * c[0], _M1 * c[2]  # 64-bit products of 32-bit words
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & _LOW,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & _LOW]
    return np.stack(c, axis=-1).astype(np.uint32)


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if not low <= int(value) < high:
        raise ValueError(f"{name}: expected an int in [{low}, {high}), got {value}")
    return int(value)


def uniforms(seed: int, step: int, rows: int, width: int, *, stream: int = Stream.SPECULATIVE,
             like: Array | None = None) -> Array:
    """Uniforms [rows, width] in [0, 1) for one step, reproducible from the seed.

    Row b's draws depend only on (seed, stream, step, b): the Philox counter is
    (draw pair, step, row, stream) and the key is the seed. So a row gets the
    same randomness whatever batch it runs in, and every backend can be fed
    the same numbers. Each double takes 53 random bits from two 32-bit words.

    Args:
        seed: the key, an int in [0, 2^64).
        step: the round (or decoding step) index, in [0, 2^32).
        rows: B.
        width: the number of draws per row.
        stream: which independent stream (see `Stream`).
        like: an array whose library and device the result takes (NumPy if None).

    Returns:
        float64 [rows, width] (on `like`'s library and device).
    """
    seed = _check_int("seed", seed, 0, 2**64)
    step = _check_int("step", step, 0, 2**32)
    rows = _check_int("rows", rows, 0, 2**32)
    width = _check_int("width", width, 0, 2**31)
    stream = _check_int("stream", stream, 0, 2**32)
    pairs = (width + 1) // 2
    counter = np.zeros((rows, pairs, 4), dtype=np.uint32)
    counter[..., 0] = np.arange(pairs, dtype=np.uint32)[None, :]
    counter[..., 1] = step
    counter[..., 2] = np.arange(rows, dtype=np.uint32)[:, None]
    counter[..., 3] = stream
    words = philox4x32(counter, (seed & 0xFFFFFFFF, seed >> 32)).astype(np.uint64)  # [B, pairs, 4]
    high = (words[..., 0::2] >> np.uint64(5)).astype(np.float64)  # 27 bits
    low = (words[..., 1::2] >> np.uint64(6)).astype(np.float64)  # 26 bits
    out = ((high * 67108864.0 + low) / 9007199254740992.0).reshape(rows, 2 * pairs)[:, :width]
    if like is None:
        return out
    xp = namespace(like)
    return xp.asarray(out, device=device(like))
