"""Device check for Intel Gaudi: parity with the CPU float32 torch backend, the first-token law,
recompiles after warm-up, and a short benchmark, printed as one table.

Run (inside Intel's Gaudi PyTorch container, after `pip install -e .[hf]`):
    PT_HPU_LAZY_MODE=0 python -m specsample_backends.gaudi.check     # capture "compile"
    PT_HPU_LAZY_MODE=1 python -m specsample_backends.gaudi.check     # capture "hpu-graphs"

The capture follows the process's mode (`--capture` to force one; a mismatch is
an error). Exit status 0 when parity, the law test and the recompile count pass.

- parity: greedy speculative tokens on the device against plain greedy decoding of
  the same target on CPU in float32; a first difference where the CPU target's two
  best logits are within `TIE_GAP` is a near-tie (float sums in another order),
  any other difference fails.
- law: n first tokens sampled at temperature 1 on the device (`--n`, batches of
  `--rows`), tested against the CPU float32 target's exact law on its 7 likeliest
  tokens and the rest (`specsample.testing.goodness_of_fit`, the test `specsample
  check` runs; its false-alarm bound and the smallest TV it detects are printed).
- recompiles: Dynamo graphs and (where the bridge reports them) device graph
  compilations during a second pass over new prompts and sampling settings.
- tokens/s (greedy, median of `--repeats`): this engine, optimum-habana's (or,
  without it, transformers') `generate(assistant_model=...)` with the same
  early-exit draft, and plain `generate` of the target.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from specsample_backends.static.backend import StaticBackend
from specsample_backends.torch.early_exit import early_exit_module
from torch._dynamo.utils import counters

from specsample.api.registry import get_backend
from specsample.core.params import SamplingParams
from specsample.core.warp import warp
from specsample.engine.generate import generate_plain
from specsample.engine.options import RunOptions
from specsample.testing import FitResult, goodness_of_fit

from . import HpuGraphCapture
from .mode import LAZY_VAR, lazy_mode

PROMPTS = ("Write a short poem about the sea.", "Explain what a hash table is.",
           "List three uses of Python.", "What is the capital of France?")
AGAIN = ("Name a colour.", "Why is the sky blue?")
LAW_PROMPT = "The best thing about summer is"
TIE_GAP = 1e-3  # logits
BINS = 8  # the 7 likeliest first tokens and the rest
WIDTH = 40  # the table's first column


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specsample_backends.gaudi.check")
    parser.add_argument("--capture", choices=("auto", "compile", "hpu-graphs"), default="auto",
                        help=f"auto: 'hpu-graphs' when {LAZY_VAR}=1, else 'compile'")
    parser.add_argument("--target", default="smollm2", help="model spec (a Llama architecture)")
    parser.add_argument("--drafter", default="early-exit:8")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", default="hpu")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--new", type=int, default=32, help="new tokens per prompt")
    parser.add_argument("--n", type=int, default=2000, help="first-token samples for the law test")
    parser.add_argument("--rows", type=int, default=250, help="rows per batch of the law test")
    parser.add_argument("--alpha", type=float, default=1e-3, help="false-failure rate of the law test")
    parser.add_argument("--repeats", type=int, default=3)
    return parser


def _chat(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer(tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True))["input_ids"]
    return ids


def _sync(device: torch.device) -> None:
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and callable(getattr(module, "synchronize", None)):
        module.synchronize()  # type: ignore[union-attr]


def _compilations() -> int | None:
    """Device graph compilations so far, where the bridge reports them (else None)."""
    try:
        metrics = importlib.import_module("habana_frameworks.torch.hpu.metrics")
        stats = dict(metrics.metric_global("graph_compilation").stats())
    except (ImportError, AttributeError, RuntimeError):
        return None
    return int(stats.get("TotalNumber", 0))


def _next_logits(model: Any, ids: list[int]) -> torch.Tensor:
    """The CPU model's logits [V] (float64) after `ids`."""
    prompt = torch.tensor([ids])
    logits, _ = model.forward(prompt, model.new_cache(1, len(ids) + 1))
    return logits[0, -1].double()  # type: ignore[no-any-return]


