"""`models`: plain decoding, specsample and transformers' assisted generation on the same prompts."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specsample._array import check_int
from specsample.api.runner import Runner, encode_text, load
from specsample.bench.output import compiled_graphs, machine, write_json
from specsample.bench.peers import HFVariant, hf_generate, hf_module, hf_variants, quiet_transformers
from specsample.bench.plots import plot_models
from specsample.bench.progress import NO_PROGRESS, Progress
from specsample.bench.prompts import PROMPTS
from specsample.bench.summary import summarise
from specsample.core.metrics import Metrics
from specsample.core.params import SamplingParams
from specsample.drafters.hybrid import HybridDrafter
from specsample.engine.cost import measure_cost_ratio
from specsample.engine.runs import Generation

__all__ = ["Method", "ModelsPlan", "ModelsReport", "Setting", "UnsummarisedRuns", "methods", "models",
           "run_all", "setting_label", "setting_params", "write_models"]

RunFn = Callable[[list[int], SamplingParams, int], tuple[int, float, Metrics | None]]
# A sampling setting of the benchmark: a temperature (the config's other knobs), or a
# (temperature, top_p) pair.
Setting = float | tuple[float, float]


def setting_params(base: SamplingParams, setting: Setting) -> SamplingParams:
    """`base` at the setting's temperature (and top_p, for a pair)."""
    if isinstance(setting, tuple):
        return dataclasses.replace(base, temperature=setting[0], top_p=setting[1])
    return dataclasses.replace(base, temperature=setting)


def setting_label(temperature: float, top_p: float | None) -> str:
    """How records name a setting: "T=0.7", "T=0.7 top_p=0.9"."""
    return f"T={temperature:g}" + ("" if top_p is None or top_p >= 1 else f" top_p={top_p:g}")


def _setting(value: object) -> Setting | None:
    """The setting `value` names, or None if it names none."""
    def number(x: object) -> bool:
        return not isinstance(x, bool) and isinstance(x, (int, float)) and x >= 0

    if number(value):
        return float(value)  # type: ignore[arg-type]
    if isinstance(value, tuple) and len(value) == 2 and number(value[0]) and number(value[1]) \
            and 0 < value[1] <= 1:
        return float(value[0]), float(value[1])
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelsPlan:
    """What `models` runs (validated on construction, before any model loads).

    Attributes:
        prompts: the first N of `PROMPTS` (default all).
        max_new_tokens: tokens per run (EOS disabled: equal work for every method).
        repeats: repetitions of every (setting, prompt, method).
        temperatures: the settings: a temperature (0 = greedy; the other sampling knobs come
            from the config), or a (temperature, top_p) pair.
        versus: also run specsample on this backend (record "specsample@NAME").
        also: also run specsample with this drafter, on the same backend, at its own default
            K (record "specsample:NAME"; every record gets `ratio_vs_also`).
        with_hf: include transformers' plain and assisted generation.
    """

    prompts: int = len(PROMPTS)
    max_new_tokens: int = 64
    repeats: int = 3
    temperatures: tuple[Setting, ...] = (0.0, 0.7, (0.7, 0.9))
    versus: str | None = None
    also: str | None = None
    with_hf: bool = True

    def __post_init__(self) -> None:
        if self.also is not None and (not isinstance(self.also, str) or not self.also):
            raise ValueError(f"also: expected a drafter name, got {self.also!r}")
        if isinstance(self.prompts, bool) or not isinstance(self.prompts, int) or \
                not 1 <= self.prompts <= len(PROMPTS):
            raise ValueError(f"prompts: expected 1 to {len(PROMPTS)}, got {self.prompts!r}")
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_int("repeats", self.repeats, 1)
        temps = tuple(self.temperatures)
        settings = [_setting(t) for t in temps]
        if not temps or any(t is None for t in settings):
            raise ValueError(f"temperatures: expected numbers >= 0 or (temperature, top_p) pairs with "
                             f"top_p in (0, 1], got {self.temperatures!r}")
        object.__setattr__(self, "temperatures", tuple(settings))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Method:
    """A benchmarked variant: `family` is the record it competes for."""

    family: str  # "plain", "specsample", "specsample@BACKEND", "specsample:DRAFT" or "hf_assisted"
    name: str
    k: int | str | None
    run: RunFn


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelsReport:
    """The result of `models`: settings, one record per (method, setting), and every run."""

    settings: dict[str, Any]
    records: list[dict[str, Any]]
    runs: list[dict[str, Any]]

    def payload(self) -> dict[str, Any]:
        """The JSON document: machine, settings, the meaning of each rate, records and runs."""
        return {
            "benchmark": "models", "machine": machine(), "settings": self.settings,
            "tokens_per_s": "median over prompts x repeats of per-run new tokens / wall seconds "
                            "(one generate call, prefill included); every run generates exactly "
                            "max_new_tokens (EOS disabled)",
            "c": "median time of one draft step (propose, K=1) / one target forward, batch 1; for a "
                 "hybrid drafter, of its model's step (c_copy: of its prompt lookup's)",
            "achieved_speedup": "median tokens/s over the faster plain variant's median",
            "throughput_speedup": "all new tokens / all seconds, over the same for plain",
            "tokens_per_s_ci95": "95% percentile bootstrap interval of the median tokens/s",
            "efficiency": "throughput_speedup / predicted_speedup (Thm 3.8 summed over the rounds "
                          "at each K, from the pooled alpha and c; for a hybrid drafter, by kind of "
                          "round: copies at their own alpha and c_copy, model drafts at theirs and c)",
            "records": self.records, "runs": self.runs}


