"""The models benchmark's summary, its plan, its plots and JSON, and the prompts (no model runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsample import bench


def test_efficiency_compares_rates_over_the_same_workload() -> None:
    """Thm 3.8 predicts a ratio of rates, so efficiency divides all tokens over all seconds,
    not the median run (which, for a mix of prompts, is whichever prompt is in the middle)."""
    from specsample.core.metrics import Metrics, tally

    def run(method: str, family: str, prompt: int, seconds: float,
            metrics: Metrics | None) -> dict[str, object]:
        return {"family": family, "method": method, "k": None if metrics is None else 3,
                "temperature": 0.0, "prompt": prompt, "tag": "open" if prompt < 2 else "grounded",
                "repeat": 0, "new_tokens": 60, "seconds": seconds, "tokens_per_s": 60 / seconds,
                "metrics": None if metrics is None else metrics.as_dict()}

    copy = tally(Metrics(), k=3, accepted=[3], emitted=[4], active=[True], elapsed_s=1.0)
    miss = tally(Metrics(), k=3, accepted=[0], emitted=[1], active=[True], elapsed_s=1.0)
    runs = [run("plain_ours", "plain", p, 4.0, None) for p in range(3)]
    runs += [run("specsample", "specsample", 0, 4.4, miss), run("specsample", "specsample", 1, 4.2, miss),
             run("specsample", "specsample", 2, 1.2, copy)]
    spec = next(r for r in bench.summarise(runs, draft="lookup", c=0.0)
                if r["method"] == "specsample")
    assert spec["achieved_speedup"] == pytest.approx((60 / 4.2) / 15)  # the median run
    assert spec["throughput_speedup"] == pytest.approx(12.0 / 9.8)
    both = bench.merge_metrics([copy.as_dict(), miss.as_dict(), miss.as_dict()])
    assert spec["predicted_speedup"] == pytest.approx(both.predicted_speedup(0.0))
    assert spec["efficiency"] == pytest.approx(12.0 / 9.8 / both.predicted_speedup(0.0))
    per_prompt = [4.0 / 4.4 / miss.predicted_speedup(0.0), 4.0 / 4.2 / miss.predicted_speedup(0.0),
                  4.0 / 1.2 / copy.predicted_speedup(0.0)]
    assert spec["efficiency_per_prompt"] == {"median": pytest.approx(sorted(per_prompt)[1]),
                                             "min": pytest.approx(min(per_prompt)), "n_prompts": 3}
    assert spec["by_tag"]["grounded"]["efficiency"] == pytest.approx(
        (4.0 / 1.2) / copy.predicted_speedup(0.0))
    # Every ratio carries a bootstrap interval over the workloads, around its value; the
    # one-prompt groups' intervals are points.
    for key in ("achieved_speedup", "throughput_speedup", "efficiency"):
        low, high = spec[f"{key}_ci95"]
        assert low <= spec[key] <= high and low < high, key
    assert spec["by_tag"]["grounded"]["throughput_speedup_ci95"] == [pytest.approx(4.0 / 1.2)] * 2
    assert spec["ratio_vs_hf_ci95"] is None and "runs" not in spec


def test_a_hybrids_efficiency_prices_copies_and_model_drafts_apart() -> None:
    from specsample.core.metrics import Metrics, tally

    copies = tally(Metrics(), k=4, accepted=[4], emitted=[5], active=[True], elapsed_s=1.0,
                   wanted=[4], copied=[True])
    drafts = tally(Metrics(), k=1, accepted=[0], emitted=[1], active=[True], elapsed_s=1.0,
                   wanted=[1], copied=[False])
    def run(family: str, prompt: int, seconds: float, metrics: Metrics | None) -> dict[str, object]:
        return {"family": family, "method": "plain_ours" if family == "plain" else family, "k": 8,
                "temperature": 0.0, "prompt": prompt, "tag": "open", "repeat": 0, "new_tokens": 60,
                "seconds": seconds, "tokens_per_s": 60 / seconds,
                "metrics": None if metrics is None else metrics.as_dict()}

    runs = [run("plain", 0, 4.0, None), run("specsample", 0, 2.0, copies),  # a copy round
            run("plain", 1, 4.0, None), run("specsample", 1, 4.4, drafts)]  # a failed model draft
    spec = next(r for r in bench.summarise(runs, draft="auto", c=0.12, copy_c=0.03)
                if r["method"] == "specsample")
    both = bench.merge_metrics([copies.as_dict(), drafts.as_dict()])
    assert spec["c"] == 0.12 and spec["c_copy"] == 0.03
    assert spec["predicted_speedup"] == pytest.approx(both.predicted_speedup(0.12, copy_c=0.03))
    assert spec["predicted_speedup"] != pytest.approx(both.predicted_speedup(0.12))
    pooled = next(r for r in bench.summarise(runs, draft="auto", c=0.12) if r["method"] == "specsample")
    assert pooled["c_copy"] is None and pooled["efficiency"] != pytest.approx(spec["efficiency"])


def test_summarise_needs_plain_runs() -> None:
    runs = [{"family": "specsample", "method": "specsample", "temperature": 0.0}]
    with pytest.raises(ValueError, match=r"runs: expected plain runs at T=0, got none"):
        bench.summarise(runs, draft="int8", c=0.1)


def test_models_plan_checks_sizes_before_any_model_loads() -> None:
    plan = bench.ModelsPlan(prompts=2, temperatures=(0, 0.7, (0.7, 0.9)))
    assert plan.temperatures == (0.0, 0.7, (0.7, 0.9)) and plan.repeats == 3 and plan.with_hf
    assert bench.ModelsPlan().temperatures == (0.0, 0.7, (0.7, 0.9))  # top-p by default
    for kwargs, message in (({"prompts": 99}, "prompts: expected 1 to 9, got 99"),
                            ({"prompts": 0}, "prompts: expected 1 to 9, got 0"),
                            ({"max_new_tokens": 0}, "max_new_tokens: expected an int >= 1, got 0"),
                            ({"repeats": 0}, "repeats: expected an int >= 1, got 0"),
                            ({"temperatures": ()}, "temperatures: expected numbers >= 0"),
                            ({"temperatures": (-1.0,)}, "temperatures: expected numbers >= 0"),
                            ({"temperatures": ((0.7, 0.0),)}, r"top_p in \(0, 1\]"),
                            ({"temperatures": ((0.7, 0.9, 1),)}, "temperatures: expected numbers")):
        with pytest.raises(ValueError, match=message):
            bench.ModelsPlan(**kwargs)  # type: ignore[arg-type]


def test_greedy_plan_checks_sizes() -> None:
    assert bench.GreedyPlan().prompts == len(bench.greedy_prompts()) == 22
    with pytest.raises(ValueError, match="prompts: expected 1 to 22, got 99"):
        bench.GreedyPlan(prompts=99)
    with pytest.raises(ValueError, match="max_new_tokens: expected an int >= 1, got 0"):
        bench.GreedyPlan(max_new_tokens=0)


def _record(method: str, temperature: float, rate: float) -> dict[str, object]:
    return {"method": method, "temperature": temperature, "tokens_per_s": rate,
            "tokens_per_s_min": rate - 1, "tokens_per_s_max": rate + 1, "histogram": [3, 2, 5]}


def test_plots_and_json_are_written_beside_each_other(tmp_path: Path) -> None:
    records = [_record(m, t, r) for m, t, r in (("plain", 0.0, 10.0), ("specsample", 0.0, 14.0),
                                                  ("plain", 0.7, 9.0), ("specsample", 0.7, 12.0))]
    pngs = bench.plot_models(records, tmp_path / "sub" / "run.json")
    assert [p.name for p in pngs] == ["run_tokens_per_s.png", "run_accepted.png"]
    assert all(p.stat().st_size > 1000 for p in pngs)
    written = bench.write_json(tmp_path / "sub" / "run.json", {"records": records})
    assert json.loads(written.read_text())["records"][1]["tokens_per_s"] == 14.0
    with pytest.raises(ValueError, match="records: expected at least one record"):
        bench.plot_models([], tmp_path / "x.json")
    with pytest.raises(TypeError, match="payload: expected a mapping, got list"):
        bench.write_json(tmp_path / "x.json", [])  # type: ignore[arg-type]


def test_machine_names_python_and_cores() -> None:
    info = bench.machine()
    assert {"python", "cpu", "cores"} <= set(info)


def test_prompts_are_mixed_tagged_and_distinct() -> None:
    tags = [tag for tag, _ in bench.PROMPTS]
    assert len(tags) >= 8 and set(tags) == {"open", "grounded"}
    assert set(tags[:2]) == {"open", "grounded"}  # --prompts 2 already mixes
    prompts = bench.greedy_prompts()
    assert len(prompts) >= 20 and len(set(prompts)) == len(prompts)
