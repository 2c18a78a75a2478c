"""The public API emits the recorded tokens for fixed seeds (tests/golden_runs.py).

Bit-identity, not statistics: every run of `RUNS` must give the ids recorded in
`tests/data/golden_tokens.json`, token for token, on the reference and torch backends.
"""

from __future__ import annotations

import json

import pytest

from tests.golden_runs import GOLDEN, RUNS, recorded, run

RECORDED = json.loads(GOLDEN.read_text())


def test_every_run_is_recorded() -> None:
    assert sorted(RECORDED) == sorted(RUNS)


@pytest.mark.parametrize("name", [n for n in RUNS if n.startswith("reference/")])
def test_reference_tokens_as_recorded(name: str) -> None:
    assert run(name) == recorded(name, RECORDED)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in RUNS if n.startswith("torch/")])
def test_torch_tokens_as_recorded(name: str) -> None:
    pytest.importorskip("torch")
    assert run(name) == recorded(name, RECORDED)


def test_a_changed_token_is_caught() -> None:
    """Negative control: the comparison sees one token changed in one row."""
    name = "reference/noisy/T1"
    changed = [list(row) for row in RECORDED[name]]
    changed[0][-1] = (changed[0][-1] + 1) % 8
    assert run(name) != changed
