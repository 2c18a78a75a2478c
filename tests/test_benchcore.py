"""benchcore: the warp micro-benchmark's records (shapes and fields, not speed)."""

from __future__ import annotations

import pytest

from specsample.bench.core import WARPS, bench_warp


def test_bench_warp_times_every_warp_per_library_and_batch() -> None:
    labels: list[str] = []
    records = bench_warp(batches=(1, 2), rows=3, vocab=64, libraries=("numpy-float32", "torch-float64"),
                         repeats=3, progress=labels.append)
    assert labels == ["numpy-float32 B=1", "numpy-float32 B=2", "torch-float64 B=1", "torch-float64 B=2"]
    assert [r["warp"] for r in records] == list(WARPS) * 4
    for r in records:
        assert r["rows"] == 3 and r["vocab"] == 64 and r["repeats"] == 3 and r["check"] is True
        assert 0 < r["median_ms"] <= r["p90_ms"]  # type: ignore[operator]
    for i in range(0, len(records), len(WARPS)):
        group = {r["warp"]: r for r in records[i:i + len(WARPS)]}
        for r in group.values():  # ratios of medians within one library and batch
            assert r["vs_softmax"] == pytest.approx(r["median_ms"] / group["softmax"]["median_ms"])  # type: ignore[operator]
            assert r["vs_temperature"] == pytest.approx(  # type: ignore[operator]
                r["median_ms"] / group["temperature"]["median_ms"])  # type: ignore[operator]


def test_bench_warp_rejects_an_unknown_library() -> None:
    with pytest.raises(ValueError, match="libraries: expected"):
        bench_warp(batches=(1,), vocab=8, libraries=("jax-float32",), repeats=1)
