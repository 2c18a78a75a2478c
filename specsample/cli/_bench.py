"""`specsample bench`: the core micro-benchmark, and the model benchmark."""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

from tqdm import tqdm

from specsample.benchcore import WARPS, bench_verify, bench_warp


def add_parser(sub: Any) -> None:
    """Register the `bench` subcommand."""
    parser = sub.add_parser("bench", help="benchmarks (JSON results)")
    parser.add_argument("what", nargs="?", default="models",
                        choices=["models", "core", "batch", "memory", "greedy"],
                        help="'models': end-to-end against peers (default); 'core': verify and warp alone; "
                             "'batch': 8 ragged rows vs batch 1 (greedy); 'memory': a long "
                             "generation; 'greedy': speculative vs plain greedy on 22 prompts")
    parser.add_argument("--json", type=Path, default=None, help="write the records here")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repetitions (default: 30 for core, 3 for models)")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.set_defaults(run=run)
    _add_model_options(parser)


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    try:
        from specsample.cli import _models
    except ImportError:  # pragma: no cover
        return
    _models.add_bench_options(parser)


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark and write JSON."""
    if args.what in ("models", "batch", "memory", "greedy"):
        from specsample.cli import _measure, _models

        if args.what == "models":
            return int(_models.bench(args))
        if args.what == "greedy":
            _measure.greedy_sizes(args)  # bad sizes fail before the models load
        measure = {"batch": _measure.batch, "memory": _measure.memory,
                   "greedy": _measure.greedy}[args.what]
        return measure(args, _models.load(args))
    repeats = 30 if args.repeats is None else args.repeats
    if repeats < 1:
        raise ValueError(f"--repeats: expected >= 1, got {repeats}")
    settings = 3 * 3 * 2 + 3 * 3
    bar = tqdm(total=settings, desc="verify, warp")

    def progress(label: str) -> None:
        bar.set_postfix_str(label)
        bar.update(1)

    records = bench_verify(vocab=args.vocab, repeats=repeats, progress=progress)
    warps = bench_warp(vocab=args.vocab, repeats=repeats, progress=progress)
    bar.close()
    print(f"{'library':<15}{'B':>4}{'K':>4}{'median ms':>12}{'p90 ms':>10}")
    for r in records:
        print(f"{r['library']:<15}{r['batch']:>4}{r['k']:>4}{r['median_ms']:>12.3f}{r['p90_ms']:>10.3f}")
    print(f"\nwarp [B, {warps[0]['rows']}, {args.vocab}], median ms")
    print(f"{'library':<15}{'B':>4}" + "".join(f"{name:>13}" for name in WARPS))
    for i in range(0, len(warps), len(WARPS)):
        row = warps[i : i + len(WARPS)]
        times = "".join(f"{r['median_ms']:>13.3f}" for r in row)
        print(f"{row[0]['library']:<15}{row[0]['batch']:>4}{times}")
    write_json(args.json, {"benchmark": "core-verify", "machine": machine(), "records": records,
                           "warp_records": warps})
    return 0


def machine() -> dict[str, object]:
    """Where a benchmark ran."""
    import os

    info: dict[str, object] = {"python": platform.python_version(), "cpu": platform.processor(),
                               "cores": os.cpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def write_json(path: Path | None, payload: dict[str, object]) -> None:
    """Write `payload` as JSON if a path was given."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}")
