"""The verifier registry: names to rules, callables through, clear errors."""

from __future__ import annotations

import pytest

import specsample
from specsample import get_verifier, verify, verify_block
from specsample.core.verifiers import VERIFIERS


def test_names_map_to_the_rules():
    assert get_verifier("token") is verify
    assert get_verifier("block") is verify_block
    assert set(VERIFIERS) == {"token", "block"}
    assert specsample.verify_block is verify_block and specsample.get_verifier is get_verifier


def test_a_callable_passes_through():
    def mine(*args, **kwargs):
        return verify(*args, **kwargs)

    assert get_verifier(mine) is mine


def test_unknown_names_and_bad_types_are_clear_errors():
    with pytest.raises(ValueError, match=r"verifier: unknown name 'tree'; known: block, token"):
        get_verifier("tree")
    with pytest.raises(TypeError, match=r"verifier: expected a name \(block, token\) or a callable, got int"):
        get_verifier(3)  # type: ignore[arg-type]
