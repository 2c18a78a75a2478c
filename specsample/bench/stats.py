"""Statistics of benchmark runs: medians, quantiles, bootstrap intervals, pooled metrics."""

from __future__ import annotations

import dataclasses
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from specsample._array import check_int
from specsample.core.metrics import Metrics

__all__ = ["best_variant", "bootstrap_interval", "median_rate", "merge_metrics", "paired_interval",
           "quantile", "throughput"]


def _values(name: str, values: Sequence[float]) -> list[float]:
    out = [float(v) for v in values]
    if not out:
        raise ValueError(f"{name}: expected at least one value, got none")
    return out


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics."""
    if not 0 <= q <= 1:
        raise ValueError(f"q: expected a value in [0, 1], got {q}")
    ordered = sorted(_values("values", values))
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def bootstrap_interval(values: Sequence[float], *,
                       statistic: Callable[[Sequence[float]], float] = statistics.median,
                       confidence: float = 0.95, resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of `statistic` over `values` (resampled with replacement,
    by `scipy.stats.bootstrap`; scipy is the `testing` extra).

    Args:
        values: the observations (e.g. tokens/s of each run).
        statistic: what is estimated (default: the median), called on a list of floats.
        confidence: the interval's nominal coverage, in (0, 1).
        resamples: bootstrap replicates (>= 1).
        seed: the resampling key (the interval is reproducible).

    Returns:
        (low, high). With one value both ends are the statistic of that value.
    """
    data = _values("values", values)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: expected a value in (0, 1), got {confidence}")
    check_int("resamples", resamples, 1)
    check_int("seed", seed, 0)
    if len(data) == 1:  # every resample is the one value (scipy asks for two)
        point = float(statistic(data))
        return point, point
    try:
        from scipy.stats import bootstrap
    except ImportError as err:
        raise ImportError("bootstrap_interval: needs scipy, which specsample installs only with an "
                          "extra: pip install 'specsample[testing]'") from err
    with warnings.catch_warnings():
        # scipy also returns the replicates' standard error (ddof=1), unread here: NumPy's
        # variance warns when there is one replicate.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"numpy\.(_core|core)\._methods")
        result = bootstrap((np.asarray(data),), lambda sample: float(statistic(sample.tolist())),
                           n_resamples=resamples, vectorized=False, confidence_level=confidence,
                           method="percentile", rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


Runs = Sequence[Mapping[str, Any]]


def paired_interval(mine: Runs, base: Runs, ratio: Callable[[Runs, Runs], float], *,
                    confidence: float = 0.95, resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of `ratio(mine, base)` over the runs' workloads.

    A workload is a (prompt, repeat) pair that both lists ran; a replicate draws as many
    workloads as there are, with replacement, and takes each list's run of each drawn one,
    so both sides of the ratio always cover the same prompts.

    Args:
        mine, base: run records (prompt, repeat, ...), at most one per workload in each.
        ratio: the statistic, e.g. all tokens over all seconds of `mine` over those of `base`.
        confidence, resamples, seed: as `bootstrap_interval`.
    """
    def by_workload(name: str, runs: Runs) -> dict[tuple[int, int], Mapping[str, Any]]:
        table = {(int(r["prompt"]), int(r["repeat"])): r for r in runs}
        if len(table) != len(runs):
            raise ValueError(f"{name}: expected at most one run per (prompt, repeat), got {len(runs)} runs "
                             f"for {len(table)} workloads")
        return table

    ours, theirs = by_workload("mine", mine), by_workload("base", base)
    keys = sorted(set(ours) & set(theirs))
    if not keys:
        raise ValueError("mine, base: expected runs of at least one common (prompt, repeat), got none")

    def drawn(picks: Sequence[float]) -> float:  # the bootstrap resamples the workloads' indices
        chosen = [keys[int(i)] for i in picks]
        return float(ratio([ours[key] for key in chosen], [theirs[key] for key in chosen]))

    return bootstrap_interval(range(len(keys)), statistic=drawn, confidence=confidence,
                              resamples=resamples, seed=seed)


def median_rate(runs: Sequence[Mapping[str, Any]]) -> float:
    """The median `tokens_per_s` of run records (NaN when there are none)."""
    return statistics.median(r["tokens_per_s"] for r in runs) if runs else float("nan")


def throughput(runs: Sequence[Mapping[str, Any]]) -> float:
    """All new tokens over all seconds: the rate whose ratio Thm 3.8 predicts."""
    seconds = sum(r["seconds"] for r in runs)
    if seconds <= 0:
        raise ValueError(f"runs: expected a positive total of seconds, got {seconds}")
    return float(sum(r["new_tokens"] for r in runs) / seconds)


def best_variant(runs: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, float]]:
    """The fastest variant's name (by median tokens/s) and every variant's median."""
    if not runs:
        raise ValueError("runs: expected at least one run record, got none")
    medians = {name: median_rate([r for r in runs if r["method"] == name])
               for name in dict.fromkeys(r["method"] for r in runs)}
    return max(medians, key=lambda n: medians[n]), medians


def _add(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """Elementwise sum of two count vectors of any lengths."""
    width = max(len(a), len(b))
    return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(width))


def merge_metrics(records: Sequence[Mapping[str, Any]]) -> Metrics:
    """Metrics summed over runs, from `Metrics.as_dict` records."""
    counts = ("rounds", "row_rounds", "drafted", "accepted", "emitted", "full_rounds", "elapsed_s")
    total = Metrics()
    for d in records:
        missing = sorted(set(counts) - set(d))
        if missing:
            raise ValueError(f"records: expected Metrics.as_dict() records, one lacks {missing}")
        total = dataclasses.replace(total, **{f: getattr(total, f) + d[f] for f in counts},
                                    histogram=_add(total.histogram, d["histogram"]),
                                    k_counts=_add(total.k_counts, d["k_counts"]),
                                    accepted_at=_add(total.accepted_at, d.get("accepted_at", ())),
                                    trials_at=_add(total.trials_at, d.get("trials_at", ())),
                                    copied_accepted_at=_add(total.copied_accepted_at,
                                                            d.get("copied_accepted_at", ())),
                                    copied_trials_at=_add(total.copied_trials_at,
                                                          d.get("copied_trials_at", ())),
                                    copied_k_counts=_add(total.copied_k_counts,
                                                         d.get("copied_k_counts", ())))
    return total
