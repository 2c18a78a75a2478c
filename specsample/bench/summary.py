"""One record per (method, setting) from the runs of `models`: rates, speedups, Thm 3.8."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from specsample.bench.stats import (
    best_variant,
    bootstrap_interval,
    median_rate,
    merge_metrics,
    paired_interval,
    quantile,
    throughput,
)

__all__ = ["summarise"]


def _record(family: str, temperature: float, runs: list[dict[str, Any]], *, draft: str | None, c: float,
            plain: Sequence[Mapping[str, Any]], copy_c: float | None = None
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary of one (method, setting), and the runs of its fastest variant that it
    summarises; `plain` holds the faster plain variant's runs."""
    best, medians = best_variant(runs)
    chosen = [r for r in runs if r["method"] == best]
    tps = [r["tokens_per_s"] for r in chosen]
    record: dict[str, Any] = {
        "method": family, "temperature": temperature, "k": chosen[0]["k"], "draft": draft,
        "variant": best, "variants_tokens_per_s": medians, "tokens_per_s": statistics.median(tps),
        "tokens_per_s_ci95": list(bootstrap_interval(tps)),
        "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
        "tokens_per_s_q25": quantile(tps, 0.25), "tokens_per_s_q75": quantile(tps, 0.75),
        "acceptance_rate": None, "alpha": None, "mean_tokens_per_round": None, "c": c, "c_copy": copy_c,
        "predicted_speedup": None, "n_runs": len(chosen)}
    record["achieved_speedup"] = record["tokens_per_s"] / median_rate(plain)
    record["throughput_speedup"] = throughput(chosen) / throughput(plain)
    record.update(_intervals(chosen, plain))
    record["by_tag"] = {}
    for tag in dict.fromkeys(r["tag"] for r in chosen):
        mine, base = ([r for r in rs if r["tag"] == tag] for rs in (chosen, plain))
        record["by_tag"][tag] = {"tokens_per_s": median_rate(mine), "n_runs": len(mine),
                                 "achieved_speedup": median_rate(mine) / median_rate(base),
                                 "throughput_speedup": throughput(mine) / throughput(base),
                                 **_intervals(mine, base)}
    if family.startswith("specsample"):
        _add_acceptance(record, chosen, plain, c, copy_c)
    return record, chosen


def _median_ratio(mine: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]]) -> float:
    return median_rate(mine) / median_rate(base)


def _throughput_ratio(mine: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]]) -> float:
    return throughput(mine) / throughput(base)


