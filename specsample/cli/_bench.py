"""`specsample bench`: parse, call `specsample.bench`, print the tables."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from specsample import bench
from specsample.api.runner import Runner, load
from specsample.bench.core import WARPS, bench_verify, bench_warp
from specsample.cli._progress import Bars
from specsample.cli.options import SAMPLING, add_model_options, config_from_args, refuse_unused

__all__ = ["add_parser", "models_table", "run_models", "show_models"]

_MODEL = {"backend", "config", "target", "draft", "k", "seed", "max_new_tokens", "device", "dtype"}
USED: dict[str, set[str]] = {
    "core": {"json", "repeats", "vocab"},
    "models": _MODEL | set(SAMPLING[1:]) | {"json", "repeats", "prompts", "temperatures", "versus", "also",
                                            "skip_hf"},
    "batch": _MODEL | {"json", "repeats"},
    "memory": _MODEL | set(SAMPLING) | {"json"},
    "greedy": _MODEL | {"json", "prompts"},
    "tree": {"backend", "config", "target", "seed", "max_new_tokens", "device", "dtype", "json", "repeats",
             "temperature"},
    "verifiers": _MODEL | {"json", "temperatures"},
}
HINTS = {"temperature": "`bench models` takes --temperatures; batch and greedy are greedy",
         "top_k": "batch and greedy are greedy", "top_p": "batch and greedy are greedy",
         "min_p": "batch and greedy are greedy"}


def add_parser(sub: Any) -> None:
    """Register the `bench` subcommand."""
    parser = sub.add_parser("bench", help="benchmarks (JSON results)")
    parser.add_argument("what", nargs="?", default="models", choices=list(USED),
                        help="'models': end-to-end against peers (default); 'core': verify and warp alone; "
                             "'batch': greedy, speculative vs plain at batch 1, 2, 8 and 32; 'memory': a "
                             "long generation; 'greedy': speculative vs plain greedy on 22 prompts; 'tree': "
                             "suffix trees by node budget vs prompt lookup and plain decoding on the "
                             "grounded prompts, and the verify cost curve; 'verifiers': token-wise vs "
                             "block verification, accepted drafts per round")
    parser.add_argument("--json", type=Path, default=None, help="write the records here")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repetitions (default: 30 for core, 3 for models and batch)")
    parser.add_argument("--vocab", type=int, default=None, help="core: vocabulary size (default 49152)")
    add_model_options(parser)
    parser.add_argument("--temperatures", default=None,
                        help="comma-separated settings, T or T:P for top_p P at T (models; default "
                             "0,0.7,0.7:0.9; 0 = greedy)")
    parser.add_argument("--prompts", type=int, default=None,
                        help=f"use the first N built-in prompts (models: default all {len(bench.PROMPTS)}; "
                             f"greedy: default all {len(bench.greedy_prompts())})")
    parser.add_argument("--versus", default=None, metavar="BACKEND",
                        help="also run specsample on this backend (e.g. torch, to rate static-cpu "
                             "against eager): record 'specsample@BACKEND' and ratio_vs_versus")
    parser.add_argument("--also", default=None, metavar="DRAFT",
                        help="also run specsample with this drafter on the same backend, at its own "
                             "default K (e.g. int8, next to --draft head): record 'specsample:DRAFT' "
                             "and ratio_vs_also")
    parser.add_argument("--skip-hf", action="store_true",
                        help="leave out transformers' plain and assisted generation")
    parser.set_defaults(run=run)
    parser.set_defaults(defaults=vars(parser.parse_args([])))


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark, print its table and write JSON."""
    refuse_unused(args, args.defaults, USED[args.what], f"bench {args.what}", HINTS)
    if args.what == "core":
        return _core(args)
    if args.what == "models":
        return run_models(args, temperatures=_temperatures(args.temperatures))
    if args.what in ("tree", "verifiers"):
        return _tree_or_verifiers(args)
    plan = bench.GreedyPlan(**_given(args, "prompts", "max_new_tokens")) if args.what == "greedy" \
        else None  # bad sizes fail before the models load
    runner = load(config_from_args(args))
    settings = _settings(runner)
    if plan is not None:
        return _greedy(runner, plan, args.json, settings)
    if args.what == "batch":
        return _batch(runner, args.max_new_tokens, args.json, settings, args.repeats)
    return _memory(runner, args.max_new_tokens, args.json, settings)


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def _settings(runner: Runner) -> dict[str, Any]:
    """The run's settings as the loaded models and config have them (recorded in the JSON)."""
    config = runner.config
    return {"backend": config.backend, "options": dict(config.options), "target": config.target,
            "draft": config.draft, "k": config.k, "temperature": config.temperature, "top_k": config.top_k,
            "top_p": config.top_p, "min_p": config.min_p, "seed": config.seed,
            "device": str(getattr(runner.target, "device", None)),
            "dtype": str(getattr(runner.target, "dtype", None))}


