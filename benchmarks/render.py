"""Render the committed benchmark results into the docs' benchmarks page and the README's table.

    python benchmarks/render.py            # write docs/benchmarks.md and the README's table
    python benchmarks/render.py --check    # exit 1 when either differs from what the JSON renders

The results are the JSON files that `specsample bench ... --json PATH` writes, kept in
benchmarks/results/: `bench.json` (the default benchmark, models end to end), `batch.json`
(batch sizes) and `core.json` (verify and warp alone), the draft heads' cards in
backends/torch/heads/ (their held-out acceptance), and `check_*.json` and `greedy_*.json`
(`specsample check`'s and `specsample bench greedy`'s verdicts on the heads). Each page shows, for each
benchmark, the committed run: the command, the machine it ran on (the JSON's `machine`),
and its numbers. A missing file is said on the page, not an error. The README's table sits
between the marker comments START and END below; the rest of the README is left as it is.
Standard library only: no need to install the package to render.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("benchmarks/results")
PAGE = Path("docs/benchmarks.md")
README = Path("README.md")
START, END = "<!-- results:start -->", "<!-- results:end -->"
RENDER = "python benchmarks/render.py"

Record = Mapping[str, Any]
Lines = list[str]


@dataclasses.dataclass(frozen=True)
class Source:
    """One results file: where it is, the command that writes it, how to show it."""

    file: str
    title: str
    command: str
    about: str
    render: Callable[[Record], Lines]
    # The settings the command gives, as the JSON records them: a file written with other
    # flags is shown with the difference spelt out.
    expected: Mapping[str, Any]
    recorded: Callable[[Record], Mapping[str, Any]]


def _fmt_ratio(value: float | None, interval: Sequence[float] | None = None) -> str:
    if value is None:
        return "-"
    text = f"{value:.2f}x"
    return text if not interval else f"{text} [{interval[0]:.2f}, {interval[1]:.2f}]"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> Lines:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def machine(payload: Record) -> str:
    """The machine a run recorded, in words."""
    info = payload.get("machine") or {}
    parts = []
    if info.get("cpu"):
        parts.append(str(info["cpu"]))
    if info.get("cores") is not None:
        parts.append(f"{info['cores']} cores")
    if info.get("python"):
        parts.append(f"Python {info['python']}")
    if info.get("torch"):
        threads = info.get("torch_threads")
        parts.append(f"torch {info['torch']}" + (f" ({threads} threads)" if threads is not None else ""))
    return ", ".join(parts) if parts else "not recorded"


# --- bench.json: `specsample bench` (models end to end) -------------------------------------

def _specsample(payload: Record) -> list[Record]:
    return [r for r in payload.get("records", []) if r.get("method") == "specsample"]


def _tag(record: Record, tag: str) -> str:
    entry = record.get("by_tag", {}).get(tag)
    if entry is None:
        return "-"
    return _fmt_ratio(entry.get("throughput_speedup"), entry.get("throughput_speedup_ci95"))


def speedup_rows(payload: Record) -> list[list[str]]:
    """Per setting: specsample over plain decoding (all, open-ended, grounded) and over
    transformers' fastest assisted setting."""
    return [[str(r.get("setting") or f"T={r['temperature']:g}"),
             _fmt_ratio(r.get("throughput_speedup"), r.get("throughput_speedup_ci95")),
             _tag(r, "open"), _tag(r, "grounded"),
             _fmt_ratio(r.get("ratio_vs_hf"), r.get("ratio_vs_hf_ci95"))]
            for r in _specsample(payload)]


SPEEDUP_HEADER = ("setting", "all prompts", "open-ended", "grounded", "vs transformers' best assisted")


def _models_recorded(payload: Record) -> Mapping[str, Any]:
    return payload.get("settings", {})


