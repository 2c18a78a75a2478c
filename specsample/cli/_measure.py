"""`specsample bench batch|memory`: ragged batches against batch 1, and memory over long runs."""

from __future__ import annotations

import argparse
import resource
import time
from typing import Any

from tqdm import tqdm

from specsample.cli._bench import machine, write_json
from specsample.generate import generate, iterate
from specsample.params import SamplingParams

BATCH_PROMPTS = [
    "Write a haiku about the sea.",
    "Rewrite this sentence in the passive voice: The committee approved the new budget after a long debate.",
    "What is 17 times 23? Explain step by step.",
    "List three uses of copper.",
    "Summarise: Photosynthesis converts light energy into chemical energy stored in glucose, "
    "releasing oxygen as a by-product. It takes place mainly in the chloroplasts of leaf cells.",
    "Translate to French: Good morning, how are you today?",
    "def add(a, b):\n    return a + b\n\nAdd type hints and a docstring to this function.",
    "Why is the sky blue?",
]


def _rss_mib() -> float:
    """The resident set size of this process now, in MiB (Linux /proc)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _chat(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def batch(args: argparse.Namespace, loaded: tuple[Any, ...]) -> int:
    """Greedy batch of 8 ragged prompts vs each prompt alone: equal rows, throughput ratio."""
    config, backend, target, drafter, tokenizer = loaded
    prompts = [_chat(tokenizer, p) for p in BATCH_PROMPTS]
    width = max(map(len, prompts))
    ids = backend.asarray([p + [0] * (width - len(p)) for p in prompts])
    lengths = backend.asarray([len(p) for p in prompts])
    greedy = SamplingParams(temperature=0)
    n = args.max_new_tokens
    kw: dict[str, Any] = {"max_new_tokens": n, "params": greedy, "k": config.policy(), "seed": config.seed}
    generate(target, drafter, ids[:1, : len(prompts[0])], **{**kw, "max_new_tokens": 4})  # warm-up
    bar = tqdm(total=len(prompts) + 1, desc="batch vs batch 1")
    began = time.perf_counter()
    together = generate(target, drafter, ids, prompt_lengths=lengths, **kw)
    t_batch = time.perf_counter() - began
    bar.update(1)
    alone, t_alone, equal = [], 0.0, 0
    for row, prompt in enumerate(prompts):
        began = time.perf_counter()
        out = generate(target, drafter, backend.asarray([prompt]), **kw)
        t_alone += time.perf_counter() - began
        alone.append(out.new_tokens(0))
        equal += int(out.new_tokens(0) == together.new_tokens(row))
        bar.update(1)
    bar.close()
    tokens = len(prompts) * n
    record = {"rows": len(prompts), "rows_equal": equal, "max_new_tokens": n,
              "tokens_per_s_batch": tokens / t_batch, "tokens_per_s_batch1": tokens / t_alone,
              "throughput_ratio": t_alone / t_batch, "acceptance_rate": together.metrics.acceptance_rate,
              "histogram": list(together.metrics.histogram), "draft": args.draft, "k": config.k}
    print(f"greedy, {len(prompts)} ragged prompts x {n} tokens: rows equal to batch 1: "
          f"{equal}/{len(prompts)}; batch {record['tokens_per_s_batch']:.1f} tok/s vs batch 1 "
          f"{record['tokens_per_s_batch1']:.1f} tok/s = {record['throughput_ratio']:.2f}x")
    write_json(args.json, {"benchmark": "batch", "machine": machine(), "records": [record]})
    return 0 if equal == len(prompts) else 1


def memory(args: argparse.Namespace, loaded: tuple[Any, ...]) -> int:
    """A long generation: resident memory sampled every few rounds stays flat once caches exist."""
    config, backend, target, drafter, tokenizer = loaded
    n = args.max_new_tokens
    prompt = backend.asarray([_chat(tokenizer, "Tell me a very long story about a lighthouse keeper.")])
    samples: list[tuple[int, float]] = []
    bar = tqdm(total=n, desc="long generation", unit="tok")
    made = 0
    began = time.perf_counter()
    for step in iterate(target, drafter, prompt, max_new_tokens=n, params=config.params(),
                        k=config.policy(), seed=config.seed, eos_token_id=None):
        emitted = int(step.result.emitted.sum())
        made += emitted
        bar.update(emitted)
        if step.index % 25 == 0:
            samples.append((made, _rss_mib()))
    bar.close()
    samples.append((made, _rss_mib()))
    after_warmup = [m for t, m in samples if t >= min(200, n // 10)]
    growth = max(after_warmup) - min(after_warmup)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    record = {"tokens": made, "seconds": time.perf_counter() - began, "rss_mib_first": samples[0][1],
              "rss_mib_min_after_warmup": min(after_warmup), "rss_mib_max_after_warmup": max(after_warmup),
              "growth_mib": growth, "peak_rss_mib": peak, "samples": samples}
    print(f"{made} tokens: resident memory after warm-up {min(after_warmup):.0f}-{max(after_warmup):.0f} MiB "
          f"(growth {growth:.1f} MiB), peak {peak:.0f} MiB")
    write_json(args.json, {"benchmark": "memory", "machine": machine(), "records": [record]})
    return 0 if growth < 64 else 1