def _write(path: Path | None, payload: Mapping[str, object]) -> None:
    if path is not None:
        print(f"wrote {bench.write_json(path, {**payload, 'machine': bench.machine()})}")


def _core(args: argparse.Namespace) -> int:
    repeats = 30 if args.repeats is None else args.repeats
    if repeats < 1:
        raise ValueError(f"--repeats: expected >= 1, got {repeats}")
    bars = Bars()
    bars.stage("verify, warp", 3 * 3 * 2 + 3 * 3, "it")
    vocab = 49152 if args.vocab is None else args.vocab
    records = bench_verify(vocab=vocab, repeats=repeats, progress=lambda label: bars.advance(1, label))
    warps = bench_warp(vocab=vocab, repeats=repeats, progress=lambda label: bars.advance(1, label))
    bars.end()
    print(f"{'library':<15}{'B':>4}{'K':>4}{'median ms':>12}{'p90 ms':>10}")
    for r in records:
        print(f"{r['library']:<15}{r['batch']:>4}{r['k']:>4}{r['median_ms']:>12.3f}{r['p90_ms']:>10.3f}")
    print(f"\nwarp [B, {warps[0]['rows']}, {vocab}], median ms")
    print(f"{'library':<15}{'B':>4}" + "".join(f"{name:>13}" for name in WARPS))
    for i in range(0, len(warps), len(WARPS)):
        row = warps[i : i + len(WARPS)]
        times = "".join(f"{r['median_ms']:>13.3f}" for r in row)
        print(f"{row[0]['library']:<15}{row[0]['batch']:>4}{times}")
    _write(args.json, {"benchmark": "core-verify", "records": records, "warp_records": warps})
    return 0


def _temperatures(text: str | None) -> tuple[Any, ...]:
    """`--temperatures`: comma-separated T (the config's other knobs) or T:P (top_p P at T)."""
    if text is None:
        return bench.ModelsPlan().temperatures
    values: list[Any] = []
    try:
        for item in (t.strip() for t in text.split(",") if t.strip()):
            temperature, colon, top_p = item.partition(":")
            values.append((float(temperature), float(top_p)) if colon else float(temperature))
    except ValueError as err:
        raise ValueError(f"--temperatures: expected comma-separated T or T:P (top_p P), "
                         f"got {text!r}") from err
    if not values or any((v[0] if isinstance(v, tuple) else v) < 0 for v in values) or \
            any(isinstance(v, tuple) and not 0 < v[1] <= 1 for v in values):
        raise ValueError(f"--temperatures: expected temperatures >= 0 and top_p in (0, 1], got {text!r}")
    return tuple(values)


def run_models(args: argparse.Namespace, *, temperatures: Sequence[Any]) -> int:
    """`bench models`: the plan from the options (checked before any model loads), then the run."""
    values = {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats}
    plan = bench.ModelsPlan(**{k: v for k, v in values.items() if v is not None},
                            temperatures=tuple(temperatures), versus=args.versus, also=args.also,
                            with_hf=not args.skip_hf)
    path = Path("results/bench.json") if args.json is None else args.json
    return show_models(load(config_from_args(args)), plan, path=path)


def show_models(runner: Runner, plan: bench.ModelsPlan, *, path: Path) -> int:
    """Run `bench.models`, write its JSON and plots, print the table."""
    print(runner.drafter_note())
    try:
        report = bench.models(runner, plan, progress=Bars())
    except bench.UnsummarisedRuns as err:  # keep the timed runs: they took the longest
        kept = bench.write_json(path, err.report.payload())
        raise ValueError(f"{err}; the runs were written to {kept}") from err
    paths = bench.write_models(report, path)
    print(f"wrote {', '.join(str(p) for p in paths)}")
    models_table(report.records)
    intervals(report.records)
    graphs = report.settings["compiled_graphs_after_warmup"], report.settings["compiled_graphs_at_end"]
    if graphs[0] is not None and graphs[1] is not None:
        print(f"torch.compile graphs: {graphs[0]} after warm-up, {graphs[1]} at the end "
              f"({graphs[1] - graphs[0]} compiled during the timed runs)")
    return 0


