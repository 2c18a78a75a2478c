"""Config: one frozen value from kwargs, a dict, a TOML file or the environment."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specsample.api.config import ENV_PREFIX, Config
from specsample.core.params import SamplingParams
from specsample.engine.policy import AdaptiveK, ConstantK


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "specsample.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = Config()
    assert config.backend == "reference"
    assert config.k is None  # settled by `load` once the drafter is known (test_runner.py)
    assert config.seed == 0
    assert dict(config.options) == {}
    assert config.params() == SamplingParams()
    assert config.policy() == ConstantK(k=4)


def test_from_kwargs() -> None:
    config = Config(backend="torch", k=2, temperature=0.5, top_k=10, top_p=0.9, min_p=0.05, seed=7,
                    options={"device": "cpu"})
    assert config.params() == SamplingParams(temperature=0.5, top_k=10, top_p=0.9, min_p=0.05)
    assert config.policy() == ConstantK(k=2)
    assert config.seed == 7
    assert config.options["device"] == "cpu"


def test_frozen() -> None:
    config = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.backend = "torch"  # type: ignore[misc]


def test_options_read_only_and_detached_from_the_input() -> None:
    source = {"device": "cpu"}
    config = Config(options=source)
    with pytest.raises(TypeError):
        config.options["device"] = "cuda"  # type: ignore[index]
    source["device"] = "cuda"
    assert config.options["device"] == "cpu"


def test_from_dict() -> None:
    config = Config.from_dict({"backend": "static-cpu", "k": 3, "seed": 11, "options": {"buckets": [64]}})
    assert (config.backend, config.k, config.seed) == ("static-cpu", 3, 11)
    assert config.options["buckets"] == [64]


def test_from_dict_unknown_keys_lists_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown keys") as info:
        Config.from_dict({"backend": "reference", "bakend": "torch", "temprature": 1.0})
    message = str(info.value)
    assert "bakend" in message and "temprature" in message
    for known in ("backend", "k", "temperature", "top_k", "top_p", "min_p", "seed", "options"):
        assert repr(known) in message


def test_from_toml(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'backend = "torch"\nk = "adaptive"\ntemperature = 0.8\ntop_p = 0.95\n'
                           'seed = 3\n\n[options]\ndevice = "cpu"\ncost_ratio = 0.25\n')
    config = Config.from_toml(path)
    assert config.backend == "torch"
    assert config.params() == SamplingParams(temperature=0.8, top_p=0.95)
    assert config.seed == 3
    assert dict(config.options) == {"device": "cpu", "cost_ratio": 0.25}
    policy = config.policy()
    assert isinstance(policy, AdaptiveK)
    assert policy.c == 0.25
    assert Config.from_toml(str(path)) == config


def test_from_toml_unknown_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown keys \['topk'\]"):
        Config.from_toml(_toml(tmp_path, "topk = 3\n"))


def test_missing_toml_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(FileNotFoundError, match=r"nope\.toml"):
        Config.from_toml(missing)
    with pytest.raises(FileNotFoundError, match=r"nope\.toml"):
        Config.load(missing, environ={})


def test_from_env() -> None:
    environ = {"SPECSAMPLE_BACKEND": "torch", "SPECSAMPLE_K": "6", "SPECSAMPLE_TEMPERATURE": "0.25",
               "SPECSAMPLE_TOP_K": "40", "SPECSAMPLE_TOP_P": "0.5", "SPECSAMPLE_MIN_P": "0.1",
               "SPECSAMPLE_SEED": "99", "UNRELATED": "x", "SPECSAMPLE": "y"}
    config = Config.from_env(environ)
    assert config.backend == "torch"
    assert config.k == 6
    assert config.params() == SamplingParams(temperature=0.25, top_k=40, top_p=0.5, min_p=0.1)
    assert config.seed == 99


def test_from_env_adaptive_and_none() -> None:
    config = Config.from_env({"SPECSAMPLE_K": "adaptive", "SPECSAMPLE_TOP_K": "none",
                              "SPECSAMPLE_TOP_P": "", "SPECSAMPLE_MIN_P": "None"})
    assert config.k == "adaptive"
    assert isinstance(config.policy(), AdaptiveK)
    assert (config.top_k, config.top_p, config.min_p) == (None, None, None)


def test_from_env_empty_is_defaults() -> None:
    assert Config.from_env({}) == Config()


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSAMPLE_BACKEND", "gaudi")
    monkeypatch.setenv("SPECSAMPLE_SEED", "5")
    assert Config.from_env().backend == "gaudi"
    loaded = Config.load()
    assert (loaded.backend, loaded.seed) == ("gaudi", 5)


@pytest.mark.parametrize(("variable", "raw"), [
    ("K", "four"), ("K", "Adaptive"), ("TEMPERATURE", "hot"), ("SEED", "1.5"), ("TOP_K", "x"),
])
def test_from_env_unparsable_names_the_variable(variable: str, raw: str) -> None:
    with pytest.raises(ValueError, match=f"{ENV_PREFIX}{variable}: expected a number") as info:
        Config.from_env({ENV_PREFIX + variable: raw})
    assert repr(raw) in str(info.value)


def test_load_precedence(tmp_path: Path) -> None:
    environ = {"SPECSAMPLE_BACKEND": "torch", "SPECSAMPLE_K": "2", "SPECSAMPLE_TEMPERATURE": "0.5",
               "SPECSAMPLE_SEED": "1", "SPECSAMPLE_MIN_P": "0.2"}
    path = _toml(tmp_path, 'k = 3\ntemperature = 0.6\ntop_k = 5\nseed = 2\n'
                           '[options]\na = 1\nb = 1\n')
    config = Config.load(path, environ=environ, values={"temperature": 0.7, "seed": 3,
                                                         "options": {"b": 2, "c": 2}},
                         seed=4, options={"c": 3})
    assert config.backend == "torch"  # environment only
    assert config.min_p == 0.2  # environment only
    assert config.k == 3  # file beats environment
    assert config.top_k == 5  # file only
    assert config.temperature == 0.7  # dict beats file and environment
    assert config.seed == 4  # keyword beats everything
    assert dict(config.options) == {"a": 1, "b": 2, "c": 3}  # merged key by key


def test_load_without_sources_is_defaults() -> None:
    assert Config.load(environ={}) == Config()


def test_load_keyword_overrides_environment() -> None:
    config = Config.load(environ={"SPECSAMPLE_BACKEND": "torch"}, backend="reference")
    assert config.backend == "reference"


def test_load_unknown_keyword_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"unknown keys \['colour'\]; known: "):
        Config.load(environ={}, colour="red")


def test_adaptive_k_uses_cost_ratio_option() -> None:
    config = Config(k="adaptive", options={"cost_ratio": 0.5})
    policy = config.policy()
    assert isinstance(policy, AdaptiveK)
    assert policy.c == 0.5
    assert isinstance(Config(k="adaptive").policy(), AdaptiveK)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"k": 0}, ValueError, r"k: expected an int >= 1 or 'adaptive', got 0"),
    ({"k": -2}, ValueError, r"k: expected an int >= 1 or 'adaptive', got -2"),
    ({"k": "fast"}, ValueError, r"k: expected an int >= 1 or 'adaptive', got 'fast'"),
    ({"k": 2.0}, ValueError, r"k: expected an int >= 1 or 'adaptive', got 2.0"),
    ({"k": True}, ValueError, r"k: expected .*got True"),
    ({"temperature": -1.0}, ValueError, r"temperature: expected >= 0, got -1.0"),
    ({"temperature": "warm"}, TypeError, r"temperature: expected a number, got str 'warm'"),
    ({"top_p": 0.0}, ValueError, r"top_p: expected a value in \(0, 1\] or None, got 0.0"),
    ({"top_p": 1.5}, ValueError, r"top_p: expected a value in \(0, 1\] or None, got 1.5"),
    ({"top_k": 0}, ValueError, r"top_k: expected >= 1 or None, got 0"),
    ({"seed": -1}, ValueError, r"seed: expected an int >= 0, got -1"),
    ({"seed": 1.5}, TypeError, r"seed: expected an int, got float 1.5"),
    ({"seed": "3"}, TypeError, r"seed: expected an int, got str '3'"),
    ({"seed": True}, TypeError, r"seed: expected an int, got bool True"),
    ({"backend": ""}, ValueError, r"backend: expected a backend name, got ''"),
    ({"backend": 3}, ValueError, r"backend: expected a backend name, got 3"),
    ({"options": [("device", "cpu")]}, TypeError, r"options: expected a mapping, got list"),
    ({"options": None}, TypeError, r"options: expected a mapping, got NoneType"),
])
def test_bad_values(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Config(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        Config.from_dict(kwargs)


def test_bad_value_from_toml(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"top_p: expected a value in \(0, 1\]"):
        Config.from_toml(_toml(tmp_path, "top_p = 2.0\n"))