def _ours(runner: Runner, max_new: int, *, plain: bool) -> RunFn:
    """One generation on the runner's backend engine (EOS off); texts are not decoded (untimed work)."""
    backend = runner.backend

    def run(ids: list[int], params: SamplingParams, seed: int) -> tuple[int, float, Metrics | None]:
        began = time.perf_counter()
        prompt, lengths = runner.encode([ids])
        options = runner.options(max_new_tokens=max_new, params=params, seed=seed, eos_token_id=None,
                                 prompt_lengths=lengths)
        out: Generation
        if plain:
            out = backend.generate_plain(runner.target, prompt, options)
        else:
            out = backend.generate(runner.target, runner.drafter, prompt, options)
        seconds = time.perf_counter() - began
        new = int(out.lengths[0]) - int(out.prompt_lengths[0])
        return new, seconds, None if plain else out.metrics

    return run


def _versus(runner: Runner, name: str, target: str | None, draft: str | None) -> Runner:
    """The same models and config on another backend (only device, dtype and cost_ratio carried)."""
    options = {k: v for k, v in runner.config.options.items() if k in ("device", "dtype", "cost_ratio")}
    return load(dataclasses.replace(runner.config, backend=name, options=options), target=target, draft=draft)


def methods(runner: Runner, draft: str | None, max_new_tokens: int, *, versus: Runner | None = None,
            with_hf: bool = True, also: Runner | None = None) -> list[Method]:
    """Plain decoding (ours, transformers'), specsample (also on the `versus` runner's backend,
    and with the `also` runner's drafter), and transformers' assisted generation with the
    same draft (`draft` names it; None: no assisted peer)."""
    k = runner.config.k
    out = [Method(family="plain", name="plain_ours", k=None, run=_ours(runner, max_new_tokens, plain=True)),
           Method(family="specsample", name="specsample", k=k,
                  run=_ours(runner, max_new_tokens, plain=False))]
    if versus is not None:
        name = f"specsample@{versus.config.backend}"
        out.append(Method(family=name, name=name, k=k, run=_ours(versus, max_new_tokens, plain=False)))
    if also is not None:
        name = f"specsample:{also.config.draft}"
        out.append(Method(family=name, name=name, k=also.config.k,
                          run=_ours(also, max_new_tokens, plain=False)))
    module = hf_module(runner.target) if with_hf else None
    if module is None:
        return out
    pad = runner.pad_id

    def hf(variant: HFVariant | None) -> RunFn:
        def run(ids: list[int], params: SamplingParams, seed: int) -> tuple[int, float, None]:
            return (*hf_generate(module, ids, variant, params, max_new_tokens=max_new_tokens,
                                 seed=seed, pad=pad), None)
        return run

    out.append(Method(family="plain", name="plain_hf", k=None, run=hf(None)))
    out += [Method(family="hf_assisted", name=v.name, k=v.k, run=hf(v))
            for v in (hf_variants(draft, runner.target, runner.drafter, k if isinstance(k, int) else None)
                      if draft is not None else [])]
    names = [m.name for m in out]
    if len(set(names)) != len(names):  # before the runs: the summary pairs runs by method name
        raise ValueError(f"draft, also: expected distinct benchmark methods, got {names}")
    return out