def intervals(records: Sequence[Mapping[str, Any]]) -> None:
    """Print specsample's speedups over plain decoding (all tokens over all seconds) with their
    bootstrap 95% intervals: over all prompts and per kind of prompt."""
    def span(value: float, ci: Sequence[float]) -> str:
        return f"{value:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]"

    for r in records:
        if r["method"] != "specsample":
            continue
        kinds = "; ".join(f"{tag} {span(e['throughput_speedup'], e['throughput_speedup_ci95'])}"
                          for tag, e in r["by_tag"].items())
        hf = "" if r.get("ratio_vs_hf") is None else \
            f"; vs HF assisted {span(r['ratio_vs_hf'], r['ratio_vs_hf_ci95'])}"
        also = next((o["method"] for o in records if o["method"].startswith("specsample:")), None)
        beside = "" if r.get("ratio_vs_also") is None else \
            f"; vs {also} {span(r['ratio_vs_also'], r['ratio_vs_also_ci95'])}"
        overall = span(r["throughput_speedup"], r["throughput_speedup_ci95"])
        setting = r.get("setting") or r["temperature"]
        print(f"{setting}: specsample vs plain {overall} (95% bootstrap intervals over prompts x "
              f"repeats); {kinds}{hf}{beside}")


def _fmt(value: Any, width: int, spec: str) -> str:
    return "-".rjust(width) if value is None else format(value, f">{width}{spec}")


def models_table(records: Sequence[Mapping[str, Any]]) -> None:
    """Print one line per (method, setting)."""
    versus = any(r.get("ratio_vs_versus") is not None for r in records)
    also = any(r.get("ratio_vs_also") is not None for r in records)
    print(f"{'method':<18}{'setting':>16}{'k':>11}{'tok/s':>8}{'speedup':>9}{'tput':>7}{'pred':>7}{'eff':>6}"
          f"{'alpha':>7}{'vs HF':>7}" + (f"{'vs @':>7}" if versus else "")
          + (f"{'vs +':>7}" if also else "") + "  variant")
    for r in records:
        setting = r.get("setting") or r["temperature"]
        print(f"{r['method']:<18}{setting:>16}{r['k']!s:>11}{r['tokens_per_s']:>8.1f}"
              f"{r['achieved_speedup']:>8.2f}x{r['throughput_speedup']:>6.2f}x"
              f"{_fmt(r['predicted_speedup'], 7, '.2f')}"
              f"{_fmt(r['efficiency'], 6, '.2f')}{_fmt(r['alpha'], 7, '.3f')}"
              f"{_fmt(r['ratio_vs_hf'], 7, '.2f')}"
              + (_fmt(r.get("ratio_vs_versus"), 7, ".2f") if versus else "")
              + (_fmt(r.get("ratio_vs_also"), 7, ".2f") if also else "") + f"  {r['variant']}")


def _batch(runner: Runner, max_new: int | None, path: Path | None, settings: dict[str, Any],
           repeats: int | None) -> int:
    n = 64 if max_new is None else max_new
    record = bench.batch(runner, max_new_tokens=n, repeats=3 if repeats is None else repeats, progress=Bars())
    record["draft"] = settings["draft"]
    print(f"greedy, {record['rows']} ragged prompts x {n} tokens (batch 32: each prompt 4 times); "
          f"batched rows equal to the prompt alone: {record['rows_equal']}/{record['rows_compared']}")
    print(f"medians of {record['repeats']} runs in turn")
    print(f"{'batch':>6}{'specsample tok/s':>18}{'plain tok/s':>13}{'vs plain':>10}{'accepted':>10}"
          f"  each run vs plain; rounds at K")
    for r in record["sizes"]:
        runs = ", ".join(f"{x:.2f}" for x in r["speedups"])
        print(f"{r['batch']:>6}{r['tokens_per_s']:>18.1f}{r['tokens_per_s_plain']:>13.1f}"
              f"{r['speedup_vs_plain']:>9.2f}x{r['acceptance_rate']:>10.2f}  {runs}; {r['k_counts']}")
    _write(path, {"benchmark": "batch", "settings": {**settings, "max_new_tokens": n}, "records": [record]})
    return 0 if record["rows_equal"] == record["rows_compared"] else 1


