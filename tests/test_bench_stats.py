"""Statistics of benchmark runs: quantiles, bootstrap intervals, medians, throughput, pooled metrics."""

from __future__ import annotations

import statistics
import warnings

import numpy as np
import pytest

from specsample import bench
from specsample.core.metrics import Metrics, tally


def test_quantile_interpolates_between_order_statistics() -> None:
    assert bench.quantile([4.0, 1.0, 3.0, 2.0], 0.0) == 1.0
    assert bench.quantile([4.0, 1.0, 3.0, 2.0], 1.0) == 4.0
    assert bench.quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert bench.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.25) == 2.0
    with pytest.raises(ValueError, match="q: expected a value in"):
        bench.quantile([1.0], 1.5)
    with pytest.raises(ValueError, match="values: expected at least one value"):
        bench.quantile([], 0.5)


def test_bootstrap_interval_is_reproducible_and_brackets_the_median() -> None:
    values = [10.0, 11.0, 9.5, 10.5, 30.0, 10.2, 9.8]
    low, high = bench.bootstrap_interval(values)
    assert (low, high) == bench.bootstrap_interval(values)  # the same seed, the same interval
    mean = statistics.fmean  # a statistic of continuous values: another seed moves its ends
    assert bench.bootstrap_interval(values, statistic=mean, seed=1) == bench.bootstrap_interval(
        values, statistic=mean, seed=1) != bench.bootstrap_interval(values, statistic=mean, seed=2)
    assert low <= statistics.median(values) <= high
    assert min(values) <= low and high <= max(values)
    assert bench.bootstrap_interval([5.0]) == (5.0, 5.0)
    assert bench.bootstrap_interval(values, statistic=max, resamples=50)[1] == 30.0


def test_bootstrap_interval_covers_the_true_median() -> None:
    """Coverage of the nominal 90% interval of the median over 200 samples of n = 40 from a
    normal law (true median 0): the coverage count is Binomial(200, ~0.9) (the percentile
    bootstrap of a median is close to nominal at n = 40); we require >= 160 of 200, which a
    true coverage of 0.9 misses with probability < 1e-4 (Chernoff), while an interval of
    zero width (coverage 0) fails surely. Fixed seeds: deterministic in CI."""
    rng = np.random.default_rng(7)
    covered = 0
    for i in range(200):
        sample = rng.normal(size=40).tolist()
        low, high = bench.bootstrap_interval(sample, confidence=0.9, resamples=300, seed=i)
        covered += low <= 0.0 <= high
    assert covered >= 160


def test_one_replicate_gives_a_point_and_no_warning() -> None:
    # scipy's standard error of one replicate is undefined; the interval does not read it.
    values = [10.0, 11.0, 9.5, 10.5, 30.0, 10.2, 9.8]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low, high = bench.bootstrap_interval(values, resamples=1, seed=4)
    assert low == high and low in values  # the median of one resample of 7 values


def test_bootstrap_interval_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"confidence: expected a value in \(0, 1\), got 1"):
        bench.bootstrap_interval([1.0], confidence=1)
    with pytest.raises(ValueError, match="resamples: expected an int >= 1, got 0"):
        bench.bootstrap_interval([1.0], resamples=0)
    with pytest.raises(ValueError, match="values: expected at least one value"):
        bench.bootstrap_interval([])


def _runs(*rates: tuple[str, float, float]) -> list[dict[str, object]]:
    return [{"method": m, "new_tokens": t, "seconds": s, "tokens_per_s": t / s} for m, t, s in rates]


def test_median_rate_throughput_and_best_variant() -> None:
    runs = _runs(("a", 10, 1.0), ("a", 10, 2.0), ("a", 10, 4.0), ("b", 30, 1.0))
    assert bench.median_rate(runs[:3]) == 5.0 and np.isnan(bench.median_rate([]))
    assert bench.throughput(runs[:3]) == pytest.approx(30 / 7)  # all tokens over all seconds
    assert bench.best_variant(runs) == ("b", {"a": 5.0, "b": 30.0})
    with pytest.raises(ValueError, match="runs: expected at least one run record"):
        bench.best_variant([])
    with pytest.raises(ValueError, match="runs: expected a positive total of seconds"):
        bench.throughput([])


def test_metrics_merge_over_runs() -> None:
    a = tally(Metrics(), k=3, accepted=[1, 3], emitted=[2, 4], active=[True, True], elapsed_s=1.0)
    b = tally(Metrics(), k=2, accepted=[0], emitted=[1], active=[True], elapsed_s=0.5)
    total = bench.merge_metrics([a.as_dict(), b.as_dict()])
    assert (total.rounds, total.row_rounds, total.drafted, total.accepted, total.emitted) == (2, 3, 8, 4, 7)
    assert total.histogram == (1, 1, 0, 1) and total.k_counts == (0, 0, 1, 1)


def test_merge_metrics_rejects_other_records() -> None:
    with pytest.raises(ValueError, match=r"records: expected Metrics\.as_dict"):
        bench.merge_metrics([{"rounds": 1}])
    assert bench.merge_metrics([]) == Metrics()


def test_paired_interval_resamples_workloads_on_both_sides() -> None:
    def runs(seconds: list[float]) -> list[dict[str, object]]:
        return [{"prompt": i, "repeat": 0, "new_tokens": 10, "seconds": t, "tokens_per_s": 10 / t}
                for i, t in enumerate(seconds)]

    mine, base = runs([1.0, 2.0, 3.0, 4.0]), runs([2.0, 4.0, 6.0, 8.0])
    # Each workload is twice as fast: every replicate pairs them, so the interval is a point
    # (drawn independently, the two sides' sums would spread it).
    assert bench.paired_interval(mine, base, lambda a, b: bench.throughput(a) / bench.throughput(b)) \
        == (pytest.approx(2.0), pytest.approx(2.0))
    low, high = bench.paired_interval(mine, base, lambda a, b: bench.median_rate(a))
    assert low < bench.median_rate(mine) < high  # a statistic of one side alone does spread
    assert bench.paired_interval(mine, base, lambda a, b: 1.0, seed=3) == (1.0, 1.0)
    with pytest.raises(ValueError, match="mine, base: expected runs of at least one common"):
        bench.paired_interval(mine, [dict(r, repeat=1) for r in base], lambda a, b: 1.0)
    with pytest.raises(ValueError, match="mine: expected at most one run per"):
        bench.paired_interval(mine + mine, base, lambda a, b: 1.0)