def _rotated(items: list[Method], shift: int) -> list[Method]:
    shift %= len(items)
    return items[shift:] + items[:shift]


def _warm_up(chosen: list[Method], prompts: Sequence[tuple[str, list[int]]], params: SamplingParams,
             seed: int, progress: Progress) -> None:
    """Each method untimed on the shortest and the longest prompt (at the first setting: sampling
    knobs are graph inputs), so most one-off costs (a static backend's graphs for the smallest
    and largest bucket, allocator growth) stay out of the timed runs. A bucket between the two,
    or a K an adaptive policy picks only later, still compiles inside a timed run."""
    by_length = sorted(prompts, key=lambda p: len(p[1]))
    warm = [by_length[0], by_length[-1]] if len(by_length) > 1 else by_length
    progress.stage("warm-up", len(chosen), "method")
    for method in chosen:
        for _, ids in warm:
            method.run(ids, params, seed)
        progress.advance(1)
    progress.end()


def run_all(runner: Runner, chosen: list[Method], prompts: Sequence[tuple[str, list[int]]],
            temperatures: Sequence[Setting], repeats: int, *,
            progress: Progress = NO_PROGRESS) -> tuple[list[dict[str, Any]], int | None]:
    """Every (repeat, setting, prompt, method) once, method order rotated per repetition.

    Returns:
        (the run records, torch.compile's graph count after the warm-up).
    """
    config = runner.config
    _warm_up(chosen, prompts, setting_params(config.params(), temperatures[0]), config.seed, progress)
    graphs = compiled_graphs()
    runs: list[dict[str, Any]] = []
    progress.stage("bench", repeats * len(temperatures) * len(prompts) * len(chosen), "run")
    for rep in range(repeats):
        for setting in temperatures:
            params = setting_params(config.params(), setting)
            label = setting_label(params.temperature, params.top_p)
            for index, (tag, ids) in enumerate(prompts):
                for method in _rotated(chosen, rep + index):
                    new, seconds, metrics = method.run(ids, params, config.seed + rep)
                    runs.append({"family": method.family, "method": method.name, "k": method.k,
                                 "temperature": params.temperature, "top_p": params.top_p,
                                 "setting": label, "prompt": index, "tag": tag,
                                 "repeat": rep, "new_tokens": new, "seconds": seconds,
                                 "tokens_per_s": new / seconds,
                                 "metrics": None if metrics is None else metrics.as_dict()})
                    progress.advance(1, f"{method.name} {label}")
    progress.end()
    return runs, graphs


