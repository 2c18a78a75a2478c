"""One-sample goodness of fit: do samples follow a known law?"""

from __future__ import annotations

import dataclasses

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from specsample.testing._inputs import as_ids, as_probabilities, check_level, check_tau
from specsample.testing._pool import merge, pool_by_expected
from specsample.testing._power import tv_false_alarm, tv_threshold

__all__ = ["FitResult", "goodness_of_fit"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitResult:
    """The verdict of `goodness_of_fit` and the numbers behind it.

    Attributes:
        passed: the TV test passed, no sample hit an outcome of probability 0 and the G-test's
            p-value is >= alpha.
        pvalue: the G-test's p-value (0 when a sample hit an outcome of probability 0).
        tv: the empirical TV distance between the samples and the expected law.
        tau: the TV threshold; the test fails when tv > tau.
        tv_bound: (2^m - 2) exp(-2 n tau^2), capped at 1: the TV test's false-alarm bound.
        detectable_tv: 2 tau: a law at TV >= 2 tau from the expected one fails the TV test
            except with probability <= tv_bound (see `goodness_of_fit`).
        n: number of samples.
        m: outcomes: those of positive expected probability, plus one if a sample hit one of
            probability 0.
        alpha: the level asked for.
        unexpected: samples that hit outcomes of expected probability 0.
        method: the tests used.
    """

    passed: bool
    pvalue: float
    tv: float
    tau: float
    tv_bound: float
    detectable_tv: float
    n: int
    m: int
    alpha: float
    unexpected: int
    method: str = "tv-concentration+g-test"

    def __str__(self) -> str:
        """One line: the verdict, the TV test, the G-test."""
        verdict = "PASS" if self.passed else "FAIL"
        text = (f"{verdict} goodness of fit: n={self.n}, m={self.m}, TV={self.tv:.4g} vs "
                f"tau={self.tau:.4g} (false-alarm bound {self.tv_bound:.2g}, detects TV >= "
                f"{self.detectable_tv:.4g}), G-test p={self.pvalue:.3g} (alpha={self.alpha:.2g})")
        if self.unexpected:
            text += f"; {self.unexpected} samples hit outcomes of expected probability 0"
        return text


def g_test(observed: NDArray[np.int64], expected: NDArray[np.float64]) -> float:
    """The p-value of the G-test of `observed` against `expected`, bins pooled by expected count.

    Args:
        observed: counts [M].
        expected: expected counts [M], all > 0, summing to observed.sum().

    Returns:
        The p-value; 1 when pooling leaves a single bin (nothing to test).
    """
    labels = pool_by_expected(expected)
    if labels.max() == 0:
        return 1.0
    result = stats.power_divergence(merge(observed, labels), merge(expected, labels),
                                    lambda_="log-likelihood")
    return float(result.pvalue)


def goodness_of_fit(samples: object, expected: object, *, alpha: float = 1e-4,
                    tau: float | None = None) -> FitResult:
    """Test that i.i.d. samples follow the law `expected` (TV concentration, then a G-test).

    Primary test: fail when the empirical TV exceeds tau. For n i.i.d. draws from a law on m
    outcomes, P(TV > tau) <= (2^m - 2) exp(-2 n tau^2) (Weissman et al. 2003); with tau None,
    tau is the smallest value making that bound <= alpha. Power: if the sampler's law is at
    TV >= 2 tau from `expected`, the empirical TV is <= tau only if the empirical law is >= tau
    from the sampler's own law (triangle inequality), probability <= tv_bound (<= about
    2 tv_bound if the faulty law also puts mass on outcomes of expected probability 0, which
    then count as one extra outcome; any sample there fails the test at once).
    Secondary test: the G-test (`scipy.stats.power_divergence`), bins pooled by expected count
    < 5. Overall false-alarm probability <= tv_bound + alpha (union bound).

    Args:
        samples: outcome ids [n] in [0, M): NumPy, torch CPU tensor, or list of ints.
        expected: probabilities [M]; floats summing to 1 within 1e-9, or Fractions summing to 1.
        alpha: the level of each test, in (0, 1).
        tau: the TV threshold, or None for the smallest one with false-alarm bound <= alpha.

    Returns:
        A FitResult.
    """
    ids = as_ids(samples, "samples")
    probs = as_probabilities(expected, "expected")  # [M]
    alpha = check_level(alpha, "alpha")
    given_tau = check_tau(tau)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= probs.shape[0]:
        bad = f"min {lo}" if lo < 0 else f"max {hi}"
        raise ValueError(f"samples: expected outcome ids in [0, {probs.shape[0]}), got {bad}")
    n = int(ids.shape[0])
    counts = np.bincount(ids, minlength=probs.shape[0])  # [M]
    support = probs > 0
    unexpected = int(counts[~support].sum())
    m = int(np.count_nonzero(support)) + (unexpected > 0)
    tv = 0.5 * float(np.abs(counts / n - probs).sum())
    threshold = tv_threshold(n, m, alpha) if given_tau is None else given_tau
    pvalue = 0.0 if unexpected else g_test(counts[support], n * probs[support])
    return FitResult(passed=unexpected == 0 and tv <= threshold and pvalue >= alpha,
                     pvalue=pvalue, tv=tv, tau=threshold,
                     tv_bound=tv_false_alarm(n, threshold, m), detectable_tv=2.0 * threshold,
                     n=n, m=m, alpha=alpha, unexpected=unexpected)