def _intervals(mine: Sequence[Mapping[str, Any]],
               base: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Bootstrap 95% intervals of the two speedups over the runs' workloads (`paired_interval`)."""
    return {"achieved_speedup_ci95": list(paired_interval(mine, base, _median_ratio)),
            "throughput_speedup_ci95": list(paired_interval(mine, base, _throughput_ratio))}


def _add_acceptance(record: dict[str, Any], runs: Sequence[Mapping[str, Any]],
                    plain: Sequence[Mapping[str, Any]], c: float, copy_c: float | None) -> None:
    """alpha, Thm 3.8's prediction and the efficiency: achieved over predicted speedup (with
    `copy_c`, by kind of round: `Metrics.predicted_speedup`).

    The prediction is a ratio of expected rates over the whole workload, so `efficiency`
    compares it with the measured ratio of rates over the same workload (all tokens over
    all seconds, against plain decoding on the same prompts and repeats), not with the
    median run, which for a mix of prompts lands on whichever prompt is in the middle.
    `efficiency_per_prompt` (median and minimum) applies the theorem to each prompt
    with that prompt's own alpha and median speedup.
    """
    m = merge_metrics([r["metrics"] for r in runs])
    record.update(acceptance_rate=m.acceptance_rate, alpha=m.alpha,
                  mean_tokens_per_round=m.mean_tokens_per_round, mean_k=m.mean_k,
                  histogram=list(m.histogram), predicted_speedup=m.predicted_speedup(c, copy_c=copy_c))
    record["efficiency"] = record["throughput_speedup"] / record["predicted_speedup"]

    def efficiency(mine: Sequence[Mapping[str, Any]], base: Sequence[Mapping[str, Any]]) -> float:
        predicted = merge_metrics([r["metrics"] for r in mine]).predicted_speedup(c, copy_c=copy_c)
        return throughput(mine) / throughput(base) / predicted

    record["efficiency_ci95"] = list(paired_interval(runs, plain, efficiency))
    per_prompt = []
    for index in dict.fromkeys(r["prompt"] for r in runs):
        mine, base = ([r for r in rs if r["prompt"] == index] for rs in (runs, plain))
        predicted = merge_metrics([r["metrics"] for r in mine]).predicted_speedup(c, copy_c=copy_c)
        per_prompt.append(median_rate(mine) / median_rate(base) / predicted)
    record["efficiency_per_prompt"] = {"median": statistics.median(per_prompt),
                                       "min": min(per_prompt), "n_prompts": len(per_prompt)}
    for tag, entry in record["by_tag"].items():
        t = merge_metrics([r["metrics"] for r in runs if r["tag"] == tag])
        entry.update(alpha=t.alpha, acceptance_rate=t.acceptance_rate,
                     mean_tokens_per_round=t.mean_tokens_per_round,
                     predicted_speedup=t.predicted_speedup(c, copy_c=copy_c))
        entry["efficiency"] = entry["throughput_speedup"] / entry["predicted_speedup"]


def summarise(runs: Sequence[Mapping[str, Any]], *, draft: str | None, c: float,
              drafters: Mapping[str, tuple[str, float, float | None]] | None = None,
              copy_c: float | None = None) -> list[dict[str, Any]]:
    """One record per (method family, setting), speedups against the faster plain variant.

    Args:
        runs: run records of `models` (family, method, k, temperature, prompt, tag,
            new_tokens, seconds, tokens_per_s, metrics, and the setting's label); a "plain"
            family at each setting.
        draft: the drafter's name (copied into each record).
        c: the draft/target cost ratio the predictions use.
        drafters: family -> (drafter name, c, copy_c) for families that ran another drafter
            (a "specsample:NAME" family, rated against as `ratio_vs_also`).
        copy_c: for a hybrid drafter (copies in some rounds, model drafts in others), the
            cost ratio of its copies; c is then its model's, and Thm 3.8 is applied to each
            kind of round. None: one c for every round.
    """
    drafters = {} if drafters is None else dict(drafters)
    records: list[dict[str, Any]] = []
    for setting in dict.fromkeys(_label(r) for r in runs):
        at = [dict(r) for r in runs if _label(r) == setting]
        temperature = at[0]["temperature"]
        plain_runs = [r for r in at if r["family"] == "plain"]
        if not plain_runs:
            raise ValueError(f"runs: expected plain runs at {setting}, got none")
        best, _ = best_variant(plain_runs)
        fastest = [r for r in plain_runs if r["method"] == best]
        group = {}
        for f in dict.fromkeys(r["family"] for r in at):
            name, cost, copy_cost = drafters.get(f, (draft, c, copy_c))
            group[f] = _record(f, temperature, [r for r in at if r["family"] == f], draft=name, c=cost,
                               plain=fastest, copy_c=copy_cost)
        hf = group.get("hf_assisted")
        versus = next((group[f] for f in group if f.startswith("specsample@")), None)
        also = next((group[f] for f in group if f.startswith("specsample:")), None)
        for record, chosen in group.values():
            for key, other in (("ratio_vs_hf", hf), ("ratio_vs_versus", versus), ("ratio_vs_also", also)):
                record[key] = None if other is None else record["tokens_per_s"] / other[0]["tokens_per_s"]
                record[f"{key}_ci95"] = None if other is None else list(
                    paired_interval(chosen, other[1], _median_ratio))
            record.setdefault("efficiency", None)
            record.setdefault("efficiency_ci95", None)
            record.update(setting=setting, top_p=at[0].get("top_p"))
            records.append(record)
    return records


def _label(run: Mapping[str, Any]) -> str:
    """The run's setting: its label, or its temperature's (runs recorded before settings had labels)."""
    return str(run.get("setting") or f"T={run['temperature']:g}")