def render_models(payload: Record) -> Lines:
    settings = payload.get("settings", {})
    kinds = settings.get("costs_by_kind")
    cost = f"c = {_fmt(settings.get('c'), '.2f')}"
    if kinds:
        model, copy = _fmt(kinds.get("model"), ".2f"), _fmt(kinds.get("copy"), ".2f")
        cost = f"c = {model} for a model draft step and {copy} for a copy"
    lines = [f"Backend `{settings.get('backend')}`, target `{settings.get('target')}`, drafter "
             f"`{settings.get('draft')}`, K = {settings.get('k')}; {settings.get('prompts')} prompts, "
             f"{settings.get('max_new_tokens')} new tokens each, repeats: {settings.get('repeats')}; "
             f"{cost} (cost over a target forward, measured at load).", "",
             "Speed-up of specsample over plain decoding (all new tokens over all seconds, with the "
             "95% bootstrap interval over prompts and repeats), and its median tokens/s over that "
             "of transformers' fastest assisted-generation setting:", "",
             *_table(SPEEDUP_HEADER, speedup_rows(payload)), "",
             "Every method and setting (tokens/s: median over prompts and repeats; efficiency: the "
             "measured speed-up over Theorem 3.8's prediction from the measured acceptance and c):",
             ""]
    rows = []
    for r in payload.get("records", []):
        rows.append([r.get("method", "?"), str(r.get("setting") or r.get("temperature")),
                     "-" if r.get("k") is None else str(r.get("k")),
                     str(r.get("variant")), _fmt(r.get("tokens_per_s"), ".1f"),
                     _fmt_ratio(r.get("throughput_speedup")), _fmt(r.get("alpha"), ".3f"),
                     _fmt(r.get("efficiency"), ".2f")])
    header = ("method", "setting", "K", "variant", "tokens/s", "vs plain", "alpha", "efficiency")
    lines += _table(header, rows)
    return lines


# --- batch.json: `specsample bench batch` ---------------------------------------------------

def _batch_record(payload: Record) -> Record:
    records = payload.get("records") or [{}]
    return records[0]


def _batch_recorded(payload: Record) -> Mapping[str, Any]:
    record = _batch_record(payload)
    return {**payload.get("settings", {}), "repeats": record.get("repeats")}


def render_batch(payload: Record) -> Lines:
    record = _batch_record(payload)
    settings = payload.get("settings", {})
    lines = [f"Backend `{settings.get('backend')}`, target `{settings.get('target')}`, drafter "
             f"`{record.get('draft', settings.get('draft'))}`, K = {record.get('k')}; greedy, "
             f"{record.get('rows')} ragged prompts, {record.get('max_new_tokens')} new tokens each, "
             f"repeats: {record.get('repeats')} (medians; the methods in turn). Batched rows equal to "
             f"the prompt alone: {record.get('rows_equal')}/{record.get('rows_compared')}.", ""]
    rows = [[str(s.get("batch")), _fmt(s.get("tokens_per_s"), ".1f"),
             _fmt(s.get("tokens_per_s_plain"), ".1f"), _fmt_ratio(s.get("speedup_vs_plain")),
             ", ".join(f"{x:.2f}" for x in s.get("speedups", [])), _fmt(s.get("acceptance_rate"), ".2f")]
            for s in record.get("sizes", [])]
    lines += _table(("batch", "specsample tokens/s", "plain tokens/s", "vs plain", "each run", "acceptance"),
                    rows)
    return lines


# --- core.json: `specsample bench core` -----------------------------------------------------

def _core_recorded(payload: Record) -> Mapping[str, Any]:
    first = (payload.get("records") or [{}])[0]
    return {"repeats": first.get("repeats"), "vocab": first.get("vocab")}


def render_core(payload: Record) -> Lines:
    records = payload.get("records", [])
    vocab = records[0].get("vocab") if records else None
    lines = [f"`verify` on `[B, K]` drafts over a vocabulary of {vocab}, input checks off (as inside "
             "a graph); median and 90th percentile of the timed calls, in milliseconds:", ""]
    lines += _table(("library", "B", "K", "median ms", "p90 ms"),
                    [[r["library"], str(r["batch"]), str(r["k"]), f"{r['median_ms']:.3f}",
                      f"{r['p90_ms']:.3f}"] for r in records])
    warps = payload.get("warp_records", [])
    names = list(dict.fromkeys(r["warp"] for r in warps))
    rows_per = warps[0].get("rows") if warps else None
    lines += ["", f"`warp` on `[B, {rows_per}, {vocab}]` logits next to a plain softmax (the floor any "
              "warp pays), input checks on, timed in turn within each repeat; median milliseconds:", ""]
    groups: dict[tuple[str, int], dict[str, Record]] = {}
    for r in warps:
        groups.setdefault((r["library"], r["batch"]), {})[r["warp"]] = r
    lines += _table(("library", "B", *names),
                    [[library, str(batch), *(_fmt(by.get(n, {}).get("median_ms"), ".3f") for n in names)]
                     for (library, batch), by in groups.items()])
    return lines