def models(runner: Runner, plan: ModelsPlan, *, target: str | None = None, draft: str | None = None,
           progress: Progress = NO_PROGRESS) -> ModelsReport:
    """Plain decoding, specsample and transformers' assisted generation, timed on the same prompts.

    Args:
        runner: the loaded models (`specsample.load`); runs go to its backend's engine.
        plan: prompts, tokens, repeats, settings, peers.
        target, draft: the specs `runner` was loaded with (for `plan.versus`, the
            transformers peers and the records; default: the config's).
        progress: receives the warm-up and the timed runs.
    """
    if not isinstance(plan, ModelsPlan):
        raise TypeError(f"plan: expected a ModelsPlan, got {type(plan).__name__}")
    target = runner.config.target if target is None else target
    draft = runner.config.draft if draft is None else draft
    quiet_transformers()
    prompts = [(tag, encode_text(runner.tokenizer, text)) for tag, text in PROMPTS[:plan.prompts]]
    c = measure_cost_ratio(runner.target, runner.drafter, runner.backend.asarray([prompts[0][1]]),
                           runner.config.params())
    kinds = _kind_costs(runner, prompts[0][1])
    config = runner.config
    if config.k == "adaptive" and "cost_ratio" not in config.options:
        runner = dataclasses.replace(runner, config=dataclasses.replace(
            config, options={**config.options, "cost_ratio": c}))
    versus = None if plan.versus is None else _versus(runner, plan.versus, target, draft)
    also, drafters = None, {}
    if plan.also is not None:  # the same target, at the default K its drafter gets
        also = runner.with_drafter(plan.also)
        also_kinds = _kind_costs(also, prompts[0][1])
        drafters[f"specsample:{plan.also}"] = (plan.also, *(also_kinds or (measure_cost_ratio(
            also.target, also.drafter, also.backend.asarray([prompts[0][1]]), config.params()), None)))
    chosen = methods(runner, draft, plan.max_new_tokens, versus=versus, with_hf=plan.with_hf, also=also)
    runs, warm = run_all(runner, chosen, prompts, plan.temperatures, plan.repeats, progress=progress)
    settings = {"backend": config.backend, "options": dict(runner.config.options),
                "target": target, "draft": draft, "k": config.k, "c": c,
                "costs_by_kind": None if kinds is None else {"model": kinds[0], "copy": kinds[1]},
                "max_new_tokens": plan.max_new_tokens, "repeats": plan.repeats, "prompts": plan.prompts,
                "temperatures": [list(t) if isinstance(t, tuple) else t for t in plan.temperatures],
                "versus": plan.versus, "also": plan.also,
                "also_k": None if also is None else also.config.k,
                "compiled_graphs_after_warmup": warm, "compiled_graphs_at_end": compiled_graphs(),
                "top_k": config.top_k, "top_p": config.top_p,
                "min_p": config.min_p, "seed": config.seed, "methods": [m.name for m in chosen]}
    try:
        records = summarise(runs, draft=draft, c=c if kinds is None else kinds[0], drafters=drafters,
                            copy_c=None if kinds is None else kinds[1])
    except ValueError as err:
        raise UnsummarisedRuns(f"runs: the summary failed ({err}); the runs are kept in `report`",
                               ModelsReport(settings=settings, records=[], runs=runs)) from err
    return ModelsReport(settings=settings, records=records, runs=runs)


def _kind_costs(runner: Runner, prompt: list[int]) -> tuple[float, float] | None:
    """For a hybrid drafter (prompt lookup's copies in some rounds, a draft model's drafts in
    others), the c of its model and of its prompt lookup, each timed as `measure_cost_ratio`
    times a drafter, so that Thm 3.8 prices each kind of round at its own cost; None for
    other drafters (their one c is the drafter's)."""
    drafter = runner.drafter
    if not isinstance(drafter, HybridDrafter):
        return None
    ids, params = runner.backend.asarray([prompt]), runner.config.params()
    return (measure_cost_ratio(runner.target, drafter.model, ids, params),
            measure_cost_ratio(runner.target, drafter.lookup, ids, params))


class UnsummarisedRuns(ValueError):
    """`models` timed every run but could not summarise them: `report` holds the settings and
    the runs (no records), so that a long benchmark's measurements can still be written."""

    def __init__(self, message: str, report: ModelsReport) -> None:
        super().__init__(message)
        self.report = report


def write_models(report: ModelsReport, path: str | os.PathLike[str]) -> list[Path]:
    """The report as JSON at `path` and its two plots beside it; returns [json, png, png]."""
    if not isinstance(report, ModelsReport):
        raise TypeError(f"report: expected a ModelsReport, got {type(report).__name__}")
    return [write_json(path, report.payload()), *plot_models(report.records, path)]
