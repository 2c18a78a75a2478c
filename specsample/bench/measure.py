"""`batch` (ragged rows against batch 1) and `memory` (resident memory over a long generation)."""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence
from typing import Any

from specsample._array import check_int
from specsample.bench.progress import NO_PROGRESS, Progress
from specsample.bench.prompts import BATCH_PROMPTS, MEMORY_PROMPT
from specsample.params import SamplingParams
from specsample.runner import Runner, encode_text

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
          progress: Progress = NO_PROGRESS) -> dict[str, Any]:
    """Greedy: `prompts` as one ragged batch, plain decoding of the same batch, then each alone.

    Every run goes to the runner's backend engine (EOS off, so each row makes `max_new_tokens`).

    Returns:
        A record: rows, rows_equal, tokens/s of the speculative batch, of plain decoding at
        the same batch size and of batch 1; throughput_ratio (batch over batch 1),
        speedup_vs_plain (speculative over plain at the same batch size), acceptance.
    """
    check_int("max_new_tokens", max_new_tokens, 1)
    if isinstance(prompts, str) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"prompts: expected a non-empty sequence of str, got {prompts!r}")
    rows = [encode_text(runner.tokenizer, p) for p in prompts]
    kw: dict[str, Any] = {"max_new_tokens": max_new_tokens, "params": SamplingParams(temperature=0),
                          "eos_token_id": None}
    runner.generate(rows[:1], **{**kw, "max_new_tokens": 4})  # warm-up
    runner.generate_plain(rows[:1], **{**kw, "max_new_tokens": 4})
    progress.stage("batch vs plain and batch 1", len(rows) + 2, "run")
    began = time.perf_counter()
    together = runner.generate(rows, **kw)
    t_batch = time.perf_counter() - began
    progress.advance(1)
    began = time.perf_counter()
    runner.generate_plain(rows, **kw)
    t_plain = time.perf_counter() - began
    progress.advance(1)
    t_alone, equal = 0.0, 0
    for row, prompt in enumerate(rows):
        began = time.perf_counter()
        out = runner.generate([prompt], **kw)
        t_alone += time.perf_counter() - began
        equal += int(out.new_tokens(0) == together.new_tokens(row))
        progress.advance(1)
    progress.end()
    tokens = len(rows) * max_new_tokens
    return {"rows": len(rows), "rows_equal": equal, "max_new_tokens": max_new_tokens,
            "tokens_per_s_batch": tokens / t_batch, "tokens_per_s_batch1": tokens / t_alone,
            "tokens_per_s_plain_batch": tokens / t_plain, "speedup_vs_plain": t_plain / t_batch,
            "throughput_ratio": t_alone / t_batch, "acceptance_rate": together.metrics.acceptance_rate,
            "histogram": list(together.metrics.histogram), "k": runner.config.k}


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
