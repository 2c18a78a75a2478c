"""Every command honours every flag it accepts, or refuses it with an error naming the flag.

Each run is small (a few tokens, n = 100, one prompt) so that the flag, not the
model, is what is tested. The commands run on the reference backend (toy n-gram
models and its toy tokenizer: seconds); the options only a torch backend takes
(--device, --dtype) are refused there and honoured on SmolLM2-135M.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsample.api.config import ENV_PREFIX
from specsample.cli import main

TOY = "ngram:vocab=8,order=2,seed=1"
REFERENCE = ["--backend", "reference", "--target", TOY]
MODEL_FLAGS = {"--backend": "torch", "--target": "smollm2", "--draft": "int8", "--k": "2",
               "--temperature": "0.5", "--top-k": "5", "--top-p": "0.9", "--min-p": "0.05", "--seed": "3",
               "--max-new-tokens": "2", "--device": "cpu", "--dtype": "bfloat16"}


@pytest.fixture(scope="module")
def smol() -> object:
    from specsample_backends.torch import loading

    return loading.load_target("smollm2")  # warms the module cache that every command reads


# ---- refusals: checked before (or without) running a model --------------------------------

BENCH_ONLY = {"--repeats": "2", "--vocab": "64", "--prompts": "1", "--temperatures": "0",
              "--versus": "torch", "--also": "int8", "--skip-hf": None}
REFUSED = [("core", f) for f in [*MODEL_FLAGS, "--prompts", "--temperatures", "--versus", "--also",
                                 "--skip-hf"]]
REFUSED += [("models", "--temperature"), ("models", "--vocab")]
REFUSED += [("batch", f) for f in ("--temperature", "--top-k", "--top-p", "--min-p", "--vocab",
                                   "--prompts", "--temperatures", "--versus", "--also", "--skip-hf")]
REFUSED += [("memory", f) for f in ("--repeats", "--vocab", "--prompts", "--temperatures", "--versus",
                                    "--skip-hf")]
REFUSED += [("greedy", f) for f in ("--temperature", "--top-k", "--top-p", "--min-p", "--repeats", "--vocab",
                                    "--temperatures", "--versus", "--skip-hf")]


@pytest.mark.parametrize(("what", "option"), REFUSED)
def test_bench_refuses_a_flag_it_does_not_use(what: str, option: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    value = {**MODEL_FLAGS, **BENCH_ONLY, "--draft": "lookup", "--target": "other"}[option]
    argv = ["bench", what, option] + ([] if value is None else [value])
    assert main(argv) == 2
    assert f"{option}: not used by `specsample bench {what}`" in capsys.readouterr().err


def test_check_refuses_max_new_tokens_and_settings_beside_sampling_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--max-new-tokens", "5"]) == 2
    assert "--max-new-tokens: not used by `specsample check`" in capsys.readouterr().err
    assert main(["check", "--settings", "t1.0", "--temperature", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "--settings: give either --settings or sampling options" in err and "temperature" in err


def test_demo_refuses_rows_without_toy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--rows", "2000"]) == 2
    assert "--rows: only the toy demo" in capsys.readouterr().err


# ---- honoured: the flag shows up in what ran ----------------------------------------------

def test_demo_toy_honours_rows_k_and_seed(capsys: pytest.CaptureFixture[str]) -> None:
    main(["demo", "--toy", "--rows", "1000", "--k", "2", "--seed", "1"])
    first = capsys.readouterr().out
    assert "K=2; 1,000 independent rows" in first
    main(["demo", "--toy", "--rows", "1000", "--k", "2", "--seed", "2"])
    assert capsys.readouterr().out != first  # another seed, other samples


def test_bench_core_honours_json_repeats_and_vocab(tmp_path: Path) -> None:
    path = tmp_path / "core.json"
    assert main(["bench", "core", "--repeats", "1", "--vocab", "64", "--json", str(path)]) == 0
    records = json.loads(path.read_text())["records"]
    assert records and all(r["vocab"] == 64 and r["repeats"] == 1 for r in records)


def test_generate_honours_every_model_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["generate", "--prompt", "Hi", *REFERENCE, "--draft", "lookup", "--k", "2", "--temperature", "0.5",
            "--top-k", "5", "--top-p", "0.9", "--min-p", "0.05", "--seed", "3", "--max-new-tokens", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("> Hi\n")
    settings = out.strip().splitlines()[-1]
    for text in ("backend reference", f"target {TOY}", "drafter lookup: PromptLookupDrafter", "K=2",
                 "temperature=0.5, top_k=5, top_p=0.9, min_p=0.05", "seed 3", "max new tokens 2"):
        assert text in settings, text
    assert "\n2 tokens in " in out  # no EOS on the toy tokenizer: exactly --max-new-tokens
    toml = tmp_path / "run.toml"
    toml.write_text(f'backend = "reference"\ntarget = "{TOY}"\ndraft = "noisy:0.2"\n'
                    'k = 3\ntemperature = 0.0\n')
    assert main(["generate", "--prompt", "Hi", "--config", str(toml), "--max-new-tokens", "2"]) == 0
    assert "drafter noisy:0.2: ModelDrafter, K=3, SamplingParams(temperature=0.0" in capsys.readouterr().out
    for option, value in (("--device", "cpu"), ("--dtype", "float32")):
        assert main(["generate", "--prompt", "Hi", *REFERENCE, option, value]) == 2
        assert "options: the reference backend takes none" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.usefixtures("smol")
def test_device_and_dtype_reach_the_torch_model(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--prompt", "Hi", "--backend", "torch", "--draft", "lookup", "--device", "cpu",
            "--dtype", "bfloat16", "--max-new-tokens", "2"]
    assert main(argv) == 0
    settings = capsys.readouterr().out.strip().splitlines()[-1]
    assert "target smollm2" in settings and "device cpu, dtype torch.bfloat16" in settings


def test_bench_models_honours_its_flags(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    argv = ["bench", "models", *REFERENCE, "--draft", "lookup", "--k", "2", "--top-k", "5", "--top-p", "0.9",
            "--min-p", "0.05", "--seed", "3", "--max-new-tokens", "2", "--repeats", "2", "--prompts", "3",
            "--temperatures", "0,0.5", "--versus", "reference", "--also", "noisy:0.3", "--skip-hf",
            "--json", str(path)]
    assert main(argv) == 0
    payload = json.loads(path.read_text())
    s = payload["settings"]
    assert (s["target"], s["draft"], s["k"], s["top_k"], s["top_p"], s["min_p"], s["seed"]) == \
        (TOY, "lookup", 2, 5, 0.9, 0.05, 3)
    assert (s["max_new_tokens"], s["repeats"], s["prompts"], s["temperatures"]) == (2, 2, 3, [0.0, 0.5])
    assert s["backend"] == "reference" and s["versus"] == "reference" and s["also"] == "noisy:0.3"
    assert set(s["methods"]) == {"plain_ours", "specsample", "specsample@reference", "specsample:noisy:0.3"}
    runs = payload["runs"]
    assert {r["temperature"] for r in runs} == {0.0, 0.5} and {r["prompt"] for r in runs} == {0, 1, 2}
    assert {r["repeat"] for r in runs} == {0, 1} and all(r["new_tokens"] == 2 for r in runs)
    spec = [r for r in runs if r["method"] == "specsample"]
    assert {r["k"] for r in spec} == {2} and all(set(r["metrics"]["k_counts"][3:]) <= {0} for r in spec)
    assert (tmp_path / "models_tokens_per_s.png").is_file()


def test_bench_batch_memory_and_greedy_honour_their_flags(tmp_path: Path) -> None:
    common = [*REFERENCE, "--draft", "lookup", "--k", "2", "--seed", "3", "--max-new-tokens", "3"]
    assert main(["bench", "batch", *common, "--repeats", "2", "--json", str(tmp_path / "b.json")]) == 0
    batch = json.loads((tmp_path / "b.json").read_text())
    assert batch["records"][0]["max_new_tokens"] == 3 and batch["records"][0]["k"] == 2
    assert batch["records"][0]["repeats"] == 2
    assert (batch["settings"]["target"], batch["settings"]["draft"], batch["settings"]["seed"]) == \
        (TOY, "lookup", 3)
    assert main(["bench", "memory", *common, "--temperature", "0.5", "--top-k", "5", "--top-p", "0.9",
                 "--min-p", "0.05", "--json", str(tmp_path / "m.json")]) == 0
    memory = json.loads((tmp_path / "m.json").read_text())
    assert memory["records"][0]["tokens"] == 3 and memory["records"][0]["temperature"] == 0.5
    assert (memory["settings"]["top_k"], memory["settings"]["top_p"], memory["settings"]["min_p"]) == \
        (5, 0.9, 0.05)
    assert main(["bench", "greedy", *common, "--prompts", "2", "--json", str(tmp_path / "g.json")]) == 0
    greedy = json.loads((tmp_path / "g.json").read_text())
    assert len(greedy["records"]) == 2 and greedy["records"][0]["tokens"] == 3 and greedy["k"] == 2


def test_check_checks_the_sampling_setting_given(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The setting the flags give is the one checked (n = 100: the flag is under test, not the law)."""
    common = ["check", *REFERENCE, "--sampler", "engine", "--draft", "lookup", "--n", "100", "--rows", "50",
              "--k", "2", "--seed", "5", "--alpha", "1e-6", "--tv", "0.5", "--prompt", "Once upon",
              "--plot", str(tmp_path / "c.png")]
    main([*common, "--temperature", "0.5", "--top-k", "4", "--top-p", "0.95", "--min-p", "0.01"])
    out = capsys.readouterr().out
    assert "t0.5-k4-p0.95-m0.01 (" in out and "t1.0" not in out and "t0.7-p0.9" not in out
    assert "SamplingParams(temperature=0.5, top_k=4, top_p=0.95, min_p=0.01)" in out
    assert f"target {TOY}, draft lookup, backend reference, K=2" in out
    assert "n=100 per method" in out and "'Once upon'" in out and "alpha=1e-06" in out
    assert "detect TV 0.5" in out and (tmp_path / "c.png").stat().st_size > 1000
    monkeypatch.setenv(f"{ENV_PREFIX}TEMPERATURE", "0.8")  # the config, not a flag
    main(common)
    out = capsys.readouterr().out
    assert "t0.8 (" in out and "t1.0" not in out
    monkeypatch.delenv(f"{ENV_PREFIX}TEMPERATURE")
    main([*common, "--draft", "noisy:0.2", "--broken", "resample-from-p"])
    out = capsys.readouterr().out
    assert "t1.0 (" in out and "t0.7-p0.9 (" in out  # no sampling option: the built-in pair
    assert "the core round (BROKEN rule 'resample-from-p')" in out
    main([*common, "--settings", "t0.7-p0.9"])
    out = capsys.readouterr().out
    assert "t0.7-p0.9 (" in out and "t1.0" not in out
    tree = ["check", *REFERENCE, "--sampler", "tree", "--draft", "noisy:0.2", "--n", "100"]
    assert main([*tree, "--rows", "50"]) == 2
    assert "--rows: only the engine sampler" in capsys.readouterr().err
    main([*tree, "--k", "3", "--temperature", "0.9", "--plot", str(tmp_path / "t.png")])
    out = capsys.readouterr().out
    assert "tree sampler" in out and "K=3" in out and "t0.9 (" in out and "draft noisy:0.2" in out


