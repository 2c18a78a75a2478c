"""Micro-benchmarks of the core: `verify` and `warp` time by batch, K and array library."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from specsample.core.params import SamplingParams
from specsample.core.verify import verify
from specsample.core.warp import warp
from specsample.engine.cost import timings

__all__ = ["bench_verify", "bench_warp"]


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
                times = sorted(timings(_caller(args, check), repeats))
                records.append({"library": library, "batch": batch, "k": k, "vocab": vocab,
                                "check": check, "median_ms": 1e3 * statistics.median(times),
                                "p90_ms": 1e3 * times[int(0.9 * (len(times) - 1))],
                                "repeats": repeats})
    return records


# The warped settings next to a plain softmax (the floor any warp pays).
WARPS: dict[str, SamplingParams | None] = {
    "softmax": None, "temperature": SamplingParams(temperature=0.7), "top_p": SamplingParams(top_p=0.9),
    "top_k": SamplingParams(top_k=50)}


def _softmax_of(logits: Any) -> Callable[[], object]:
    if isinstance(logits, np.ndarray):
        def softmax() -> object:
            shifted = np.exp(logits - logits.max(-1, keepdims=True))
            return shifted / shifted.sum(-1, keepdims=True)
        return softmax
    import torch

    return lambda: torch.softmax(logits, dim=-1)


def bench_warp(*, batches: Iterable[int] = (1, 8, 64), rows: int = 5, vocab: int = 49152, spread: float = 3.0,
               libraries: Iterable[str] = ("numpy-float64", "numpy-float32", "torch-float32"),
               repeats: int = 30, check: bool = True,
               progress: Callable[[str], None] | None = None) -> list[dict[str, object]]:
    """Median wall time of one `warp` call (and of a plain softmax) for each setting.

    Args:
        batches, rows, vocab: the logits' shape [B, rows, V] (rows: the K+1 positions of a round).
        spread: standard deviation of the normal logits; next-token logits of small language
            models spread about 3, which keeps about 3% of the vocabulary at top_p = 0.9.
        libraries: "numpy-float64", "numpy-float32", "torch-float32", "torch-float64".
        repeats: timed calls per setting (after one warm-up).
        check: include input validation in the timing (on, as `warp` is called by default).
        progress: called with a label before each setting.

    Returns:
        One record per setting and warp in `WARPS`: library, batch, rows, vocab, spread, warp,
        check, median_ms, p90_ms, repeats, and the ratios of its median to the softmax's and
        to the temperature-only warp's (the warps are timed in turn within each repeat).
    """
    libraries = tuple(libraries)
    known = ("numpy-float64", "numpy-float32", "torch-float32", "torch-float64")
    if not libraries or any(library not in known for library in libraries):
        raise ValueError(f"libraries: expected some of {', '.join(known)}, got {list(libraries)}")
    records: list[dict[str, object]] = []
    for library in libraries:
        for batch in batches:
            if progress is not None:
                progress(f"{library} B={batch}")
            normal = np.random.default_rng(batch).normal(size=(batch, rows, vocab)) * spread
            logits = _logits(normal, library)  # [B, rows, V]
            calls = {name: _softmax_of(logits) if params is None else _warp_caller(logits, params, check)
                     for name, params in WARPS.items()}
            # Round-robin: each repeat times every warp once, so a slow spell of a shared
            # machine falls on all of them alike and their ratios stay side by side.
            times: dict[str, list[float]] = {name: [] for name in calls}
            for call in calls.values():
                call()  # warm-up
            for _ in range(repeats):
                for name, call in calls.items():
                    times[name] += timings(call, 1, warm_up=False)
            medians = {name: statistics.median(t) for name, t in times.items()}
            for name, spent in times.items():
                spent.sort()
                records.append({"library": library, "batch": batch, "rows": rows, "vocab": vocab,
                                "spread": spread, "warp": name, "check": check,
                                "median_ms": 1e3 * medians[name],
                                "p90_ms": 1e3 * spent[int(0.9 * (len(spent) - 1))], "repeats": repeats,
                                "vs_softmax": medians[name] / medians["softmax"],
                                "vs_temperature": medians[name] / medians["temperature"]})
    return records


def _logits(normal: np.ndarray, library: str) -> Any:
    numpy_dtype = np.float64 if library.endswith("float64") else np.float32
    if library.startswith("numpy"):
        return normal.astype(numpy_dtype)
    import torch

    return torch.from_numpy(normal.astype(numpy_dtype))


def _warp_caller(logits: Any, params: SamplingParams, check: bool) -> Callable[[], object]:
    return lambda: warp(logits, params, check=check)