# --- the page ------------------------------------------------------------------------------

SOURCES = (
    Source(file="bench.json", title="End to end: `specsample bench`",
           command="specsample bench --repeats 2 --json benchmarks/results/bench.json",
           about="What a newcomer gets: the default backend (`torch`), target (SmolLM2-135M-Instruct, "
                 "float32) and drafter (`auto`), against plain decoding and transformers' assisted "
                 "generation (its prompt lookup and its assistant with the int8 self-draft, at several "
                 "K; the fastest counts), on 9 prompts: 4 open-ended, 5 grounded (they rework a text "
                 "given in the prompt, where copying drafts shine). Settings T=0, T=0.7 and T=0.7 with "
                 "top-p 0.9. EOS is off, so every method makes the same number of tokens.",
           render=render_models, expected={"repeats": 2, "prompts": 9, "max_new_tokens": 64},
           recorded=_models_recorded),
    Source(file="batch.json", title="Batch sizes: `specsample bench batch`",
           command="specsample bench batch --json benchmarks/results/batch.json",
           about="Greedy speculative against plain decoding at batch 1, 2, 8 and 32 (8 ragged prompts; "
                 "batch 32 holds each four times). A batched row must equal its prompt alone.",
           render=render_batch, expected={"max_new_tokens": 64, "repeats": 3}, recorded=_batch_recorded),
    Source(file="core.json", title="The core alone: `specsample bench core`",
           command="specsample bench core --json benchmarks/results/core.json",
           about="`verify` and `warp` by batch size, K and array library, on random inputs of "
                 "SmolLM2's vocabulary size: what the core's pure functions cost inside a round.",
           render=render_core, expected={"repeats": 30, "vocab": 49152}, recorded=_core_recorded),
)

INTRO = """\
Speed is shown by `specsample bench`, never by timed tests. Each command below writes its
records as JSON; the JSON committed in `benchmarks/results/` is what this page and the
README's table are rendered from, by one command:

```bash
{render}
```

How the numbers are taken: the methods of a benchmark run interleaved on the same prompts
and models (the order rotated every repeat), each warmed up untimed first; a run's
tokens/s counts its new tokens over its wall time, prefill included. A speed-up is all new
tokens over all seconds against plain decoding in the same run, with a 95% bootstrap
interval over the (prompt, repeat) workloads, resampled in pairs so that both sides of a
ratio cover the same runs. A ratio counts when it holds in two runs of the same command.
Speed depends on the machine (its cores, its float kernels, the load of other jobs): each
result names the machine it ran on.
"""

FROM_PYTHON = """\
## The same benchmarks from Python

`specsample.bench` is what the commands call: functions that take a `Runner` and explicit
arguments and return records; nothing in it prints, and every run goes to the backend's
own engine. On the reference backend's toy models (where a draft step costs as much as a
target step, so speculation does not pay; this shows the API, not a speed-up):

```python
import specsample
from specsample import Config, bench

runner = specsample.load(Config(backend="reference", k=4, temperature=0.7))
report = bench.models(runner, bench.ModelsPlan(prompts=2, repeats=1, max_new_tokens=8, with_hf=False))
spec = next(r for r in report.records if r["method"] == "specsample")
print(spec["setting"], spec["throughput_speedup"], spec["throughput_speedup_ci95"])
bench.write_models(report, "mine.json")        # the JSON (and two plots beside it)
```

`bench.batch`, `bench.memory`, `bench.greedy`, `bench.summarise`, `bench.paired_interval`
and `bench.measure_cost_ratio` are there too. Other benchmarks of the command line:
`specsample bench tree` (suffix trees by node budget), `bench verifiers` (token-wise against
block verification), `bench greedy` (speculative equal to plain greedy decoding, token for
token, on 22 prompts) and `bench memory` (resident memory over a long generation).
"""


def _load(path: Path) -> Record | None:
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(payload, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(payload).__name__}")
    return payload


def _differences(source: Source, payload: Record) -> str:
    got = source.recorded(payload)
    diff = [f"{name} {got.get(name)} (the command: {want})" for name, want in source.expected.items()
            if got.get(name) != want]
    return "" if not diff else "Recorded with other settings than the command gives: " + ", ".join(diff) + "."