def test_check_against_the_exact_law_draws_no_plain_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """--against exact: the first token and the first 3 tokens against the exact law, no plain
    sample (plain generation is never called), n from the one-sample size for --tv, and the
    JSON beside the plot."""
    from specsample.api.runner import Runner

    real = Runner.generate_plain
    calls: list[int] = []

    def counted(self: Runner, *args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Runner, "generate_plain", counted)
    common = ["check", *REFERENCE, "--sampler", "engine", "--draft", "lookup", "--rows", "50", "--k", "2",
              "--alpha", "1e-6", "--prompt", "Once upon", "--temperature", "0.9",
              "--plot", str(tmp_path / "c.png")]
    assert main([*common, "--against", "exact", "--tv", "0.5"]) == 0
    assert calls == []
    out = capsys.readouterr().out
    assert "against exact" in out and "one-sample (against the exact law) size to detect TV 0.5" in out
    assert "spec vs plain" not in out and "first 3 tokens, spec vs exact p (the 7 most likely + rest)" in out
    assert "samples digest (speculative): " in out
    record = json.loads((tmp_path / "c.json").read_text())
    from specsample.testing import samples_needed

    n = samples_needed(0.5, m=8, alpha=1e-6, beta=1e-6)
    assert record["n"] == n and f"n={n:,} per method" in out and 0.45 < record["tv_detected"] <= 0.5
    assert record["against"] == "exact" and record["passed"] is True and record["drafter"]["class"]
    (setting,) = record["settings"].values()
    assert len(setting["digests"]) == 1 and set(setting["tests"]) == {
        "first token, spec vs exact p (top 7 + rest)",
        "first 3 tokens, spec vs exact p (the 7 most likely + rest)"}
    assert len(setting["sequences"]) == 7 and all(len(q) == 3 for q in setting["sequences"])
    assert setting["sequence_probabilities"] == sorted(setting["sequence_probabilities"], reverse=True)
    assert main([*common, "--n", "100"]) == 0  # both (the default): the plain tests too
    assert len(calls) == 2  # 100 rows in calls of 50
    out = capsys.readouterr().out
    assert "first 3 tokens, spec vs plain" in out and "first 3 tokens, spec vs exact p" in out
    assert "two-sample size" in out and "n=100 per method" in out
    assert len(json.loads((tmp_path / "c.json").read_text())["settings"]["t0.9"]["digests"]) == 2
    with pytest.raises(SystemExit):
        main([*common, "--against", "plain"])
    assert "argument --against: invalid choice: 'plain'" in capsys.readouterr().err


