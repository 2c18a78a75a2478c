"""Tests of the statistical toolkit `specsample.testing` itself."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from specsample.testing import (
    FitResult,
    accepted_length_law,
    autoregressive_law,
    detectable_tv,
    exact_round_law,
    exact_sequence_law,
    expected_tokens_per_round,
    goodness_of_fit,
    homogeneity,
    samples_needed,
    samples_needed_two_sample,
)
from specsample.testing._exact import DistFn
from specsample.testing._pool import pool_by_expected
from specsample.testing._power import log_subsets, tv_false_alarm

F = Fraction
Law = dict[tuple[int, ...], Fraction]

# An 8-outcome law; at n = 200_000 and alpha = 1e-4 the TV threshold is
# tau = sqrt((ln(2^8 - 2) + ln(1e4)) / (2 n)) = 0.00607, so TV >= 2 tau = 0.0121 is caught.
LAW8 = np.array([0.1, 0.2, 0.3, 0.15, 0.05, 0.1, 0.05, 0.05])
N8 = 200_000


def _shifted(law: np.ndarray, by: float) -> np.ndarray:
    """`law` with `by` mass moved from outcome 2 to outcome 0: TV(law, result) = by."""
    out = law.copy()
    out[0] += by
    out[2] -= by
    return out


# ---------------------------------------------------------------- goodness_of_fit


def test_goodness_of_fit_passes_on_the_law_itself() -> None:
    # n = 200_000, m = 8, tau = 0.00607: false failure <= 1e-4 (TV) + 1e-4 (G-test).
    samples = np.random.default_rng(1).choice(8, size=N8, p=LAW8)
    result = goodness_of_fit(samples, LAW8)
    assert result.passed, str(result)
    assert result.n == N8 and result.m == 8 and result.unexpected == 0
    assert result.tau == pytest.approx(math.sqrt((math.log(254) - math.log(1e-4)) / (2 * N8)))
    assert result.tv_bound == pytest.approx(1e-4)
    assert result.detectable_tv == pytest.approx(2 * result.tau)
    assert str(result).startswith("PASS goodness of fit: n=200000, m=8")


def test_goodness_of_fit_fails_on_a_law_at_twice_tau() -> None:
    # The sampler's law is at TV = 0.05 >= 2 tau = 0.0121 from LAW8: missed with prob <= 1e-4.
    samples = np.random.default_rng(2).choice(8, size=N8, p=_shifted(LAW8, 0.05))
    result = goodness_of_fit(samples, LAW8)
    assert result.detectable_tv <= 0.05
    assert not result.passed and result.tv > result.tau
    assert str(result).startswith("FAIL")


def test_goodness_of_fit_with_n_from_samples_needed_catches_exactly_tv() -> None:
    # n = samples_needed(0.04, m=8) = 18_435 (alpha = beta = 1e-4): the law at TV exactly 0.04
    # is missed with probability <= 1e-4; the correct law fails with probability <= 2e-4.
    n = samples_needed(0.04, m=8)
    rng = np.random.default_rng(3)
    assert not goodness_of_fit(rng.choice(8, size=n, p=_shifted(LAW8, 0.04)), LAW8).passed
    good = goodness_of_fit(rng.choice(8, size=n, p=LAW8), LAW8)
    assert good.passed and good.detectable_tv <= 0.04


def test_goodness_of_fit_accepts_fractions_and_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    law = np.array([F(1, 2), F(1, 4), F(1, 8), F(1, 8)], dtype=object)
    samples = np.random.default_rng(4).choice(4, size=20_000, p=law.astype(float))
    expected = goodness_of_fit(samples, law.astype(float))
    assert goodness_of_fit(torch.from_numpy(samples), law) == expected
    assert goodness_of_fit(samples.tolist(), list(law)) == expected


def test_g_test_pools_by_expected_count() -> None:
    # 4_000 outcomes of expected count 0.1 each (n = 2_000) are pooled into one bin of
    # expected count 400 beside the two common outcomes; the p-value is the 3-bin G-test's.
    law = np.concatenate([[0.5, 0.3], np.full(4_000, 0.2 / 4_000)])
    n = 2_000
    samples = np.random.default_rng(5).choice(law.size, size=n, p=law)
    counts = np.bincount(samples, minlength=law.size)
    pooled = [counts[0], counts[1], counts[2:].sum()]
    want = stats.power_divergence(pooled, [n * 0.5, n * 0.3, n * 0.2], lambda_="log-likelihood")
    result = goodness_of_fit(samples, law)
    assert result.pvalue == pytest.approx(want.pvalue)
    assert result.passed  # tau = 0.8 here (m = 4_002): only the G-test has power at this n


def test_pool_by_expected_merges_small_bins_and_a_small_pool() -> None:
    assert pool_by_expected(np.array([10.0, 1.0, 7.0, 2.0, 3.0])).tolist() == [0, 2, 1, 2, 2]
    # the pooled bin (1 + 2 = 3 < 5) joins the smallest remaining bin (50)
    assert pool_by_expected(np.array([100.0, 2.0, 50.0, 1.0])).tolist() == [0, 1, 1, 1]
    assert pool_by_expected(np.array([1.0, 2.0])).tolist() == [0, 0]
    assert pool_by_expected(np.array([5.0, 6.0])).tolist() == [0, 1]


def test_g_test_never_pools_by_observed_count() -> None:
    # Outcome 0 has expected count 0.0003 n = 60 but the sampler never emits it: its law is at
    # TV 0.0003, far below tau = 0.0061, so only the G-test sees it (it adds about 2 * 60 to G:
    # p ~ 1e-22).
    # Pooling by observed count would have hidden the empty bin.
    law = np.concatenate([[0.0003], LAW8[1:] * (1 - 0.0003) / LAW8[1:].sum()])
    faulty = np.concatenate([[0.0], law[1:] / law[1:].sum()])
    samples = np.random.default_rng(6).choice(8, size=N8, p=faulty)
    result = goodness_of_fit(samples, law)
    assert result.tv <= result.tau
    assert result.pvalue < 1e-4 and not result.passed


def test_goodness_of_fit_fails_at_once_on_an_impossible_outcome() -> None:
    law = np.array([0.5, 0.5, 0.0, 0.0])
    result = goodness_of_fit(np.array([0, 1] * 500 + [2]), law)
    assert not result.passed
    assert result.unexpected == 1 and result.m == 3 and result.pvalue == 0.0
    assert "expected probability 0" in str(result)


def test_goodness_of_fit_single_outcome_and_many_outcomes() -> None:
    one = goodness_of_fit(np.zeros(10, dtype=np.int64), np.array([1.0, 0.0, 0.0]))
    assert one.passed and one.tau == 0.0 and one.tv_bound == 0.0 and one.m == 1
    # m = 5_000 outcomes: ln(2^m - 2) is formed without 2^m; tau > 1 at this n (no power).
    wide = goodness_of_fit(np.arange(1_000), np.full(5_000, 1 / 5_000))
    assert wide.tau == pytest.approx(math.sqrt((5_000 * math.log(2) + math.log(1e4)) / 2_000))
    assert wide.passed


def test_fit_result_is_frozen() -> None:
    result = goodness_of_fit(np.array([0, 1, 1, 0]), np.array([0.5, 0.5]))
    assert isinstance(result, FitResult)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.passed = False  # type: ignore[misc]


@pytest.mark.parametrize(("samples", "expected", "kwargs", "error", "match"), [
    ([0, 4, 1], [0.25] * 4, {}, ValueError, r"samples: expected outcome ids in \[0, 4\), got max 4"),
    ([0, -1], [0.5, 0.5], {}, ValueError, r"samples: expected outcome ids in \[0, 2\), got min -1"),
    ([0.0, 1.0], [0.5, 0.5], {}, TypeError, "samples: expected integer outcome ids, got dtype float64"),
    ([[0, 1]], [0.5, 0.5], {}, ValueError, r"samples: expected a 1-D array \[n\] .* got shape \(1, 2\)"),
    (np.array([], dtype=np.int64), [0.5, 0.5], {}, ValueError, "samples: expected at least one"),
    ([0], [1.5, -0.5], {}, ValueError, "expected: expected non-negative probabilities, got min -0.5"),
    ([0], [math.nan, 1.0], {}, ValueError, "expected: expected finite probabilities, got nan"),
    ([0], [0.5, 0.4], {}, ValueError, "expected: expected probabilities summing to 1 within 1e-9"),
    ([0], [F(1, 2), F(1, 3)], {}, ValueError, "expected: expected Fractions summing exactly to 1, got 5/6"),
    ([0], ["a", "b"], {}, TypeError, "expected: expected real probabilities, got dtype <U1"),
    ([0], [[0.5, 0.5]], {}, ValueError, r"expected: expected a non-empty 1-D array .* shape \(1, 2\)"),
    ([0], [0.5, 0.5], {"alpha": 0.0}, ValueError, r"alpha: expected a float in \(0, 1\), got 0.0"),
    ([0], [0.5, 0.5], {"alpha": "x"}, TypeError, r"alpha: expected a float in \(0, 1\), got str"),
    ([0], [0.5, 0.5], {"tau": -1.0}, ValueError, "tau: expected None or a finite float > 0, got -1.0"),
    ([0], [0.5, 0.5], {"tau": math.inf}, ValueError, "tau: expected None or a finite float > 0"),
])
def test_goodness_of_fit_validates(samples: object, expected: object, kwargs: dict[str, object],
                                   error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        goodness_of_fit(samples, expected, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- homogeneity


def test_homogeneity_passes_for_one_law() -> None:
    # n_a = 200_000, n_b = 150_000, m = 8: n_eff = n_a n_b max / N^2 = 48_980, tau = 0.0123;
    # false failure <= 1e-4 (TV) + 1e-4 (G-test).
    rng = np.random.default_rng(7)
    result = homogeneity(rng.choice(8, size=N8, p=LAW8), rng.choice(8, size=150_000, p=LAW8))
    assert result.passed, str(result)
    assert (result.n_a, result.n_b, result.m) == (N8, 150_000, 8)
    assert result.tv_bound == pytest.approx(1e-4)
    assert str(result).startswith("PASS homogeneity")


def test_homogeneity_fails_for_two_laws() -> None:
    # Equal sizes n = 100_000: n_eff = n / 4, tau = 0.0172, and laws at TV = 0.05 >= 2 tau are
    # missed with probability <= 2 (2^8 - 2) exp(-2 (n/4) tau^2) = 2e-4.
    rng = np.random.default_rng(8)
    n = 100_000
    result = homogeneity(rng.choice(8, size=n, p=LAW8), rng.choice(8, size=n, p=_shifted(LAW8, 0.05)))
    assert result.detectable_tv <= 0.05
    assert not result.passed and result.tv > result.tau


def test_homogeneity_maps_large_ids_and_rows_to_outcomes() -> None:
    # Outcomes as hash-like int64 ids and as rows [n, 3] give the same test as dense ids.
    rng = np.random.default_rng(9)
    a, b = rng.choice(8, size=5_000, p=LAW8), rng.choice(8, size=4_000, p=LAW8)
    dense = homogeneity(a, b)
    hashed = homogeneity(2**62 + 1_000_003 * a, 2**62 + 1_000_003 * b)
    rows = homogeneity(np.stack([a // 4, a // 2 % 2, a % 2], axis=1),
                       np.stack([b // 4, b // 2 % 2, b % 2], axis=1))
    assert dense == hashed == rows


def test_homogeneity_pools_rare_outcomes_from_the_combined_sample() -> None:
    # 1_000 outcomes seen about once each are pooled into one bin, so m stays small.
    rng = np.random.default_rng(10)
    law = np.concatenate([[0.45, 0.45], np.full(1_000, 0.1 / 1_000)])
    result = homogeneity(rng.choice(law.size, size=10_000, p=law),
                         rng.choice(law.size, size=10_000, p=law))
    assert result.m == 3 and result.passed


def test_homogeneity_keeps_the_most_frequent_outcomes_with_bins() -> None:
    # 400 outcomes, each common: without bins m = 400 and tau ~= 0.076 (detects only TV >= 0.15); with bins=8
    # m = 8, tau = 0.0172 at n = 100_000 each, and a shift of 0.05 among the top outcomes
    # (TV 0.05 >= 2 tau) is caught with probability >= 1 - 2e-4 (see homogeneity's docstring).
    rng = np.random.default_rng(12)
    law = np.concatenate([LAW8 * 0.6, np.full(392, 0.4 / 392)])
    shifted = np.concatenate([_shifted(LAW8, 0.05 / 0.6) * 0.6, law[8:]])
    n = 100_000
    same = [rng.choice(law.size, size=n, p=law) for _ in range(2)]
    wide = homogeneity(*same)
    narrow = homogeneity(*same, bins=8)
    assert wide.m > 300 and wide.detectable_tv > 0.14
    assert narrow.m == 8 and narrow.passed and narrow.detectable_tv <= 0.035
    caught = homogeneity(same[0], rng.choice(law.size, size=n, p=shifted), bins=8)
    assert not caught.passed and caught.tv > caught.tau
    with pytest.raises(ValueError, match="bins: expected an int >= 2"):
        homogeneity(same[0], same[1], bins=1)


@pytest.mark.parametrize(("a", "b", "error", "match"), [
    ([0, 1], [[0, 1]], ValueError, r"samples_b: expected outcomes of the same shape as samples_a"),
    ([0.5], [1], TypeError, "samples_a: expected integer outcome ids, got dtype float64"),
    ([0], [], ValueError, "samples_b: expected at least one sample"),
    (np.array([1], dtype=np.int64), np.array([1], dtype=np.uint64), TypeError,
     "samples_a, samples_b: expected integer dtypes with a common integer type"),
])
def test_homogeneity_validates(a: object, b: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        homogeneity(a, b)


# ---------------------------------------------------------------- sample sizes


@pytest.mark.parametrize("tv", [0.01, 0.05, 0.3])
@pytest.mark.parametrize("m", [2, 8, 200])
@pytest.mark.parametrize("alpha", [1e-4, 1e-2])
def test_samples_needed_and_detectable_tv_are_inverses(tv: float, m: int, alpha: float) -> None:
    n = samples_needed(tv, m=m, alpha=alpha, beta=alpha)
    assert detectable_tv(n, m=m, alpha=alpha) <= tv < detectable_tv(n - 1, m=m, alpha=alpha)
    assert tv_false_alarm(n, tv / 2, m) <= alpha * (1 + 1e-12)


def test_samples_needed_takes_the_stricter_level() -> None:
    assert samples_needed(0.05, m=8, alpha=1e-4, beta=1e-2) == samples_needed(0.05, m=8)
    assert samples_needed(0.05, m=8, alpha=1e-2, beta=1e-4) == samples_needed(0.05, m=8)


@pytest.mark.parametrize(("alpha", "beta"), [(1e-4, 1e-3), (1e-4, 1e-5)])
def test_samples_needed_two_sample_bounds_both_errors(alpha: float, beta: float) -> None:
    # false alarm <= (2^m - 2) exp(-2 (n/4) tau^2), miss <= twice that, tau = tv / 2
    n = samples_needed_two_sample(0.05, m=8, alpha=alpha, beta=beta)

    def errors(size: int) -> tuple[float, float]:
        false_alarm = tv_false_alarm(size / 4, 0.025, 8)
        return false_alarm, 2 * false_alarm

    assert errors(n)[0] <= alpha and errors(n)[1] <= beta
    assert errors(n - 1)[0] > alpha or errors(n - 1)[1] > beta  # the smallest such n


def test_log_subsets() -> None:
    assert log_subsets(2) == pytest.approx(math.log(2))
    assert log_subsets(10) == pytest.approx(math.log(2**10 - 2))
    assert log_subsets(100_000) == pytest.approx(100_000 * math.log(2))
    assert log_subsets(1) == -math.inf


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: samples_needed(0.0, m=8), ValueError, r"tv: expected a float in \(0, 1\], got 0.0"),
    (lambda: samples_needed(0.1, m=1), ValueError, "m: expected an int >= 2, got 1"),
    (lambda: samples_needed(0.1, m=8, beta=2.0), ValueError, r"beta: expected a float in \(0, 1\)"),
    (lambda: detectable_tv(0, m=8), ValueError, "n: expected an int >= 1, got 0"),
    (lambda: detectable_tv(10, m=2.5),  # type: ignore[arg-type]
     TypeError, "m: expected an int, got float"),
])
def test_sample_sizes_validate(call: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()  # type: ignore[operator]


# ---------------------------------------------------------------- exact laws

# A context-dependent toy model: the law depends on the last token and on the parity of the
# context's length; zeros make the residual and the "never accept" branches matter.
P_ROWS = {0: (F(1, 2), F(1, 3), F(1, 6)), 1: (F(0), F(1, 4), F(3, 4)), 2: (F(2, 5), F(0), F(3, 5))}
Q_ROWS = {0: (F(1, 3), F(1, 3), F(1, 3)), 1: (F(1, 2), F(1, 2), F(0)), 2: (F(0), F(1), F(0))}


def markov_p(context: tuple[int, ...]) -> tuple[Fraction, ...]:
    row = P_ROWS[context[-1]]
    return row if len(context) % 2 else row[1:] + row[:1]


def markov_q(context: tuple[int, ...]) -> tuple[Fraction, ...]:
    return Q_ROWS[context[-1]]


def one_hot_q(context: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(t == (context[-1] + len(context)) % 3) for t in range(3))


def _extend_with_p(round_law: Law, p: DistFn, prefix: tuple[int, ...], length: int,
                   vocab: int = 3) -> Law:
    """The law of `length` tokens: a round's tokens, then p's autoregressive continuation."""
    out: Law = {}
    for emitted, w in round_law.items():
        rest = length - len(emitted)
        tails: Law = {(): F(1)}
        if rest:
            tails = autoregressive_law(p, prefix + emitted, length=rest, vocab_size=vocab)
        for tail, w_tail in tails.items():
            out[emitted + tail] = out.get(emitted + tail, F(0)) + w * w_tail
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("prefix", [(0,), (1,), (2, 1)])
def test_exact_round_law_is_the_target_law(k: int, prefix: tuple[int, ...]) -> None:
    law = exact_round_law(markov_p, markov_q, prefix, k=k, vocab_size=3)
    assert sum(law.values()) == 1
    assert {len(t) for t in law} <= set(range(1, k + 2))
    want = autoregressive_law(markov_p, prefix, length=k + 1, vocab_size=3)
    assert _extend_with_p(law, markov_p, prefix, k + 1) == want


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("deterministic", [False, True])
def test_exact_sequence_law_across_rounds_is_the_target_law(k: int, deterministic: bool) -> None:
    q = one_hot_q if deterministic else markov_q
    law = exact_sequence_law(markov_p, q, (0,), k=k, vocab_size=3, length=3,
                             deterministic=deterministic)
    assert law == autoregressive_law(markov_p, (0,), length=3, vocab_size=3)


def test_a_wrong_law_is_detected_exactly_and_statistically() -> None:
    # Negative control: "always accept" emits q's law. Exactly, it differs from p's law; by
    # sampling, goodness_of_fit rejects it. The 27 outcomes are the first 3 tokens.
    # n = 50_000, m = 27: tau = sqrt((ln(2^27 - 2) + ln(1e4)) / (2 n)) = 0.0167, so laws at
    # TV >= 0.033 are caught except with probability 1e-4; the correct law fails w.p. <= 2e-4.
    right = exact_sequence_law(markov_p, markov_q, (0,), k=2, vocab_size=3, length=3)
    wrong = exact_sequence_law(markov_q, markov_q, (0,), k=2, vocab_size=3, length=3)
    assert wrong == autoregressive_law(markov_q, (0,), length=3, vocab_size=3) != right
    expected = np.array([right.get(_tokens(i), F(0)) for i in range(27)], dtype=object)
    wrong_probs = np.array([float(wrong.get(_tokens(i), 0)) for i in range(27)])
    true_tv = 0.5 * np.abs(expected.astype(float) - wrong_probs).sum()
    rng = np.random.default_rng(11)
    good = goodness_of_fit(rng.choice(27, size=50_000, p=expected.astype(float)), expected)
    bad = goodness_of_fit(rng.choice(27, size=50_000, p=wrong_probs), expected)
    assert good.passed and true_tv >= bad.detectable_tv and not bad.passed


def _tokens(index: int) -> tuple[int, int, int]:
    return index // 9, index // 3 % 3, index % 3


@pytest.mark.parametrize("alpha", [F(0), F(1, 3), F(7, 8), F(1)])
@pytest.mark.parametrize("k", [1, 3])
def test_accepted_length_law(alpha: Fraction, k: int) -> None:
    law = accepted_length_law(alpha, k)
    assert len(law) == k + 1 and sum(law) == 1
    assert sum((i + 1) * w for i, w in enumerate(law)) == expected_tokens_per_round(alpha, k)


def test_round_lengths_follow_the_accepted_length_law() -> None:
    # Context-free p, q: alpha = sum min(p, q) = 1/2 + 1/4 + 0 = 3/4 (Leviathan Definition 3.1).
    p = (F(1, 2), F(1, 2), F(0))
    q = (F(3, 4), F(1, 4), F(0))
    law = exact_round_law(lambda _: p, lambda _: q, (), k=3, vocab_size=3)
    lengths = [sum(w for t, w in law.items() if len(t) == i + 1) for i in range(4)]
    assert lengths == accepted_length_law(F(3, 4), 3)
    assert expected_tokens_per_round(1, 3) == 4


@st.composite
def _distributions(draw: st.DrawFn, size: int) -> tuple[Fraction, ...]:
    weights = draw(st.lists(st.integers(0, 4), min_size=size, max_size=size).filter(any))
    return tuple(F(w, sum(weights)) for w in weights)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), vocab=st.integers(1, 4), k=st.integers(1, 3))
def test_exact_round_law_for_arbitrary_context_free_laws(data: st.DataObject, vocab: int,
                                                         k: int) -> None:
    # includes zeros, p = q, disjoint supports and one-hot q
    p = data.draw(_distributions(vocab))
    q = data.draw(st.one_of(st.just(p), _distributions(vocab)))
    law = exact_round_law(lambda _: p, lambda _: q, (), k=k, vocab_size=vocab)
    want = autoregressive_law(lambda _: p, (), length=k + 1, vocab_size=vocab)
    assert _extend_with_p(law, lambda _: p, (), k + 1, vocab) == want
    alpha = sum(min(a, b) for a, b in zip(p, q, strict=True))
    lengths = [sum(w for t, w in law.items() if len(t) == i + 1) for i in range(k + 1)]
    assert lengths == accepted_length_law(alpha, k)


def _bad_length(_: tuple[int, ...]) -> Sequence[Fraction]:
    return (F(1),)


@pytest.mark.parametrize(("p", "q", "kwargs", "error", "match"), [
    (markov_p, _bad_length, {}, ValueError, r"q\(context=\(0,\)\): expected 3 probabilities, got 1"),
    (lambda c: (F(1, 2), F(1, 2), F(1, 2)), markov_q, {}, ValueError,
     r"p\(context=\(0,\)\): expected probabilities summing exactly to 1, got 3/2"),
    (lambda c: (F(3, 2), F(-1, 2), F(0)), markov_q, {}, ValueError,
     r"p\(context=\(0,\)\): expected non-negative probabilities, got -1/2"),
    (lambda c: (math.nan, 1.0, 0.0), markov_q, {}, ValueError, "expected finite probabilities, got nan"),
    (lambda c: ("1", 0, 0), markov_q, {}, TypeError, "expected Fractions, ints or floats, got str"),
    (markov_p, markov_q, {"deterministic": True}, ValueError,
     r"q\(context=\(0,\)\): expected a one-hot distribution \(deterministic=True\), got max 1/3"),
    (markov_p, markov_q, {"k": 0}, ValueError, "k: expected an int >= 1, got 0"),
    (markov_p, markov_q, {"vocab_size": 0}, ValueError, "vocab_size: expected an int >= 1"),
])
def test_exact_round_law_validates(p: object, q: object, kwargs: dict[str, object],
                                   error: type[Exception], match: str) -> None:
    args: dict[str, object] = {"k": 2, "vocab_size": 3, **kwargs}
    with pytest.raises(error, match=match):
        exact_round_law(p, q, (0,), **args)  # type: ignore[arg-type]


def test_exact_laws_take_dyadic_floats_exactly() -> None:
    law = autoregressive_law(lambda _: [0.5, 0.25, 0.25], (), length=2, vocab_size=3)
    assert law[(0, 1)] == F(1, 8) and sum(law.values()) == 1
    with pytest.raises(ValueError, match="summing exactly to 1"):
        autoregressive_law(lambda _: [0.1] * 10, (), length=1, vocab_size=10)