def section(source: Source, root: Path) -> Lines:
    """The page's section for one results file."""
    path = RESULTS / source.file
    lines = [f"## {source.title}", "", source.about, "", "```bash", source.command, "```", ""]
    payload = _load(root / path)
    if payload is None:
        return [*lines, f"No results yet: `{path}` is missing. Run the command above, commit the file, "
                        f"then `{RENDER}`.", ""]
    lines += [f"Machine: {machine(payload)}.", ""]
    note = _differences(source, payload)
    if note:
        lines += [note, ""]
    return [*lines, *source.render(payload), ""]


def others(root: Path) -> Lines:
    """Results files that this page does not render, listed so that none goes unseen."""
    known = {s.file for s in SOURCES}
    checked = {p.name for pattern in (CHECKS, GREEDY) for p in (root / RESULTS).glob(pattern)}
    extra = sorted(p.name for p in (root / RESULTS).glob("*.json") if p.name not in known | checked)
    if not extra:
        return []
    lines = ["## Other results", "", "Committed but not rendered here:", ""]
    for name in extra:
        payload = _load(root / RESULTS / name) or {}
        lines.append(f"- `{RESULTS / name}`: benchmark `{payload.get('benchmark', '?')}`, machine: "
                     f"{machine(payload)}")
    return [*lines, ""]


HEADS = Path("backends/torch/heads")
# Cards of heads trained and measured but not shipped (their weights are not committed).
TRIED = RESULTS / "heads"


def _recipe(plan: Mapping[str, Any]) -> str:
    """The name of the `specsample distill` recipe a card's plan is (fields it lacks take the
    plan's defaults, as when it was trained), else "custom"."""
    from specsample.drafters.head import RECIPES, DistillPlan

    known = {f.name for f in dataclasses.fields(DistillPlan)}
    try:
        given = DistillPlan(**{k: v for k, v in plan.items() if k in known})
    except (TypeError, ValueError):
        return "custom"
    return next((name for name, recipe in RECIPES.items() if recipe == given), "custom")


# Plan fields a head's row names (as the text says) where they differ from the recipes' default.
_NAMED_PAST_DEFAULT = (("topics", "{} topics"), ("label_temperature", "labels at T={}"),
                       ("layers", "{} layers"))


def heads(root: Path) -> Lines:
    """The held-out acceptance of each shipped draft head, from its card (`specsample distill`
    writes it; `specsample distill --evaluate --out FILE` measures it for an existing head),
    then of each head tried and not shipped (its card in `TRIED`)."""
    cards = sorted((root / HEADS).glob("*.json")) + sorted((root / TRIED).glob("*.json"))
    lines = ["## Held-out acceptance of the draft heads", "",
             "Chain drafting of K tokens a round (K from the head's plan) on the benchmark prompts, "
             "which no head was trained on, seed 0; tokens per round (emitted per target forward), "
             "alpha, and the acceptance of the draft at each depth given the earlier ones, by "
             f"prompt kind. From the heads' cards in `{HEADS}`; a head marked *not shipped* was "
             f"trained and measured, its card kept in `{TRIED}`.", ""]
    if not cards:
        return [*lines, f"No head cards in `{HEADS}`.", ""]
    loaded = {path: _load(path) or {} for path in cards}
    shipped = {path: card for path, card in loaded.items() if path.parent == root / HEADS}
    copies = {path: of for path, card in loaded.items()
              if path.parent == root / TRIED and (of := _reproduces(card, shipped)) is not None}
    from specsample.drafters.head import DistillPlan

    default = DistillPlan()  # a card's plan lacks the fields added after it was trained
    rows = []
    for path, card in loaded.items():
        if path in copies:
            continue
        plan = card.get("plan", {})
        named = "".join(f", {text.format(value)}" for field, text in _NAMED_PAST_DEFAULT
                        if (value := plan.get(field, getattr(default, field))) != getattr(default, field))
        recipe = (f"{_recipe(plan)}: unroll {plan.get('unroll', 1)}, feature weight "
                  f"{plan.get('feature_weight')}, {card.get('training_tokens', '?')} tokens"
                  f"{', taps ' + plan['taps'] if plan.get('taps') else ''}{named}, "
                  f"{plan.get('epochs', '?')} epochs")
        name = f"`{path.stem}`" + (" (not shipped)" if path.parent == root / TRIED else "")
        table = card.get("held_out_by_temperature")
        if not isinstance(table, dict):
            rows.append([name, recipe, "-", "-", "not measured: `specsample distill --evaluate "
                         f"--out {HEADS / path.stem}.safetensors`", "-", "-"])
            continue
        for temperature, probe in table.items():
            for kind in ("open", "grounded", "all"):
                depth = probe.get("depth", {}).get(kind, [])
                rows.append([name, recipe, temperature, kind,
                             _fmt(probe.get("tokens_per_round", {}).get(kind), ".2f"),
                             _fmt(probe.get("alpha", {}).get(kind), ".3f"),
                             " / ".join(f"{x:.2f}" for x in depth) or "-"])
    header = ["head", "recipe", "T", "prompts", "tokens per round", "alpha", "acceptance at depth 1..K"]
    return [*lines, *_table(header, rows), "", *reproductions(copies, loaded)]