def test_check_against_the_exact_law_passes_the_rule_and_fails_a_broken_one(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The tree sampler on the toy target (T = 1, K = 2, a draft at noise 0.5), tested against
    the exact law only, at the n that detects TV 0.05 with both error rates <= 1e-3 (9,957):
    the rule passes; resampling from p after a rejection fails both tests."""
    common = ["check", *REFERENCE, "--sampler", "tree", "--draft", "noisy:0.5", "--k", "2", "--against",
              "exact", "--tv", "0.05", "--settings", "t1.0", "--plot", str(tmp_path / "c.png")]
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "n=9,957 per method" in out and out.rstrip().endswith("check: PASS")
    assert main([*common, "--broken", "resample-from-p"]) == 1
    out = capsys.readouterr().out
    assert "first token, spec vs exact p (top 7 + rest): FAIL" in out
    assert "first 3 tokens, spec vs exact p (the 7 most likely + rest): FAIL" in out
    assert out.rstrip().endswith("check: FAIL")


def test_check_runs_the_verifier_the_config_names(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`verifier = "block"` in the config (here the environment) is the rule the check samples."""
    from specsample.cli import _check
    from specsample.core.verify_block import verify_block

    seen: list[object] = []
    real = _check.tree_samples

    def recording(*args: object, **kwargs: object) -> object:
        seen.append(kwargs["verifier"])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_check, "tree_samples", recording)
    monkeypatch.setenv(f"{ENV_PREFIX}VERIFIER", "block")
    tree = ["check", *REFERENCE, "--sampler", "tree", "--draft", "noisy:0.2", "--n", "100", "--k", "2",
            "--temperature", "0.9"]
    assert main(tree) == 0
    assert "verifier block" in capsys.readouterr().out and seen == [verify_block]
    main([*tree, "--broken", "resample-from-p"])
    assert "verifier resample-from-p" in capsys.readouterr().out and seen[-1] is not verify_block
    monkeypatch.delenv(f"{ENV_PREFIX}VERIFIER")
    assert main([*tree, "--verifier", "block"]) == 0  # the flag says the same
    assert "verifier block" in capsys.readouterr().out and seen[-1] is verify_block
    assert main([*tree, "--verifier", "token"]) == 0
    assert "verifier token" in capsys.readouterr().out and seen[-1] is not verify_block
    with pytest.raises(SystemExit):  # not a rule the option offers: argparse refuses it
        main([*tree, "--verifier", "tree"])
    assert "--verifier: invalid choice: 'tree'" in capsys.readouterr().err
