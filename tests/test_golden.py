"""The public API emits the recorded tokens for fixed seeds (tests/golden_runs.py).

Bit-identity, not statistics: every run of `RUNS` must give the ids recorded in
`tests/data/golden_tokens.json`, token for token, on the reference and torch backends.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.golden_runs import GOLDEN, RUNS, loading, run

RECORDED = json.loads(GOLDEN.read_text())


def test_every_run_is_recorded() -> None:
    assert sorted(RECORDED) == sorted(RUNS)


@pytest.mark.parametrize("name", [n for n in RUNS if n.startswith("reference/")])
def test_reference_tokens_as_recorded(name: str) -> None:
    assert run(name) == RECORDED[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in RUNS if n.startswith("torch/")])
def test_torch_tokens_as_recorded(name: str) -> None:
    pytest.importorskip("torch")
    assert run(name) == RECORDED[name]


def _shape_at(name: str, c: float, slope: float) -> tuple[str, Any]:
    """What run `name` loads when every cost measured at load is c and a verify of that slope:
    the drafter in words (its rated shape) and the K."""
    import specsample

    with loading(name, (c, slope)):
        runner = specsample.load(specsample.Config(**RUNS[name][0]))
    return runner.drafter_note(), runner.config.k


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, (_, _, fixed) in RUNS.items() if not fixed])
def test_a_run_with_measured_costs_fixes_them(name: str) -> None:
    """A run whose drafter or K is chosen from costs timed at load must fix those costs, or
    its tokens hang on the machine's load: such a run loads differently at a cheap draft
    and flat verify than at a dear draft and steep verify. The runs that do not fix them
    load alike at both."""
    if RUNS[name][0]["backend"] == "torch":
        pytest.importorskip("torch")
    assert _shape_at(name, 0.01, 0.0) == _shape_at(name, 0.9, 0.5)


def test_a_run_rated_by_timings_is_seen() -> None:
    """Negative control: "head" loaded at the two costs above takes different shapes (a
    fan-out against the chain), so a head run left unfixed fails the test above."""
    pytest.importorskip("torch")
    assert _shape_at("torch/head/T0.7", 0.01, 0.0) != _shape_at("torch/head/T0.7", 0.9, 0.5)


def test_a_changed_token_is_caught() -> None:
    """Negative control: the comparison sees one token changed in one row."""
    name = "reference/noisy/T1"
    changed = [list(row) for row in RECORDED[name]]
    changed[0][-1] = (changed[0][-1] + 1) % 8
    assert run(name) != changed
