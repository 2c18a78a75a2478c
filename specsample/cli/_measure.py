"""`specsample bench batch|memory|greedy`: ragged batches against batch 1, memory over long runs,
and greedy speculative decoding against plain greedy decoding, token for token."""

from __future__ import annotations

import argparse
import resource
import time
from typing import Any

from tqdm import tqdm

from specsample.cli._bench import machine, write_json
from specsample.cli._models import next_logits
from specsample.generate import generate, generate_plain, iterate
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
    n = 64 if args.max_new_tokens is None else args.max_new_tokens
    if n < 1:
        raise ValueError(f"--max-new-tokens: expected >= 1, got {n}")
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
    n = 4000 if args.max_new_tokens is None else args.max_new_tokens
    if n < 1:
        raise ValueError(f"--max-new-tokens: expected >= 1, got {n}")
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


GREEDY_EXTRA = [
    "Describe the water cycle in four sentences.",
    "Write a limerick about a cat who loves cheese.",
    "Convert this list to JSON: name Alice, age 30, city Paris.",
    "Explain recursion to a beginner programmer, with a short Python example.",
    "What should I pack for a weekend hiking trip?",
]
TIE_GAP = 1e-3  # logits: a first difference where the plain top-2 gap is below this is a near-tie


def greedy_prompts() -> list[str]:
    """The bench's prompts, the batch prompts and a few more: 22 distinct user messages."""
    from specsample.cli._models import PROMPTS

    return list(dict.fromkeys([text for _, text in PROMPTS] + BATCH_PROMPTS + GREEDY_EXTRA))


def greedy_sizes(args: argparse.Namespace) -> tuple[int, int]:
    """(prompts, max new tokens) of `bench greedy`, checked (before any model loads)."""
    every = len(greedy_prompts())
    count = every if args.prompts is None else args.prompts
    n = 48 if args.max_new_tokens is None else args.max_new_tokens
    if not 1 <= count <= every:
        raise ValueError(f"--prompts: expected 1 to {every}, got {count}")
    if n < 1:
        raise ValueError(f"--max-new-tokens: expected >= 1, got {n}")
    return count, n


def _gap(target: Any, backend: Any, ids: list[int]) -> tuple[float, int, int]:
    """(top-1 minus top-2 logit, top-1 id, top-2 id) of the target's next token after `ids`."""
    top = next_logits(target, backend.asarray([ids])).double().topk(2)
    values, tokens = top.values.tolist(), top.indices.tolist()
    return values[0] - values[1], int(tokens[0]), int(tokens[1])


def greedy(args: argparse.Namespace, loaded: tuple[Any, ...]) -> int:
    """Greedy speculative vs plain greedy decoding on 22 prompts; a difference must be a near-tie.

    Speculative verification scores K+1 positions in one forward while plain decoding
    scores one: float32 sums in another order, so where the target's two best logits
    are within rounding of each other the argmax may flip. Each first difference is
    reported with the plain forward's top-2 gap and counted as a near-tie when the
    gap is below `TIE_GAP`; any other difference fails the command.
    """
    from specsample.cli._models import _runner

    config, backend, target, drafter, tokenizer = loaded
    count, n = greedy_sizes(args)
    prompts = greedy_prompts()[:count]
    greedy_params = SamplingParams(temperature=0)
    spec_run = _runner(backend, "generate", generate)
    records = []
    for text in tqdm(prompts, desc=f"greedy, {args.draft}", unit="prompt"):
        ids = _chat(tokenizer, text)
        prompt = backend.asarray([ids])
        plain = generate_plain(target, prompt, max_new_tokens=n, params=greedy_params,
                               seed=config.seed).new_tokens(0)
        spec = spec_run(target, drafter, prompt, max_new_tokens=n, params=greedy_params,
                        k=config.policy(), seed=config.seed, eos_token_id=None).new_tokens(0)
        first = next((i for i, (a, b) in enumerate(zip(plain, spec, strict=False)) if a != b),
                     None if len(plain) == len(spec) else min(len(plain), len(spec)))
        record: dict[str, Any] = {"prompt": text[:60], "tokens": len(plain), "equal": first is None,
                                  "first_difference": first}
        if first is not None:
            gap, best, second = _gap(target, backend, ids + plain[:first])
            record.update(top2_gap=gap, plain_token=plain[first] if first < len(plain) else None,
                          spec_token=spec[first] if first < len(spec) else None,
                          top2=[best, second], near_tie=gap < TIE_GAP)
        records.append(record)
    equal = sum(r["equal"] for r in records)
    ties = sum(bool(r.get("near_tie")) for r in records)
    other = len(records) - equal - ties
    print(f"greedy, draft {args.draft}, K={config.k}, {n} tokens: {equal}/{len(records)} prompts "
          f"equal token for token; {ties} near-tie differences (top-2 gap < {TIE_GAP}); "
          f"{other} other differences")
    for r in records:
        if not r["equal"]:
            print(f"  at token {r['first_difference']}: plain {r['plain_token']} vs spec "
                  f"{r['spec_token']}, top-2 gap {r['top2_gap']:.2e}: {r['prompt']!r}")
    write_json(args.json, {"benchmark": "greedy", "machine": machine(), "draft": args.draft,
                           "k": config.k, "backend": config.backend, "max_new_tokens": n,
                           "tie_gap": TIE_GAP, "equal": equal, "near_ties": ties, "other": other,
                           "records": records})
    return 0 if other == 0 else 1