def parity(engine: Callable[..., Any], cpu: Any, prompts: list[list[int]], new: int) -> tuple[int, int, int]:
    """(equal, near-ties, other differences) of greedy engine tokens against CPU plain greedy."""
    equal = ties = other = 0
    greedy = SamplingParams(temperature=0)
    for ids in prompts:
        got = engine(ids, max_new_tokens=new, params=greedy, seed=0)
        want = generate_plain(cpu, torch.tensor([ids]), max_new_tokens=new, params=greedy).new_tokens(0)
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
        if first is None:
            equal += 1
            continue
        top = _next_logits(cpu, ids + want[:first]).topk(2).values.tolist()
        ties, other = (ties + 1, other) if top[0] - top[1] < TIE_GAP else (ties, other + 1)
    return equal, ties, other


def law(sample: Callable[[int, int], np.ndarray], cpu: Any, ids: list[int], *, n: int, rows: int,
        alpha: float) -> FitResult:
    """Goodness of fit of n first tokens `sample(rows, seed)` to the CPU target's exact law at T=1."""
    exact = warp(_next_logits(cpu, ids), SamplingParams(temperature=1.0)).numpy()
    top = np.argsort(-exact, kind="stable")[: BINS - 1]
    expected = np.append(exact[top], max(0.0, 1.0 - float(exact[top].sum())))
    tokens = np.concatenate([sample(rows, seed) for seed in range(-(-n // rows))])[:n]
    where = {int(t): i for i, t in enumerate(top)}
    projected = np.array([where.get(int(t), BINS - 1) for t in tokens])
    return goodness_of_fit(projected, expected / expected.sum(), alpha=alpha)


def rate(run: Callable[[], int], device: torch.device, repeats: int) -> float:
    """Median tokens/s of `run` (which returns how many new tokens it made)."""
    rates = []
    for _ in range(repeats):
        _sync(device)
        began = time.perf_counter()
        made = run()
        _sync(device)
        rates.append(made / (time.perf_counter() - began))
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> int:
    """Run the check and print its table; exit status 1 when a check fails."""
    args = _parser().parse_args(argv)
    capture = args.capture if args.capture != "auto" else ("hpu-graphs" if lazy_mode() else "compile")
    backend = get_backend("gaudi", {"capture": capture, "dtype": args.dtype, "device": args.device,
                                    "buckets": [256]})
    assert isinstance(backend, StaticBackend)  # the registry's "gaudi" entry builds one
    target = backend.load_target(args.target)
    drafter = backend.load_drafter(args.drafter, target)
    tokenizer = backend.tokenizer(args.target)
    cpu = get_backend("torch", {"device": "cpu", "dtype": "float32"}).load_target(args.target)
    prompts = [_chat(tokenizer, p) for p in PROMPTS]
    run = dict(k=args.k, eos_token_id=None)

    def engine(ids: list[int], **kwargs: Any) -> list[int]:
        out = backend.generate(target, drafter, backend.asarray([ids]), RunOptions(**run, **kwargs))
        tokens: list[int] = out.new_tokens(0)
        return tokens

    def sample(rows: int, seed: int) -> np.ndarray:
        ids = backend.asarray([tokenizer(LAW_PROMPT)["input_ids"]] * rows)
        out = backend.generate(target, drafter, ids, RunOptions(
            max_new_tokens=1, seed=seed, **run, params=SamplingParams(temperature=1.0)))
        return np.asarray(out.sequences[:, ids.shape[1]].cpu())

    equal, ties, other = parity(engine, cpu, prompts, args.new)
    fit = law(sample, cpu, tokenizer(LAW_PROMPT)["input_ids"], n=args.n, rows=args.rows,
              alpha=args.alpha)
    graphs, compiled = counters["stats"]["unique_graphs"], _compilations()
    parity(engine, cpu, [_chat(tokenizer, p) for p in AGAIN], args.new)  # warm shapes, new tokens
    engine(prompts[0], max_new_tokens=args.new, seed=1, params=SamplingParams(temperature=0.7, top_p=0.9))
    recompiles = counters["stats"]["unique_graphs"] - graphs
    device_recompiles = None if compiled is None else (_compilations() or 0) - compiled
    rates = bench(args, backend, target, prompts)
    ok = other == 0 and fit.passed and recompiles == 0 and not device_recompiles
    print(f"\ngaudi check: capture {capture} ({LAZY_VAR}={int(lazy_mode())}), {args.dtype}, "
          f"{args.target}, {args.drafter}, K={args.k}, {args.new} new tokens, device {backend.device}")
    rows = [("parity: greedy = CPU float32", f"{equal}/{len(prompts)} equal, {ties} near-ties "
                                             f"(top-2 gap < {TIE_GAP}), {other} other"),
            (f"law: first token, n={fit.n}", f"{'PASS' if fit.passed else 'FAIL'} TV {fit.tv:.3f} "
                                            f"<= {fit.tau:.3f}, detects >= {fit.detectable_tv:.3f}, "
                                            f"G p={fit.pvalue:.3g}"),
            ("recompiles after warm-up", f"{recompiles} Dynamo graphs, "
                                         f"{'n/a' if device_recompiles is None else device_recompiles}"
                                         f" device compilations")]
    rows += [(f"tokens/s {name}", value) for name, value in rates.items()]
    for name, value in rows:
        print(f"{name:<{WIDTH}}{value}")
    print("RESULT:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def _optimum() -> bool:
    try:
        importlib.import_module("optimum.habana.transformers.modeling_utils")
    except ImportError:
        return False
    return True


def bench(args: argparse.Namespace, backend: Any, target: Any, prompts: list[list[int]]) -> dict[str, str]:
    """Tokens/s (greedy) of this engine, assisted generation and plain generate, as table cells.

    With optimum-habana in lazy mode its baselines run as its text-generation example
    does: the models wrapped in HPU graphs, `generate(..., lazy_mode=True, hpu_graphs=True)`.
    """
    drafter = backend.load_drafter(args.drafter, target)
    greedy = dict(max_new_tokens=args.new, k=args.k, params=SamplingParams(temperature=0))
    ids = [backend.asarray([p]) for p in prompts]
    lazy, optimum = isinstance(backend.capture, HpuGraphCapture), _optimum()
    module = copy.copy(target.module)
    assistant = (early_exit_module(module, int(args.drafter.split(":")[1]))
                 if args.drafter.startswith("early-exit:") else None)
    extra: dict[str, Any] = {}
    if optimum and lazy:
        module = backend.capture.hpu.wrap_in_hpu_graph(module)
        assistant = None if assistant is None else backend.capture.hpu.wrap_in_hpu_graph(assistant)
        extra = {"lazy_mode": True, "hpu_graphs": True}
    hf = dict(do_sample=False, max_new_tokens=args.new, min_new_tokens=args.new, **extra)
    label = "optimum-habana" if optimum else "transformers"

    def hf_run(**kwargs: Any) -> int:
        return sum(int(module.generate(p, attention_mask=torch.ones_like(p), **hf, **kwargs).shape[1]
                       - p.shape[1]) for p in ids)

    runs: dict[str, Callable[[], int]] = {
        f"this engine ({'hpu-graphs' if lazy else 'compile'})": lambda: sum(
            len(backend.generate(target, drafter, p, RunOptions(**greedy)).new_tokens(0)) for p in ids)}
    if assistant is not None:
        runs[f"{label} assisted"] = lambda: hf_run(assistant_model=assistant)
    runs[f"{label} plain generate"] = hf_run
    cells = {}
    for name, run in runs.items():
        try:
            run()  # warm-up
            cells[name] = f"{rate(run, backend.device, args.repeats):.1f}"
        except Exception as err:  # a baseline that fails on this stack is reported, not fatal
            cells[name] = f"failed: {type(err).__name__}: {str(err)[:60]}"
    return cells


if __name__ == "__main__":
    sys.exit(main())
