"""`specsample generate`: speculative sampling on a real model, row 0 streamed as text."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from specsample.api.runner import Runner, load
from specsample.bench import measure_cost_ratio
from specsample.cli.options import add_model_options, config_from_args
from specsample.core.metrics import Metrics
from specsample.engine.runs import Step

__all__ = ["add_parser", "generate_text"]


def add_parser(sub: Any) -> None:
    """Register the `generate` subcommand."""
    parser = sub.add_parser("generate", help="speculative sampling on a real model, streamed")
    parser.add_argument("--prompt", action="append", required=True,
                        help="a user message (repeat for a ragged batch)")
    parser.add_argument("--explain", action="store_true",
                        help="first print how the drafter was chosen: for auto, a table of the "
                             "candidates with their measured costs, priors and predicted speeds")
    add_model_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """`specsample generate`: stream one prompt, or run several as one ragged batch."""
    max_new = 128 if args.max_new_tokens is None else args.max_new_tokens
    if max_new < 1:
        raise ValueError(f"--max-new-tokens: expected >= 1, got {max_new}")
    runner = load(config_from_args(args))
    if args.explain and os.environ.get("RANK", "0") == "0":
        print("\n".join(runner.explain()))
    if os.environ.get("RANK", "0") != "0":  # a torchrun launch: rank 0 prints, the others compute
        with contextlib.redirect_stdout(io.StringIO()):
            return generate_text(runner, args.prompt, max_new, stream=False)
    return generate_text(runner, args.prompt, max_new, stream=len(args.prompt) == 1)


def _stream(steps: Iterator[Step], tokenizer: Any, prompt_length: int) -> Step:
    """Print row 0's text as rounds commit it; returns the last step."""
    printed, text, last = "", "", None
    for step in steps:
        ids = [int(t) for t in step.state.tokens[0, prompt_length:int(step.state.lengths[0])]]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if text.startswith(printed) and not text.endswith("\ufffd"):  # wait out partial bytes
            print(text[len(printed):], end="", flush=True)
            printed = text
        last = step
    print(text[len(printed):] if text.startswith(printed) else "")
    assert last is not None  # max_new_tokens >= 1: at least one round
    return last


def _print_metrics(m: Metrics, *, seconds: float, c: float) -> None:
    print(f"acceptance rate {m.acceptance_rate:.3f}, alpha {m.alpha:.3f}, tokens/round "
          f"{m.mean_tokens_per_round:.2f}, rounds {m.rounds}, mean K {m.mean_k:.2f}")
    print(f"{m.emitted} tokens in {seconds:.2f} s: {m.emitted / seconds:.1f} tokens/s; "
          f"measured c = {c:.3f}; predicted speedup (Thm 3.8) {m.predicted_speedup(c):.2f}x")


def _settings(runner: Runner, max_new: int) -> str:
    config, target = runner.config, runner.target
    where = "".join(f"{n} {getattr(target, n)}, " for n in ("device", "dtype") if hasattr(target, n))
    explained = runner.explain()  # auto: a heading over its table; else the drafter in words
    drafter = f"{explained[0].rstrip(':')} (--explain: why)" if len(explained) > 1 else explained[0]
    return (f"settings: backend {config.backend}, target {config.target or 'default'}, {where}"
            f"{drafter}, "
            f"K={config.k}, {config.params()}, "
            f"seed {config.seed}, max new tokens {max_new}")


def generate_text(runner: Runner, prompts: Sequence[str], max_new: int, *, stream: bool) -> int:
    """Generate for `prompts` as one batch; stream row 0 if asked, print the other rows after."""
    config, tokenizer = runner.config, runner.tokenizer
    ids, lengths = runner.encode(list(prompts))
    rows = [int(n) for n in lengths]
    c = measure_cost_ratio(runner.target, runner.drafter, ids[:1, :rows[0]], config.params())
    if len(rows) > 1:  # measured now, not as pauses inside the timed generation
        print(f"(measuring the verify's cost at {len(rows)} rows, once...)", flush=True)
        runner.prepare(len(rows))
    steps = runner.iterate(ids, max_new_tokens=max_new, k=config.policy(measured_c=c), prompt_lengths=lengths)
    began = time.perf_counter()
    if stream:
        print(f"> {prompts[0]}")
        last = _stream(steps, tokenizer, rows[0])
    else:
        *_, last = steps
    seconds = time.perf_counter() - began
    for i in range(1 if stream else 0, len(rows)):
        new = [int(t) for t in last.state.tokens[i, rows[i]:int(last.state.lengths[i])]]
        print(f"> {prompts[i]}\n{tokenizer.decode(new, skip_special_tokens=True)}\n")
    _print_metrics(last.metrics, seconds=seconds, c=c)
    print(_settings(runner, max_new))
    return 0
