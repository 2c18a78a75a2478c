"""`specsample demo`: SmolLM2 with the default drafter, or (--toy) toy models whose law is known."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

import specsample
from specsample import bench
from specsample.api.config import AUTO_K, Config
from specsample.api.registry import get_backend
from specsample.cli._bench import show_models
from specsample.cli._generate import generate_text
from specsample.cli._progress import Bars
from specsample.cli.options import DEFAULT_DRAFT, DEFAULT_TARGET, load_config
from specsample.engine.generate import iterate
from specsample.testing import autoregressive_law, goodness_of_fit

__all__ = ["STREAMED", "add_parser", "demo_config", "model_demo", "toy_demo"]

ROWS = 100_000
# `auto` narrows each round to the width Thm 3.8 predicts fastest (a power of two up to K, or
# a plain step), so K only caps long copies; the toy's noisy draft verifies a fixed K.
MODEL_K, TOY_K = AUTO_K, 3
# The streamed example: an open-ended prompt and a grounded one, as one ragged batch.
STREAMED = (bench.PROMPTS[0][1], bench.PROMPTS[2][1])


def add_parser(sub: Any) -> None:
    """Register the `demo` subcommand."""
    parser = sub.add_parser("demo", help="generate, report acceptance and check the law, live")
    parser.add_argument("--toy", action="store_true",
                        help="the reference backend's n-gram models instead of the real model")
    parser.add_argument("--rows", type=int, default=None,
                        help=f"rows for the law check (toy; default {ROWS})")
    parser.add_argument("--k", type=int, default=None,
                        help=f"the most drafts a round verifies (default {MODEL_K}; --toy: {TOY_K})")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The toy demo, or the real-model demo."""
    if args.toy:
        return toy_demo(rows=ROWS if args.rows is None else args.rows, k=TOY_K if args.k is None else args.k,
                        seed=args.seed)
    if args.rows is not None:
        raise ValueError(f"--rows: only the toy demo checks a law over rows (add --toy), got {args.rows}")
    return model_demo(k=MODEL_K if args.k is None else args.k, seed=args.seed)


def model_demo(*, k: int, seed: int) -> int:
    """The README's first command: SmolLM2-135M with the default drafter, then a short bench."""
    print(f"specsample demo: SmolLM2-135M-Instruct (target), drafter {DEFAULT_DRAFT!r} (prompt lookup, "
          f"and a model draft where Thm 3.8 predicts a speedup: the shipped draft head or the int8 "
          f"copy, whichever rates faster here), K={k}; loading...")
    runner = specsample.load(demo_config(k=k, seed=seed))
    print("\n".join(runner.explain()))
    print("\ntwo prompts as one ragged batch, T=0.7 (the first streamed):")
    generate_text(runner, list(STREAMED), 48, stream=True)
    print("\nshort benchmark: 2 prompts, 1 repeat, 32 tokens, greedy and T=0.7")
    plan = bench.ModelsPlan(prompts=2, repeats=1, max_new_tokens=32)
    return show_models(runner, plan, path=Path("results/demo.json"))


def demo_config(*, k: int | str, seed: int) -> Config:
    """The real-model demo's Config: the default drafter on the embedded target at T=0.7,
    under the environment and a config file as any command."""
    return load_config(None, {"k": k, "seed": seed, "temperature": 0.7, "target": DEFAULT_TARGET})


def toy_demo(*, rows: int, k: int, seed: int) -> int:
    """Run the toy demo; 0 when the law check passes."""
    if rows < 1000:
        raise ValueError(f"--rows: expected >= 1000 for a meaningful check, got {rows}")
    config = Config(backend="reference", k=k, seed=seed)
    backend = get_backend(config.backend)
    target = backend.load_target("ngram:vocab=4,order=2,seed=3,concentration=0.6")
    drafter = backend.load_drafter("noisy:0.3", target)
    prompt = np.tile(np.array([1, 2]), (rows, 1))
    print(f"target: n-gram, V={target.vocab_size}, order 2; draft: the target mixed 30% with noise; "
          f"K={k}; {rows:,} independent rows, 12 new tokens each")
    bars = Bars()
    bars.stage("speculative sampling", rows * 12, "tok")
    last = None
    for step in iterate(target, drafter, prompt, max_new_tokens=12, k=config.policy(),
                        params=config.params(), seed=config.seed):
        bars.advance(int(step.result.emitted.sum()))
        last = step
    bars.end()
    assert last is not None
    m = last.metrics
    print(f"acceptance rate {m.acceptance_rate:.3f}, alpha {m.alpha:.3f}, "
          f"tokens per round {m.mean_tokens_per_round:.2f}, rounds {m.rounds}")
    print("accepted drafts per round:", " ".join(f"{n}:{c}" for n, c in enumerate(m.histogram)))
    print(f"predicted speedup (Thm 3.8) at c=0.1: {m.predicted_speedup(0.1):.2f}x")
    new = last.state.tokens[:, 2:5]
    samples = new[:, 0] * 16 + new[:, 1] * 4 + new[:, 2]
    exact = autoregressive_law(target.law, (1, 2), length=3, vocab_size=4)
    expected = np.zeros(64)
    for (a, b, c), prob in exact.items():
        expected[a * 16 + b * 4 + c] = float(prob)
    result = goodness_of_fit(samples, expected)
    print(f"law of the first 3 tokens vs the target's exact law: {result}")
    return 0 if result.passed else 1
