"""`models`: plain decoding, specsample and transformers' assisted generation on the same prompts."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specsample._array import check_int
from specsample.bench.cost import measure_cost_ratio
from specsample.bench.load import Loaded, own_or_core
from specsample.bench.output import compiled_graphs, machine, write_json
from specsample.bench.peers import HFVariant, hf_generate, hf_module, hf_variants, quiet_transformers
from specsample.bench.plots import plot_models
from specsample.bench.progress import NO_PROGRESS, Progress
from specsample.bench.prompts import PROMPTS, chat_ids
from specsample.bench.summary import summarise
from specsample.generate import Generation, generate, generate_plain
from specsample.metrics import Metrics
from specsample.params import SamplingParams
from specsample.registry import get_backend

__all__ = ["Method", "ModelsPlan", "ModelsReport", "methods", "models", "run_all", "write_models"]

RunFn = Callable[[list[int], SamplingParams, int], tuple[int, float, Metrics | None]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelsPlan:
    """What `models` runs (validated on construction, before any model loads).

    Attributes:
        prompts: the first N of `PROMPTS` (default all).
        max_new_tokens: tokens per run (EOS disabled: equal work for every method).
        repeats: repetitions of every (setting, prompt, method).
        temperatures: the settings (0 = greedy); the other sampling knobs come from the config.
        versus: also run specsample on this backend (record "specsample@NAME").
        with_hf: include transformers' plain and assisted generation.
    """

    prompts: int = len(PROMPTS)
    max_new_tokens: int = 64
    repeats: int = 3
    temperatures: tuple[float, ...] = (0.0, 0.7)
    versus: str | None = None
    with_hf: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.prompts, bool) or not isinstance(self.prompts, int) or \
                not 1 <= self.prompts <= len(PROMPTS):
            raise ValueError(f"prompts: expected 1 to {len(PROMPTS)}, got {self.prompts!r}")
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_int("repeats", self.repeats, 1)
        temps = tuple(self.temperatures)
        if not temps or any(isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0
                            for t in temps):
            raise ValueError(f"temperatures: expected numbers >= 0, got {self.temperatures!r}")
        object.__setattr__(self, "temperatures", tuple(float(t) for t in temps))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Method:
    """A benchmarked variant: `family` is the record it competes for."""

    family: str  # "plain", "specsample", "specsample@BACKEND" or "hf_assisted"
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
            "c": "median time of one draft step (propose, K=1) / one target forward, batch 1",
            "achieved_speedup": "median tokens/s over the faster plain variant's median",
            "throughput_speedup": "all new tokens / all seconds, over the same for plain",
            "tokens_per_s_ci95": "95% percentile bootstrap interval of the median tokens/s",
            "efficiency": "throughput_speedup / predicted_speedup (Thm 3.8 summed over the rounds "
                          "at each K, from the pooled alpha and c)",
            "records": self.records, "runs": self.runs}


def _ours(loaded: Loaded, max_new: int, *, plain: bool) -> RunFn:
    backend, config = loaded.backend, loaded.config

    def run(ids: list[int], params: SamplingParams, seed: int) -> tuple[int, float, Metrics | None]:
        prompt = backend.asarray([ids])
        began = time.perf_counter()
        out: Generation
        if plain:
            out = own_or_core(backend, "generate_plain", generate_plain)(
                loaded.target, prompt, max_new_tokens=max_new, params=params, seed=seed)
        else:
            out = own_or_core(backend, "generate", generate)(
                loaded.target, loaded.drafter, prompt, max_new_tokens=max_new, params=params,
                k=config.policy(), seed=seed, eos_token_id=None)
        seconds = time.perf_counter() - began
        new = int(out.lengths[0]) - int(out.prompt_lengths[0])
        return new, seconds, None if plain else out.metrics

    return run


def _versus(loaded: Loaded, name: str, target: str, draft: str) -> Loaded:
    """The same models, config and tokenizer on another backend."""
    backend = get_backend(name, {k: v for k, v in loaded.config.backend_options().items()
                                 if k in ("device", "dtype")})
    other = backend.load_target(target)
    return loaded._replace(config=dataclasses.replace(loaded.config, backend=name), backend=backend,
                           target=other, drafter=backend.load_drafter(draft, other))


def methods(loaded: Loaded, draft: str, max_new_tokens: int, *, versus: Loaded | None = None,
            with_hf: bool = True) -> list[Method]:
    """Plain decoding (ours, transformers'), specsample, and transformers' assisted generation."""
    k = loaded.config.k
    out = [Method(family="plain", name="plain_ours", k=None, run=_ours(loaded, max_new_tokens, plain=True)),
           Method(family="specsample", name="specsample", k=k,
                  run=_ours(loaded, max_new_tokens, plain=False))]
    if versus is not None:
        name = f"specsample@{versus.config.backend}"
        out.append(Method(family=name, name=name, k=k, run=_ours(versus, max_new_tokens, plain=False)))
    module = hf_module(loaded.target) if with_hf else None
    if module is None:
        return out
    eos = loaded.tokenizer.eos_token_id
    pad = 0 if eos is None else int(eos)

    def hf(variant: HFVariant | None) -> RunFn:
        def run(ids: list[int], params: SamplingParams, seed: int) -> tuple[int, float, None]:
            return (*hf_generate(module, ids, variant, params, max_new_tokens=max_new_tokens,
                                 seed=seed, pad=pad), None)
        return run

    out.append(Method(family="plain", name="plain_hf", k=None, run=hf(None)))
    out += [Method(family="hf_assisted", name=v.name, k=v.k, run=hf(v))
            for v in hf_variants(draft, loaded.target, loaded.drafter, k if isinstance(k, int) else None)]
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


def run_all(loaded: Loaded, chosen: list[Method], prompts: Sequence[tuple[str, list[int]]],
            temperatures: Sequence[float], repeats: int, *,
            progress: Progress = NO_PROGRESS) -> tuple[list[dict[str, Any]], int | None]:
    """Every (repeat, setting, prompt, method) once, method order rotated per repetition.

    Returns:
        (the run records, torch.compile's graph count after the warm-up).
    """
    config = loaded.config
    _warm_up(chosen, prompts, dataclasses.replace(config.params(), temperature=temperatures[0]),
             config.seed, progress)
    graphs = compiled_graphs()
    runs: list[dict[str, Any]] = []
    progress.stage("bench", repeats * len(temperatures) * len(prompts) * len(chosen), "run")
    for rep in range(repeats):
        for temperature in temperatures:
            params = dataclasses.replace(config.params(), temperature=temperature)
            for index, (tag, ids) in enumerate(prompts):
                for method in _rotated(chosen, rep + index):
                    new, seconds, metrics = method.run(ids, params, config.seed + rep)
                    runs.append({"family": method.family, "method": method.name, "k": method.k,
                                 "temperature": temperature, "prompt": index, "tag": tag,
                                 "repeat": rep, "new_tokens": new, "seconds": seconds,
                                 "tokens_per_s": new / seconds,
                                 "metrics": None if metrics is None else metrics.as_dict()})
                    progress.advance(1, f"{method.name} T={temperature}")
    progress.end()
    return runs, graphs


def models(loaded: Loaded, plan: ModelsPlan, *, target: str, draft: str,
           progress: Progress = NO_PROGRESS) -> ModelsReport:
    """Plain decoding, specsample and transformers' assisted generation, timed on the same prompts.

    Args:
        loaded: the config, backend, target, drafter and tokenizer (see `load_models`).
        plan: prompts, tokens, repeats, settings, peers.
        target, draft: the specs `loaded` was made from (for `plan.versus` and the records).
        progress: receives the warm-up and the timed runs.
    """
    if not isinstance(plan, ModelsPlan):
        raise TypeError(f"plan: expected a ModelsPlan, got {type(plan).__name__}")
    quiet_transformers()
    prompts = [(tag, chat_ids(loaded.tokenizer, text)) for tag, text in PROMPTS[:plan.prompts]]
    c = measure_cost_ratio(loaded.target, loaded.drafter, loaded.backend.asarray([prompts[0][1]]),
                           loaded.config.params())
    config = loaded.config
    if config.k == "adaptive" and "cost_ratio" not in config.options:
        loaded = loaded._replace(config=dataclasses.replace(
            config, options={**config.options, "cost_ratio": c}))
    versus = None if plan.versus is None else _versus(loaded, plan.versus, target, draft)
    chosen = methods(loaded, draft, plan.max_new_tokens, versus=versus, with_hf=plan.with_hf)
    runs, warm = run_all(loaded, chosen, prompts, plan.temperatures, plan.repeats, progress=progress)
    settings = {"backend": config.backend, "options": dict(loaded.config.options),
                "target": target, "draft": draft, "k": config.k, "c": c,
                "max_new_tokens": plan.max_new_tokens, "repeats": plan.repeats, "prompts": plan.prompts,
                "temperatures": list(plan.temperatures), "versus": plan.versus,
                "compiled_graphs_after_warmup": warm, "compiled_graphs_at_end": compiled_graphs(),
                "top_k": config.top_k, "top_p": config.top_p,
                "min_p": config.min_p, "seed": config.seed, "methods": [m.name for m in chosen]}
    return ModelsReport(settings=settings, records=summarise(runs, draft=draft, c=c), runs=runs)


def write_models(report: ModelsReport, path: str | os.PathLike[str]) -> list[Path]:
    """The report as JSON at `path` and its two plots beside it; returns [json, png, png]."""
    if not isinstance(report, ModelsReport):
        raise TypeError(f"report: expected a ModelsReport, got {type(report).__name__}")
    return [write_json(path, report.payload()), *plot_models(report.records, path)]
