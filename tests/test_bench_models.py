"""The benchmarks called from Python on the reference backend (toy models, seconds): records, not prints."""

from __future__ import annotations

from pathlib import Path

import pytest

import specsample
from specsample import Config, bench

TOY = "ngram:vocab=8,order=2,seed=1"


def runner_of(draft: str) -> specsample.Runner:
    return specsample.load(Config(backend="reference", k=2, seed=4, temperature=0.7), target=TOY, draft=draft)


@pytest.fixture(scope="module")
def runner() -> specsample.Runner:
    return runner_of("lookup")


class Recorder:
    """A `bench.Progress` that keeps what it was told."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, int]] = []
        self.done = 0

    def stage(self, name: str, total: int, unit: str) -> None:
        self.stages.append((name, total))

    def advance(self, count: int = 1, note: str = "") -> None:
        self.done += count

    def end(self) -> None:
        pass


def test_models_returns_records_and_writes_them(runner: specsample.Runner, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    progress = Recorder()
    plan = bench.ModelsPlan(prompts=2, repeats=2, max_new_tokens=3, temperatures=(0.0, 0.7, (0.7, 0.5)),
                            versus="reference")
    report = bench.models(runner, plan, progress=progress)
    assert capsys.readouterr().out == ""  # the library never prints
    assert progress.stages == [("warm-up", 3), ("bench", 2 * 2 * 3 * 3)] and progress.done == 3 + 36
    settings = ("T=0", "T=0.7", "T=0.7 top_p=0.5")
    assert {(r["method"], r["setting"]) for r in report.records} == \
        {(m, t) for m in ("plain", "specsample", "specsample@reference") for t in settings}
    assert {(r["setting"], r["top_p"]) for r in report.runs} == {("T=0", None), ("T=0.7", None),
                                                                 ("T=0.7 top_p=0.5", 0.5)}
    assert all(r["new_tokens"] == 3 for r in report.runs) and len(report.runs) == 36
    spec = next(r for r in report.records if r["method"] == "specsample" and r["setting"] == "T=0.7")
    low, high = spec["tokens_per_s_ci95"]
    assert low <= spec["tokens_per_s"] <= high and spec["k"] == 2 and 0 <= spec["alpha"] <= 1
    assert report.settings["seed"] == 4 and report.settings["methods"] == \
        ["plain_ours", "specsample", "specsample@reference"]
    paths = bench.write_models(report, tmp_path / "models.json")
    assert [p.name for p in paths] == ["models.json", "models_tokens_per_s.png", "models_accepted.png"]


def test_also_runs_another_drafter_at_its_own_k_and_rates_every_record_against_it(
        runner: specsample.Runner) -> None:
    plan = bench.ModelsPlan(prompts=2, repeats=1, max_new_tokens=4, temperatures=(0.7,), also="noisy:0.3")
    report = bench.models(runner, plan, target=TOY, draft="lookup")
    records = {r["method"]: r for r in report.records}
    assert set(records) == {"plain", "specsample", "specsample:noisy:0.3"}
    mine, other = records["specsample"], records["specsample:noisy:0.3"]
    assert other["draft"] == "noisy:0.3" and mine["draft"] == "lookup"
    assert other["k"] == report.settings["also_k"] == 4  # its own default K, not the runner's 2
    assert other["ratio_vs_also"] == 1.0 and other["alpha"] is not None
    assert mine["ratio_vs_also"] == pytest.approx(mine["tokens_per_s"] / other["tokens_per_s"])
    low, high = mine["ratio_vs_also_ci95"]
    assert low <= high
    assert report.settings["methods"] == ["plain_ours", "specsample", "specsample:noisy:0.3"]
    with pytest.raises(ValueError, match="also: expected a drafter name, got ''"):
        bench.ModelsPlan(also="")


def test_a_hybrid_drafter_is_rated_by_kind_of_round() -> None:
    # Copies at prompt lookup's own c, model drafts at the model's: both timed at load.
    hybrid = runner_of("hybrid:noisy:0.3")
    plan = bench.ModelsPlan(prompts=2, repeats=1, max_new_tokens=4, temperatures=(0.7,))
    report = bench.models(hybrid, plan, target=TOY, draft="hybrid:noisy:0.3")
    kinds = report.settings["costs_by_kind"]
    spec = next(r for r in report.records if r["method"] == "specsample")
    assert set(kinds) == {"model", "copy"} and spec["c"] == kinds["model"] and spec["c_copy"] == kinds["copy"]
    assert bench.models(hybrid, plan).settings["costs_by_kind"] is not None
    plain = bench.models(runner_of("lookup"), plan, target=TOY, draft="lookup")  # not a hybrid
    assert plain.settings["costs_by_kind"] is None and plain.records[-1]["c_copy"] is None


def test_a_summary_that_fails_keeps_the_timed_runs(runner: specsample.Runner, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import json

    from specsample.cli._bench import show_models

    module = importlib.import_module("specsample.bench.models")  # the module, not its function

    def broken(*args: object, **kwargs: object) -> list[dict[str, object]]:
        raise ValueError("no summary")

    monkeypatch.setattr(module, "summarise", broken)
    plan = bench.ModelsPlan(prompts=2, repeats=1, max_new_tokens=3, temperatures=(0.7,))
    with pytest.raises(bench.UnsummarisedRuns, match="no summary") as caught:
        bench.models(runner, plan)
    assert len(caught.value.report.runs) == 2 * 2 and caught.value.report.records == []
    path = tmp_path / "kept.json"
    with pytest.raises(ValueError, match=r"the runs were written to .*kept\.json"):
        show_models(runner, plan, path=path)
    kept = json.loads(path.read_text())
    assert len(kept["runs"]) == 4 and kept["records"] == [] and kept["settings"]["repeats"] == 1


def test_batch_memory_and_greedy_return_records(runner: specsample.Runner) -> None:
    record = bench.batch(runner, max_new_tokens=3, prompts=bench.BATCH_PROMPTS[:3], sizes=(1, 2, 5),
                         repeats=2)
    assert (record["rows"], record["rows_compared"], record["max_new_tokens"]) == (3, 14, 3)
    assert record["rows_equal"] == 14  # float64: equal
    assert [r["batch"] for r in record["sizes"]] == [1, 2, 5]
    for r in record["sizes"]:
        assert len(r["speedups"]) == 2 and min(r["speedups"]) <= r["speedup_vs_plain"] <= max(r["speedups"])
    with pytest.raises(ValueError, match="repeats: expected an int >= 1"):
        bench.batch(runner, repeats=0)
    with pytest.raises(ValueError, match="sizes: expected distinct batch sizes"):
        bench.batch(runner, sizes=(2, 2))
    with pytest.raises(ValueError, match="sizes: expected an int >= 1"):
        bench.batch(runner, sizes=(0,))
    memory = bench.memory(runner, max_new_tokens=30, every=2)
    assert memory["tokens"] == 30 and len(memory["samples"]) >= 2 and memory["temperature"] == 0.7
    report = bench.greedy(runner, bench.GreedyPlan(prompts=2, max_new_tokens=4))
    assert (report.equal, report.near_ties, report.other) == (2, 0, 0)
    assert [r["tokens"] for r in report.records] == [4, 4]
    with pytest.raises(ValueError, match="prompts: expected a non-empty sequence of str"):
        bench.batch(runner, prompts="one prompt")
    with pytest.raises(ValueError, match="max_new_tokens: expected an int >= 1"):
        bench.memory(runner, max_new_tokens=0)
    with pytest.raises(TypeError, match="plan: expected a GreedyPlan"):
        bench.greedy(runner, None)  # type: ignore[arg-type]


def test_cost_ratio_is_measured_on_the_models(runner: specsample.Runner) -> None:
    ids, _ = runner.encode(["Once upon a time"])
    c = bench.measure_cost_ratio(runner.target, runner.drafter, ids, runner.config.params(), repeats=2)
    assert c > 0
    with pytest.raises(ValueError, match="prompt: expected at least 2 tokens"):
        bench.measure_cost_ratio(runner.target, runner.drafter, ids[:, :1], runner.config.params())
    with pytest.raises(ValueError, match="repeats: expected an int >= 1"):
        bench.measure_cost_ratio(runner.target, runner.drafter, ids, runner.config.params(), repeats=0)


def test_cost_ratio_times_the_draft_and_target_steps_in_turn(runner: specsample.Runner,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow spell of a shared machine must fall on both steps alike: after the warm-up the
    timed draft steps and target forwards alternate."""
    ids, _ = runner.encode(["Once upon a time"])
    calls: list[str] = []
    forward, propose = runner.target.forward, runner.drafter.propose
    monkeypatch.setattr(runner.target, "forward", lambda *a, **k: calls.append("t") or forward(*a, **k))
    monkeypatch.setattr(runner.drafter, "propose", lambda *a, **k: calls.append("d") or propose(*a, **k))
    bench.measure_cost_ratio(runner.target, runner.drafter, ids, runner.config.params(), repeats=3)
    timed = "".join(calls).split("t", 1)[1]  # after the prefill
    assert timed.endswith("dtdtdt"), "".join(calls)


def test_width_cost_is_measured_once_per_batch_and_width(runner: specsample.Runner) -> None:
    from specsample.engine.cost import WidthCost

    ids, _ = runner.encode(["Once upon a time"])
    cost = WidthCost(runner.target, ids, repeats=2)
    assert cost(4, 1) == 1.0 and not cost.measured
    first = cost(4, 5)
    assert first > 0 and cost.measured == {(4, 5): first}
    assert cost(4, 5) == first  # kept, not measured again
    for args, match in [((0, 5), "batch: expected an int >= 1"), ((4, 0), "width: expected an int >= 1")]:
        with pytest.raises(ValueError, match=match):
            cost(*args)
    with pytest.raises(ValueError, match=r"prompt: expected ids of shape \[1, T\]"):
        WidthCost(runner.target, ids[0])
    with pytest.raises(TypeError, match="target: expected a Model"):
        WidthCost(object(), ids)  # type: ignore[arg-type]
