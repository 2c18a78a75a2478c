"""`specsample distill`: train a feature-level draft head from the target's own samples."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from specsample.api.config import Config
from specsample.cli._progress import Bars
from specsample.cli.options import DEFAULT_TARGET
from specsample.drafters.head import RECIPES, DistillPlan

# The recipe of the head shipped with the package.
SHIPPED_RECIPE = "v2"

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the `distill` subcommand."""
    parser = sub.add_parser("distill", help="train a draft head (EAGLE-style) for the target")
    parser.add_argument("--out", type=Path, default=None,
                        help="the head file (.safetensors; its card is written beside it); default "
                             "for the embedded target: where the shipped head lives")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default=SHIPPED_RECIPE,
                        help=f"the plan to start from (default {SHIPPED_RECIPE}, the shipped head's); "
                             f"the flags below override its fields")
    for field in dataclasses.fields(DistillPlan):
        kind = type(getattr(DistillPlan(), field.name))
        parser.add_argument(f"--{field.name.replace('_', '-')}", dest=f"plan_{field.name}", type=kind,
                            default=None, help="(" + ", ".join(f"{name} {getattr(recipe, field.name)!r}"
                                                               for name, recipe in RECIPES.items()) + ")")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="a folder that keeps the sampled data and the training state as the run "
                             "goes; a run given the folder of an interrupted one continues it")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --checkpoint (an error if the folder is missing)")
    parser.add_argument("--evaluate", action="store_true",
                        help="train nothing: measure the held-out fan-out hit rates and the held-out "
                             "table (alpha, acceptance per depth, tokens per round at T = 0 and 0.7) of "
                             "the head at --out and write them into its card")
    parser.add_argument("--target", default=None, help="the target (default: the embedded SmolLM2)")
    parser.add_argument("--device", default=None, help="backend option 'device' (e.g. cpu, cuda:0)")
    parser.add_argument("--dtype", default=None, help="backend option 'dtype' (e.g. float32)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Sample, train, evaluate on held-out prompts, save; print the card."""
    from specsample_backends.torch.distill import distill, evaluate_fan_out, evaluate_held_out
    from specsample_backends.torch.head_file import SHIPPED

    import specsample

    options = {n: getattr(args, n) for n in ("device", "dtype") if getattr(args, n) is not None}
    config = Config(backend="torch", target=args.target or DEFAULT_TARGET, draft="lookup",
                    options=options)
    chosen = {f.name: getattr(args, f"plan_{f.name}") for f in dataclasses.fields(DistillPlan)}
    plan = dataclasses.replace(RECIPES[args.recipe], **{k: v for k, v in chosen.items() if v is not None})
    runner = specsample.load(config)
    out = args.out
    if out is None:
        if config.target not in (None, "smollm2"):
            raise ValueError(f"--out: needed for target {config.target!r} (the default place is the "
                             f"embedded SmolLM2's head)")
        out = SHIPPED
    if args.evaluate:
        evaluate_fan_out(runner.target, runner.tokenizer, out)
        card = evaluate_held_out(runner.target, runner.tokenizer, out)
        print(json.dumps(card, indent=2, sort_keys=True))
        print(f"wrote {Path(out).with_suffix('.json')}")
        return 0
    bars, units = Bars("distill: "), {"sampling": "prompt", "sampling grounded": "prompt",
                                      "target features": "row", "taps": "row"}
    stage: dict[str, int] = {}  # stage -> steps shown so far

    def progress(name: str, done: int, total: int) -> None:
        if name not in stage:
            stage[name] = 0
            bars.stage(name, total, units.get(name, "step"))
        bars.advance(done - stage[name])
        stage[name] = done

    card = distill(runner.target, runner.tokenizer, plan, out, progress=progress, checkpoint=args.checkpoint,
                   resume=args.resume)
    bars.end()
    print(json.dumps(card, indent=2, sort_keys=True))
    print(f"wrote {out} and {Path(out).with_suffix('.json')}")
    return 0