def _reproduces(card: Record, shipped: Mapping[Path, Record]) -> Path | None:
    """The shipped card that `card` repeats the run of (the same plan for the same target),
    if any."""
    for path, other in shipped.items():
        if card.get("plan") and card.get("plan") == other.get("plan") \
                and card.get("target_fingerprint") == other.get("target_fingerprint"):
            return path
    return None


def _wall(card: Record) -> str:
    """A card's wall seconds over all the invocations of its run; "-" for a card written
    before cards counted them (its seconds are its last invocation's alone)."""
    if "invocations" not in card or card.get("seconds") is None:
        return "-"
    return f"{card['seconds']:,} ({card['invocations']})"


def reproductions(copies: Mapping[Path, Path], cards: Mapping[Path, Record]) -> Lines:
    """Each tried card that repeats a shipped head's run (same plan, same target; `copies`
    maps its path to the shipped card's, `cards` every path to its card): its held-out tokens
    per round beside the shipped head's, and whether the weights are equal."""
    if not copies:
        return []
    lines = ["### Reproductions of the shipped heads", "",
             "A card in the tried folder with the plan and target of a shipped head is a second run "
             "of its `specsample distill` command; held-out tokens per round (all prompts) of both, "
             "and the largest relative difference; the wall seconds count every invocation of the "
             "run (an interrupted run continues from its checkpoint folder).", ""]
    rows = []
    for path, of in copies.items():
        card, original = cards[path], cards[of]
        mine = card.get("held_out_by_temperature") or {}
        theirs = original.get("held_out_by_temperature") or {}
        pairs = []
        for temperature in theirs:
            a = theirs[temperature].get("tokens_per_round", {}).get("all")
            b = (mine.get(temperature) or {}).get("tokens_per_round", {}).get("all")
            if a and b is not None:
                pairs.append((temperature, a, b))
        gap = max((abs(b - a) / a for _, a, b in pairs), default=None)
        rows.append([f"`{path.stem}`", f"`{of.stem}`",
                     " / ".join(f"T={t}: {a:.3f}" for t, a, _ in pairs) or "-",
                     " / ".join(f"T={t}: {b:.3f}" for t, _, b in pairs) or "-",
                     "-" if gap is None else f"{gap:.1%}",
                     "yes" if card.get("weights_sha256") == original.get("weights_sha256") else "no",
                     _wall(card)])
    header = ["run", "repeats", "shipped", "this run", "largest difference", "same weights",
              "wall seconds (invocations)"]
    return [*lines, *_table(header, rows), ""]


CHECKS = "check_*.json"  # `specsample check` runs: the law, not the speed
GREEDY = "greedy_*.json"  # `specsample bench greedy` runs: speculative = plain at T = 0


def _check_command(payload: Record) -> str:
    """The `specsample check` command a results file records (its plot path aside)."""
    parts = ["specsample check", f"--draft {payload.get('draft')}", f"--against {payload.get('against')}",
             f"--n {payload.get('n')}"]
    if payload.get("broken"):
        parts.append(f"--broken {payload['broken']}")
    return " ".join(parts)


