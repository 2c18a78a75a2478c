"""`specsample demo --toy`: speculative sampling on toy models whose law is known exactly."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from tqdm import tqdm

from specsample.config import Config
from specsample.generate import iterate
from specsample.registry import get_backend
from specsample.testing import autoregressive_law, goodness_of_fit


def add_parser(sub: Any) -> None:
    """Register the `demo` subcommand."""
    parser = sub.add_parser("demo", help="generate, report acceptance and check the law, live")
    parser.add_argument("--toy", action="store_true",
                        help="the reference backend's n-gram models instead of the real model")
    parser.add_argument("--rows", type=int, default=100_000, help="rows for the law check (toy)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch: the toy demo here, the real-model demo in the model CLI."""
    if not args.toy:
        from specsample.cli import _models

        return _models.demo(args)
    return toy_demo(rows=args.rows, k=args.k, seed=args.seed)


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
    bar = tqdm(total=rows * 12, unit="tok", unit_scale=True, desc="speculative sampling")
    last = None
    for step in iterate(target, drafter, prompt, max_new_tokens=12, k=config.policy(),
                        params=config.params(), seed=config.seed):
        bar.update(int(step.result.emitted.sum()))
        last = step
    bar.close()
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
