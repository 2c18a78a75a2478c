"""Negative controls: every known bug of TESTING.md must make the law check fail.

The harness is tests/test_generate.py's: 200,000 independent rows, the first 3
emitted tokens jointly (M = 27 outcomes), goodness_of_fit at alpha = 1e-4
(tau ~= 0.0084; a law at TV >= 0.017 is caught with probability >= 1 - 1e-4).
Each broken variant below moves the law by far more than that (its TV is
asserted too), and the one harmless variant (never accept) must pass.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_generate import ROWS, expected_law, first_three, models

from specsample import SamplingParams, verify
from specsample.testing import broken, goodness_of_fit


@pytest.mark.parametrize("name", ["resample-from-p", "always-accept", "bonus-wrong-position",
                                  "p-shifted", "lenient-0.5"])
def test_broken_verifiers_are_rejected(name):
    target, draft = models()
    from specsample import ModelDrafter

    samples = first_three(target, ModelDrafter(draft), rows=ROWS, params=SamplingParams(), k=2,
                          seed=21, verifier=broken.VERIFIERS[name])
    result = goodness_of_fit(samples, expected_law(target, SamplingParams()))
    assert not result.passed, f"{name} was not caught: {result}"
    assert result.tv > 2 * result.tau, f"{name} moves the law by only {result.tv}"


def test_never_accepting_is_slow_but_exact():
    target, draft = models()
    from specsample import ModelDrafter

    samples = first_three(target, ModelDrafter(draft), rows=ROWS, params=SamplingParams(), k=2,
                          seed=22, verifier=broken.never_accept)
    result = goodness_of_fit(samples, expected_law(target, SamplingParams()))
    assert result.passed, str(result)


@pytest.mark.parametrize(("name", "params"), [
    ("raw-logits-q", SamplingParams(top_k=2)),
    ("argmax-draft-softmax-q", SamplingParams()),
    ("temperature-in-verify-only", SamplingParams(temperature=0.5)),
    ("drop-low-confidence", SamplingParams()),
])
def test_drafters_that_misreport_q_are_rejected(name, params):
    target, draft = models()
    drafter = broken.DRAFTERS[name](draft)
    samples = first_three(target, drafter, rows=ROWS, params=params, k=2, seed=23)
    result = goodness_of_fit(samples, expected_law(target, params))
    assert not result.passed, f"{name} was not caught: {result}"


def test_the_same_drafter_reporting_honestly_passes():
    target, draft = models()
    params = SamplingParams(top_k=2)
    honest = broken.MisreportingDrafter(draft, sample_with=lambda p: p, report_with=lambda p: p)
    result = goodness_of_fit(first_three(target, honest, rows=ROWS, params=params, k=2, seed=24),
                             expected_law(target, params))
    assert result.passed, str(result)


def test_accepting_with_u_le_p_over_q_is_caught():
    """u * q(x) <= p(x) accepts p(x) = 0 at u = 0, a measure-zero event for continuous u.

    To make it observable the uniforms are drawn on the grid j / 256 (legal
    values in [0, 1)). The case is built so the correct rule is exact for any
    u < 1: p = (0, 1/2, 1/4, 1/4), q uniform, K = 1: token 0 is never accepted,
    the others always, and the residual is a point mass on token 1. The broken
    rule emits token 0 with probability 1/4 * 1/256; with n = 100,000 that is
    ~98 impossible outcomes, and a single one fails goodness_of_fit.
    """
    rows = 100_000
    rng = np.random.default_rng(25)
    p_row = np.array([0.0, 0.5, 0.25, 0.25])
    p = np.broadcast_to(p_row, (rows, 2, 4))
    q = np.broadcast_to(np.full(4, 0.25), (rows, 1, 4))
    drafts = rng.integers(0, 4, size=(rows, 1))
    u = rng.integers(0, 256, size=(rows, 2)) / 256
    good = goodness_of_fit(verify(drafts, q, p, u).tokens[:, 0], p_row)
    bad = goodness_of_fit(broken.accept_if_le(drafts, q, p, u).tokens[:, 0], p_row)
    assert good.passed, str(good)
    assert not bad.passed and bad.unexpected > 0, str(bad)
