"""SamplingParams: a frozen, keyword-only, validated value."""

from __future__ import annotations

import dataclasses
import math

import pytest

from specsample.core.params import SamplingParams


def test_defaults_are_plain_sampling() -> None:
    params = SamplingParams()
    assert (params.temperature, params.top_k, params.top_p, params.min_p) == (1.0, None, None, None)
    assert not params.greedy


def test_temperature_zero_is_greedy() -> None:
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=1e-9).greedy


@pytest.mark.parametrize("kwargs", [
    {"temperature": 0.0}, {"temperature": 7}, {"top_k": 1}, {"top_k": 50},
    {"top_p": 1.0}, {"top_p": 1e-6}, {"min_p": 0.0}, {"min_p": 1.0}, {"min_p": 0.05},
    {"temperature": 0.7, "top_k": 3, "top_p": 0.9, "min_p": 0.1},
])
def test_accepts_boundary_values(kwargs: dict[str, float]) -> None:
    params = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(params, name) == value


def test_frozen() -> None:
    params = SamplingParams(temperature=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 1.0  # type: ignore[misc]
    assert dataclasses.replace(params, top_k=2) == SamplingParams(temperature=0.5, top_k=2)


def test_keyword_only() -> None:
    with pytest.raises(TypeError):
        SamplingParams(0.5)  # type: ignore[misc]


def test_equal_values_are_equal_and_hashable() -> None:
    assert SamplingParams(top_p=0.9) == SamplingParams(top_p=0.9)
    assert len({SamplingParams(top_p=0.9), SamplingParams(top_p=0.9)}) == 1


@pytest.mark.parametrize(("name", "value", "error", "expectation"), [
    ("temperature", -0.1, ValueError, ">= 0"),
    ("temperature", -1, ValueError, ">= 0"),
    ("temperature", math.nan, ValueError, "finite"),
    ("temperature", math.inf, ValueError, "finite"),
    ("temperature", "1.0", TypeError, "number"),
    ("temperature", None, TypeError, "number"),
    ("temperature", True, TypeError, "number"),
    ("top_k", 0, ValueError, ">= 1"),
    ("top_k", -3, ValueError, ">= 1"),
    ("top_k", 2.5, TypeError, "int"),
    ("top_k", "3", TypeError, "int"),
    ("top_k", True, TypeError, "int"),
    ("top_p", 0.0, ValueError, "(0, 1]"),
    ("top_p", 0, ValueError, "(0, 1]"),
    ("top_p", 1.5, ValueError, "(0, 1]"),
    ("top_p", -0.2, ValueError, "(0, 1]"),
    ("top_p", math.nan, ValueError, "finite"),
    ("top_p", "0.9", TypeError, "number"),
    ("min_p", -0.01, ValueError, "[0, 1]"),
    ("min_p", 1.01, ValueError, "[0, 1]"),
    ("min_p", math.inf, ValueError, "finite"),
    ("min_p", [0.1], TypeError, "number"),
])
def test_bad_value_names_argument_expectation_and_value(name: str, value: object,
                                                        error: type[Exception], expectation: str) -> None:
    with pytest.raises(error) as info:
        SamplingParams(**{name: value})
    message = str(info.value)
    assert message.startswith(f"{name}:")
    assert expectation in message
    assert str(value) in message or repr(value) in message