def _memory(runner: Runner, max_new: int | None, path: Path | None, settings: dict[str, Any]) -> int:
    n = 4000 if max_new is None else max_new
    r = bench.memory(runner, max_new_tokens=n, progress=Bars())
    print(f"{r['tokens']} tokens: resident memory after warm-up {r['rss_mib_min_after_warmup']:.0f}-"
          f"{r['rss_mib_max_after_warmup']:.0f} MiB (growth {r['growth_mib']:.1f} MiB), peak "
          f"{r['peak_rss_mib']:.0f} MiB")
    _write(path, {"benchmark": "memory", "settings": {**settings, "max_new_tokens": n}, "records": [r]})
    return 0 if r["growth_mib"] < bench.MEMORY_GROWTH_MIB else 1


def _greedy(runner: Runner, plan: bench.GreedyPlan, path: Path | None,
            settings: dict[str, Any]) -> int:
    report = bench.greedy(runner, plan, progress=Bars(prefix=f"{settings['draft']}: "))
    n, config = plan.max_new_tokens, runner.config
    print(f"greedy, draft {settings['draft']}, K={config.k}, {n} tokens: {report.equal}/"
          f"{len(report.records)} prompts equal token for token; {report.near_ties} near-tie "
          f"differences (top-2 gap < {plan.tie_gap}); {report.other} other differences")
    for r in report.records:
        if not r["equal"]:
            print(f"  at token {r['first_difference']}: plain {r['plain_token']} vs spec "
                  f"{r['spec_token']}, top-2 gap {r['top2_gap']:.2e}: {r['prompt']!r}")
    _write(path, {"benchmark": "greedy",
                  "settings": {**settings, "max_new_tokens": n, "prompts": plan.prompts},
                  "draft": settings["draft"], "k": config.k, "backend": config.backend, "max_new_tokens": n,
                  "tie_gap": plan.tie_gap, "equal": report.equal, "near_ties": report.near_ties,
                  "other": report.other, "records": report.records})
    return 0 if report.other == 0 else 1


def _tree_or_verifiers(args: argparse.Namespace) -> int:
    from specsample.bench import tree

    if args.what == "tree":
        given = {"max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                 "temperature": args.temperature}
        plan: Any = tree.TreePlan(**{k: v for k, v in given.items() if v is not None})
    else:
        given = {"max_new_tokens": args.max_new_tokens, "k": args.k}
        if args.temperatures is not None:
            given["temperatures"] = _temperatures(args.temperatures)
        plan = tree.VerifierPlan(**{k: v for k, v in given.items() if v is not None})
    runner = load(config_from_args(args))
    settings = _settings(runner)
    path = Path(f"results/bench_{args.what}.json") if args.json is None else args.json
    if args.what == "verifiers":
        print(runner.drafter_note())
        report = tree.verifiers(runner, plan, progress=Bars())
        print(f"{'T':>5}{'verifier':>10}{'accepted':>10}{'rounds':>8}{'per round':>11}")
        for r in report["records"]:
            print(f"{r['temperature']:>5g}{r['verifier']:>10}{r['accepted']:>10}{r['rounds']:>8}"
                  f"{r['accepted_per_round']:>11.3f}")
        print("block / token-wise: " + ", ".join(f"T={t} {g:.3f}x" for t, g in report["gains"].items()))
        _write(path, {"benchmark": "verifiers", "settings": settings, **report})
        return 0
    report = tree.trees(runner, plan, progress=Bars())
    print(f"{'method':<20}{'tok/s':>8}{'tok/forward':>13}{'vs plain':>10}  95% interval")
    for r in report["records"]:
        low, high = r["ratio_vs_plain_ci95"]
        print(f"{r['method']:<20}{r['tokens_per_s']:>8.1f}{r['tokens_per_forward']:>13.2f}"
              f"{r['ratio_vs_plain']:>9.2f}x  [{low:.2f}, {high:.2f}]")
    print("verify cost: " + ", ".join(f"1+{c['nodes']}: {c['relative']:.2f}x" for c in report["cost_curve"]))
    _write(path, {"benchmark": "tree", "settings": settings, **report})
    print(f"wrote {tree.plot_trees(report, path)}")
    return 0
