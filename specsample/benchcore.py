"""Micro-benchmark of the core: `verify` time by batch, K and array library."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from specsample.verify import verify

__all__ = ["bench_verify"]


def _inputs(batch: int, k: int, vocab: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(batch, 2 * k + 1, vocab)).astype(np.float32)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    q, p = probs[:, :k], probs[:, k:]  # [B, K, V], [B, K+1, V]
    drafts = np.argmax(q, axis=-1).astype(np.int64)  # any token with q > 0
    return drafts, q, p, rng.random((batch, k + 1))


def _convert(arrays: tuple[np.ndarray, ...], library: str) -> tuple[Any, ...]:
    drafts, q, p, u = arrays
    if library == "numpy-float64":
        return drafts, q.astype(np.float64), p.astype(np.float64), u
    if library == "numpy-float32":
        return drafts, q, p, u.astype(np.float32)
    import torch

    dtype = torch.float64 if library == "torch-float64" else torch.float32
    return (torch.from_numpy(drafts), torch.from_numpy(q).to(dtype), torch.from_numpy(p).to(dtype),
            torch.from_numpy(u).to(dtype))


def _caller(args: tuple[Any, ...], check: bool) -> Callable[[], object]:
    return lambda: verify(*args, check=check)


def _time(call: Callable[[], object], repeats: int) -> list[float]:
    call()  # warm-up
    out = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        out.append(time.perf_counter() - began)
    return out


def bench_verify(*, batches: Iterable[int] = (1, 8, 64), ks: Iterable[int] = (4, 8), vocab: int = 49152,
                 libraries: Iterable[str] = ("numpy-float64", "numpy-float32", "torch-float32"),
                 repeats: int = 30, check: bool = False,
                 progress: Callable[[str], None] | None = None) -> list[dict[str, object]]:
    """Median wall time of one `verify` call for each setting.

    Args:
        batches, ks, vocab: the shapes [B, K(+1), V].
        libraries: "numpy-float64", "numpy-float32", "torch-float32", "torch-float64".
        repeats: timed calls per setting (after one warm-up).
        check: include input validation in the timing (off, as inside a graph).
        progress: called with a label before each setting.

    Returns:
        One record per setting: library, batch, k, vocab, check, median_ms, p90_ms, repeats.
    """
    records: list[dict[str, object]] = []
    for library in libraries:
        for batch in batches:
            for k in ks:
                if progress is not None:
                    progress(f"{library} B={batch} K={k}")
                args = _convert(_inputs(batch, k, vocab, seed=batch * 100 + k), library)
                times = sorted(_time(_caller(args, check), repeats))
                records.append({"library": library, "batch": batch, "k": k, "vocab": vocab,
                                "check": check, "median_ms": 1e3 * statistics.median(times),
                                "p90_ms": 1e3 * times[int(0.9 * (len(times) - 1))],
                                "repeats": repeats})
    return records
