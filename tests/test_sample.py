"""sample: the inverse CDF, never a zero-probability token, backends agree, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specsample import sample


def _brute(probs: list[float], u: float) -> int:
    total = sum(probs)
    acc = 0.0
    for j, p in enumerate(probs):
        acc += p
        if acc > u * total:
            return j
    raise AssertionError("unreachable for u < 1")


@settings(max_examples=300, deadline=None)
@given(probs=st.lists(st.sampled_from([0.0, 0.0, 1e-300, 0.25, 1.0, 3.0]), min_size=1, max_size=8)
       .filter(lambda v: sum(v) > 0),
       u=st.sampled_from([0.0, 0.1, 0.5, 0.999, 1 - 2**-53]) | st.floats(0, 1, exclude_max=True))
def test_matches_the_definition_and_never_returns_a_zero(probs, u):
    got = int(sample(np.array(probs), np.array(u)))
    assert probs[got] > 0
    if not np.isclose(np.cumsum(probs)[-1], u * sum(probs)):  # away from the rounding edge
        assert got == _brute(probs, u)


def test_u_rounding_up_to_the_total_returns_the_last_token_with_mass():
    probs = np.array([0.1, 0.2, 0.7, 0.0, 0.0])
    assert int(sample(probs, np.array(1 - 2**-53))) == 2


def test_unnormalised_and_batched_and_torch():
    rng = np.random.default_rng(0)
    probs = rng.random((6, 5, 9)) * 10
    u = rng.random((6, 5))
    out = sample(probs, u)
    assert out.shape == (6, 5) and out.dtype == np.int64
    assert np.array_equal(out, sample(torch.from_numpy(probs), torch.from_numpy(u)).numpy())


def test_empirical_law_is_the_normalised_probs():
    # n = 400,000 draws, 6 outcomes: goodness_of_fit's tau ~= 0.0041 at false-failure 1e-4.
    from specsample.testing import goodness_of_fit

    probs = np.array([0.0, 2.0, 1.0, 0.5, 0.0, 0.5])
    u = np.random.default_rng(1).random(400_000)
    result = goodness_of_fit(sample(np.broadcast_to(probs, (u.size, 6)), u), probs / probs.sum())
    assert result.passed, str(result)


@pytest.mark.parametrize(("probs", "u", "match"), [
    (np.array([0.5, -0.1]), np.array(0.3), "probs: expected non-negative"),
    (np.array([0.0, 0.0]), np.array(0.3), "probs: expected positive, finite total mass"),
    (np.array([np.nan, 1.0]), np.array(0.3), "probs: expected finite"),
    (np.array([0.5, 0.5]), np.array(1.0), r"u: expected values in \[0, 1\)"),
    (np.ones((2, 3)), np.zeros(3), r"u: expected shape \[2\]"),
])
def test_bad_input(probs, u, match):
    with pytest.raises(ValueError, match=match):
        sample(probs, u)