def checks(root: Path) -> Lines:
    """The committed `specsample check` runs (`specsample check ... --plot benchmarks/results/
    check_NAME.png` writes check_NAME.json beside the figure): each test's verdict."""
    files = sorted((root / RESULTS).glob(CHECKS))
    if not files and not sorted((root / RESULTS).glob(GREEDY)):
        return []
    lines = ["## Exactness checks of the draft heads", "",
             "`specsample check` on SmolLM2: the first 3 tokens after one prompt, sampled by the backend's "
             "own `generate` (caches, features and trees as a user runs them), tested against the "
             "target's exact law on 8 outcomes fixed by that law (the 7 likeliest first tokens, or "
             "3-token sequences, and the rest). A test fails when the empirical TV exceeds its "
             "threshold or the G-test's p-value is below alpha; a law at TV >= the detected value "
             "fails except with probability alpha. A run with a broken rule is a negative control: "
             "it must fail. A head's fan-out of m tokens and a grown tree whose first level holds "
             "the same m tokens propose the same first candidates, and the rule reads the same "
             "uniforms for a seed, so their first tokens coincide row by row; the grown tree's "
             "deeper nodes are what its 3-token samples add.", "", "```bash"]
    lines += [_check_command(_load(path) or {}) for path in files]
    rows = []
    for path in files:
        payload = _load(path) or {}
        for name, setting in payload.get("settings", {}).items():
            for what, test in setting.get("tests", {}).items():
                rows.append([f"`{payload.get('draft')}`", str(payload.get("rule")), name, what,
                             f"{test.get('n', test.get('n_a', 0)):,}", _fmt(test.get("tv"), ".4f"),
                             _fmt(test.get("detectable_tv"), ".3f"), _fmt(test.get("pvalue"), ".3g"),
                             "PASS" if test.get("passed") else "FAIL"])
    header = ["draft", "rule", "setting", "test", "n", "TV", "detects TV >=", "G-test p", "verdict"]
    lines += ["```", "", *_table(header, rows), ""]
    greedy = [_load(path) or {} for path in sorted((root / RESULTS).glob(GREEDY))]
    if greedy:
        lines += ["Greedy decoding (T = 0), speculative against plain, token for token on the built-in "
                  "prompts (`specsample bench greedy --draft NAME --json benchmarks/results/"
                  "greedy_NAME.json`); a near tie is a difference where the target's two best "
                  "logits are closer than the tie gap, which float rounding may order either way:", ""]
        rows = [[f"`{g.get('draft')}`", str(g.get("max_new_tokens")),
                 f"{g.get('equal')}/{len(g.get('records', []))}", str(g.get("near_ties")),
                 str(g.get("other"))] for g in greedy]
        lines += [*_table(["draft", "tokens", "equal", "near ties", "other differences"], rows), ""]
    return lines


def page(root: Path) -> str:
    """docs/benchmarks.md."""
    lines = [f"<!-- Written by `{RENDER}` from {RESULTS}/*.json: edit those or the renderer, "
             "not this page. -->", "", "# Benchmarks", "", INTRO.format(render=RENDER)]
    for source in SOURCES:
        lines += section(source, root)
    lines += heads(root)
    lines += checks(root)
    lines += others(root)
    lines.append(FROM_PYTHON)
    return "\n".join(lines).rstrip("\n") + "\n"


def readme_table(root: Path) -> str:
    """The README's block between the markers (markers excluded)."""
    source = SOURCES[0]
    payload = _load(root / RESULTS / source.file)
    if payload is None:
        return (f"No results yet: `{RESULTS / source.file}` is missing (`{source.command}`, then "
                f"`{RENDER}`).")
    settings = payload.get("settings", {})
    lines = [f"`{source.command.split(' --json')[0]}` on {machine(payload)}: specsample's speed-up over "
             f"plain decoding (target `{settings.get('target')}`, drafter `{settings.get('draft')}`), with "
             "95% bootstrap intervals ([how it is measured, and more](docs/benchmarks.md)).", ""]
    note = _differences(source, payload)
    if note:
        lines += [note, ""]
    return "\n".join([*lines, *_table(SPEEDUP_HEADER, speedup_rows(payload))])


def readme(root: Path) -> str:
    """README.md with its results block rendered anew."""
    text = (root / README).read_text()
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"{README}: expected one {START} before one {END}")
    head, rest = text.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{readme_table(root)}\n{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a page differs from what the JSON renders")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    try:
        wanted = {PAGE: page(args.root), README: readme(args.root)}
    except ValueError as err:
        print(f"render: {err}", file=sys.stderr)
        return 2
    stale = [name for name, text in wanted.items()
             if not (args.root / name).is_file() or (args.root / name).read_text() != text]
    if args.check:
        for name in stale:
            print(f"{name} differs from what {RESULTS}/*.json renders: run `{RENDER}`", file=sys.stderr)
        return 1 if stale else 0
    for name in stale:
        (args.root / name).write_text(wanted[name])
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
