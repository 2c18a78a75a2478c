"""`batch` (ragged rows against batch 1) and `memory` (resident memory over a long generation)."""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Sequence
from typing import Any

from specsample._array import check_int
from specsample.api.runner import Runner, encode_text
from specsample.bench.progress import NO_PROGRESS, Progress
from specsample.bench.prompts import BATCH_PROMPTS, MEMORY_PROMPT
from specsample.bench.stats import merge_metrics
from specsample.core.params import SamplingParams

__all__ = ["MEMORY_GROWTH_MIB", "batch", "memory", "rss_mib"]

MEMORY_GROWTH_MIB = 64  # growth after warm-up beyond this fails `bench memory`


def rss_mib() -> float:
    """The resident set size of this process now, in MiB (Linux /proc; NaN elsewhere)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def batch(runner: Runner, *, max_new_tokens: int = 64, prompts: Sequence[str] = BATCH_PROMPTS,
          sizes: Sequence[int] = (1, 2, 8, 32), repeats: int = 3,
          progress: Progress = NO_PROGRESS) -> dict[str, Any]:
    """Greedy, speculative against plain decoding at each batch size in `sizes`.

    Batch size B holds the prompts in turn (B = 32 holds each of 8 prompts four times);
    B = 1 runs each prompt alone. Each size is warmed up at that size first (what a
    drafter measures once per batch size is measured there), then speculative and plain
    decoding run in turn, `repeats` times. Every run goes to the runner's backend engine
    (EOS off, so each row makes `max_new_tokens`). A batched row must equal its prompt
    alone (greedy).

    Returns:
        rows (prompts), rows_equal (batched rows equal to their prompt alone, over all sizes
        above 1 and repeats, out of `rows_compared`), max_new_tokens, k, repeats, and per
        size ("sizes"): batch, the median over repeats of the tokens/s of speculative and
        plain decoding and of their ratio (speedup_vs_plain, with every repeat's ratio in
        `speedups`), the acceptance rate and the rounds at each K (`k_counts`) over all
        repeats; plus throughput_ratio, the largest size's speculative tokens/s over batch 1's.
    """
    check_int("max_new_tokens", max_new_tokens, 1)
    check_int("repeats", repeats, 1)
    if isinstance(prompts, str) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"prompts: expected a non-empty sequence of str, got {prompts!r}")
    if isinstance(sizes, (str, bytes)) or not sizes or len(set(sizes)) != len(sizes):
        raise ValueError(f"sizes: expected distinct batch sizes >= 1, got {sizes!r}")
    for size in sizes:
        check_int("sizes", size, 1)
    rows = [encode_text(runner.tokenizer, p) for p in prompts]
    kw: dict[str, Any] = {"max_new_tokens": max_new_tokens, "params": SamplingParams(temperature=0),
                          "eos_token_id": None}
    progress.stage("batch sizes: speculative and plain",
                   2 * repeats * sum(len(rows) if b == 1 else 1 for b in sizes), "run")
    alone: list[list[int]] = []
    equal = compared = 0
    records: list[dict[str, Any]] = []
    for size in sorted(sizes):
        chunks = [[r] for r in rows] if size == 1 else [[rows[i % len(rows)] for i in range(size)]]
        runner.prepare(size)  # the verify's costs at this size, measured before any timed run
        runner.generate(chunks[0], **{**kw, "max_new_tokens": 4})  # warm-up at this size
        runner.generate_plain(chunks[0], **{**kw, "max_new_tokens": 4})
        rates: dict[str, list[float]] = {"spec": [], "plain": []}
        metrics = []
        tokens = sum(len(c) for c in chunks) * max_new_tokens
        for rep in range(repeats):
            seconds = {"spec": 0.0, "plain": 0.0}
            for chunk in chunks:
                began = time.perf_counter()
                out = runner.generate(chunk, **kw)
                seconds["spec"] += time.perf_counter() - began
                progress.advance(1)
                began = time.perf_counter()
                runner.generate_plain(chunk, **kw)
                seconds["plain"] += time.perf_counter() - began
                progress.advance(1)
                metrics.append(out.metrics.as_dict())
                if size == 1 and rep == 0:
                    alone.append(out.new_tokens(0))
                elif size > 1 and alone:
                    compared += len(chunk)
                    equal += sum(out.new_tokens(i) == alone[i % len(rows)] for i in range(len(chunk)))
            for name, spent in seconds.items():
                rates[name].append(tokens / spent)
        merged = merge_metrics(metrics)
        speedups = [s / p for s, p in zip(rates["spec"], rates["plain"], strict=True)]
        records.append({"batch": size, "tokens_per_s": statistics.median(rates["spec"]),
                        "tokens_per_s_plain": statistics.median(rates["plain"]),
                        "speedup_vs_plain": statistics.median(speedups), "speedups": speedups,
                        "acceptance_rate": merged.acceptance_rate, "k_counts": list(merged.k_counts)})
    progress.end()
    return {"rows": len(rows), "rows_equal": equal, "rows_compared": compared,
            "max_new_tokens": max_new_tokens, "k": runner.config.k, "repeats": repeats, "sizes": records,
            "throughput_ratio": records[-1]["tokens_per_s"] / records[0]["tokens_per_s"]}


def memory(runner: Runner, *, max_new_tokens: int = 4000, prompt: str = MEMORY_PROMPT, every: int = 25,
           progress: Progress = NO_PROGRESS) -> dict[str, Any]:
    """One long generation on the runner's backend engine (EOS off); resident memory every `every` rounds.

    Returns:
        A record: tokens, seconds, RSS after warm-up (min, max, growth), peak and samples.
    """
    check_int("max_new_tokens", max_new_tokens, 1)
    check_int("every", every, 1)
    config = runner.config
    samples: list[tuple[int, float]] = []
    progress.stage("long generation", max_new_tokens, "tok")
    made = 0
    began = time.perf_counter()
    steps = runner.iterate([prompt], max_new_tokens=max_new_tokens, eos_token_id=None)
    for step in steps:
        emitted = int(step.result.emitted.sum())
        made += emitted
        progress.advance(emitted)
        if step.index % every == 0:
            samples.append((made, rss_mib()))
    progress.end()
    samples.append((made, rss_mib()))
    after_warmup = [m for t, m in samples if t >= min(200, max_new_tokens // 10)]
    growth = max(after_warmup) - min(after_warmup)
    return {"tokens": made, "seconds": time.perf_counter() - began, "rss_mib_first": samples[0][1],
            "rss_mib_min_after_warmup": min(after_warmup), "rss_mib_max_after_warmup": max(after_warmup),
            "growth_mib": growth, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "samples": samples, "temperature": config.temperature, "k": config.k, "seed": config.seed}
