"""Device check for a CUDA GPU: parity with the eager torch backend, then a short benchmark.

Install (once, in a fresh environment with a CUDA build of torch):
    pip install -e .[hf]
Run:
    python -m specsample_backends.cuda.check

Prints, last, a table of tokens/s for `cuda` (CUDA graphs), the torch eager
backend, and transformers' `generate(assistant_model=...)`. About 2-5 minutes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
from specsample_backends.static.backend import StaticBackend
from specsample_backends.torch.early_exit import early_exit_module
from transformers import GenerationMixin

from specsample.api.registry import get_backend
from specsample.core.params import SamplingParams
from specsample.engine.generate import generate
from specsample.engine.options import RunOptions

PROMPTS = ("Write a short poem about the sea.", "Explain what a hash table is.",
           "List three uses of Python.", "What is the capital of France?")


def _timed(run: Callable[[], int], repeats: int) -> float:
    """Median tokens/s of `run` (which returns the number of new tokens)."""
    rates = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        made = run()
        torch.cuda.synchronize()
        rates.append(made / (time.perf_counter() - began))
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> int:
    """Parity (tokens equal on the same uniforms) and tokens/s; exit status 1 on a parity failure."""
    parser = argparse.ArgumentParser(prog="python -m specsample_backends.cuda.check")
    parser.add_argument("--drafter", default="early-exit:8")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    cuda = get_backend("cuda", {"buckets": [256], "dtype": "float32"})
    assert isinstance(cuda, StaticBackend)  # the registry's "cuda" entry builds one
    target = cuda.load_target("smollm2")
    drafter = cuda.load_drafter(args.drafter, target)
    tok = cuda.tokenizer("smollm2")
    ids = [cuda.asarray([tok(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                     add_generation_prompt=True))["input_ids"]])
           for p in PROMPTS]
    differ = 0
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_p=0.9)):
        for seed, prompt in enumerate(ids):
            run = dict(max_new_tokens=args.new, k=args.k, params=params, seed=seed)
            same = cuda.generate(target, drafter, prompt, RunOptions(**run)).new_tokens(0) == \
                generate(target, drafter, prompt, **run).new_tokens(0)
            differ += not same
            print(f"parity {params.temperature=} prompt {seed}: {'same' if same else 'DIFFERENT'}")
    greedy = dict(max_new_tokens=args.new, k=args.k, params=SamplingParams(temperature=0))
    rows: dict[str, Callable[[], int]] = {"cuda (CUDA graphs)": lambda: sum(
                len(cuda.generate(target, drafter, p, RunOptions(**greedy)).new_tokens(0)) for p in ids),
            "torch eager": lambda: sum(
                len(generate(target, drafter, p, **greedy).new_tokens(0)) for p in ids)}
    draft_module = _hf_assistant(target, args.drafter)
    hf_target = target.module
    assert isinstance(hf_target, GenerationMixin)  # a transformers causal LM (load_target)
    if draft_module is not None:
        rows["transformers assisted"] = lambda: sum(int(hf_target.generate(
            p, assistant_model=draft_module, do_sample=False, max_new_tokens=args.new,
            min_new_tokens=args.new).shape[1] - p.shape[1]) for p in ids)
    rates = {name: _timed(run, args.repeats) for name, run in rows.items()}
    print(f"\n{'engine':<24}{'tokens/s':>10}   (SmolLM2-135M, greedy, {args.drafter}, K={args.k}, "
          f"{torch.cuda.get_device_name()})")
    for name, rate in rates.items():
        print(f"{name:<24}{rate:>10.1f}")
    print(f"parity: {2 * len(ids) - differ}/{2 * len(ids)} runs token-identical")
    return 1 if differ > len(ids) else 0


def _hf_assistant(target: object, drafter: str) -> object | None:
    """A transformers assistant: the target's first N layers as a model (early-exit only)."""
    if not drafter.startswith("early-exit:"):
        return None
    module: object = early_exit_module(target.module, int(drafter.split(":")[1]))  # type: ignore[attr-defined]
    return module


if __name__ == "__main__":
    sys.exit(main())
