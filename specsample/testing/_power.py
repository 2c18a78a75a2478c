"""Concentration bounds for the empirical total-variation distance, and the sample sizes they imply.

Weissman et al. (2003), "Inequalities for the L1 deviation of the empirical distribution":
for n i.i.d. draws from a law on m outcomes, P(TV(empirical, law) >= t) <= (2^m - 2) exp(-2 n t^2).
(TV is half the L1 distance; the union is over the 2^m - 2 proper non-empty subsets of outcomes,
each a Hoeffding bound.)
"""

from __future__ import annotations

import math
import numbers

from specsample._array import check_int
from specsample.testing._inputs import check_level

__all__ = ["detectable_tv", "log_subsets", "samples_needed", "samples_needed_two_sample",
           "tv_false_alarm", "tv_threshold"]


def log_subsets(m: int) -> float:
    """ln(2^m - 2), computed without forming 2^m; -inf when m < 2 (no proper subset).

    Args:
        m: number of outcomes.

    Returns:
        m ln 2 + log1p(-2^(1 - m)), finite for any m >= 2.
    """
    if m < 2:
        return -math.inf
    return m * math.log(2.0) + math.log1p(-math.ldexp(1.0, 1 - m))


def tv_false_alarm(n: float, tau: float, m: int) -> float:
    """The bound (2^m - 2) exp(-2 n tau^2) on P(TV > tau), capped at 1.

    Args:
        n: sample size (an effective size for two-sample tests).
        tau: TV threshold.
        m: number of outcomes.

    Returns:
        The bound in [0, 1]; 0 when m < 2 (the empirical law is then exact).
    """
    if m < 2:
        return 0.0
    return math.exp(min(0.0, log_subsets(m) - 2.0 * n * tau * tau))


def tv_threshold(n: float, m: int, alpha: float) -> float:
    """The smallest tau with (2^m - 2) exp(-2 n tau^2) <= alpha.

    Args:
        n: sample size (an effective size for two-sample tests).
        m: number of outcomes.
        alpha: the false-alarm probability allowed, in (0, 1).

    Returns:
        sqrt((ln(2^m - 2) - ln alpha) / (2 n)); 0 when m < 2.
    """
    if m < 2:
        return 0.0
    return math.sqrt((log_subsets(m) - math.log(alpha)) / (2.0 * n))


def _check_tv(tv: float) -> float:
    if isinstance(tv, bool) or not isinstance(tv, numbers.Real):
        raise TypeError(f"tv: expected a float in (0, 1], got {type(tv).__name__}")
    if not 0.0 < tv <= 1.0:
        raise ValueError(f"tv: expected a float in (0, 1], got {tv!r}")
    return float(tv)


def samples_needed(tv: float, *, m: int, alpha: float = 1e-4, beta: float = 1e-4) -> int:
    """Sample size for the one-sample TV test (tau = tv / 2) to have both error rates bounded.

    With tau = tv / 2: a correct sampler fails with probability <= (2^m - 2) exp(-2 n tau^2)
    <= alpha; a sampler whose law is at TV >= tv from the expected one has empirical TV >= tau
    from the expected law unless its own empirical law is tau away from it (triangle
    inequality), which has probability <= the same bound <= beta.

    Args:
        tv: the smallest TV distance to detect, in (0, 1].
        m: outcomes the sampler can produce (expected and faulty laws together), >= 2.
        alpha: false-alarm probability allowed, in (0, 1).
        beta: miss probability allowed at TV >= tv, in (0, 1).

    Returns:
        n = ceil(ln((2^m - 2) / min(alpha, beta)) / (2 (tv/2)^2)).
    """
    tau = _check_tv(tv) / 2.0
    m = check_int("m", m, 2)
    worst = min(check_level(alpha, "alpha"), check_level(beta, "beta"))
    return math.ceil((log_subsets(m) - math.log(worst)) / (2.0 * tau * tau))


def samples_needed_two_sample(tv: float, *, m: int, alpha: float = 1e-4,
                              beta: float = 1e-4) -> int:
    """Per-sample size (both samples equal) for `homogeneity` at tau = tv / 2.

    With n draws each, both of homogeneity's bounds use the effective size n / 4: a false
    alarm has probability <= (2^m - 2) exp(-2 (n/4) tau^2) <= alpha, and laws at TV >= tv are
    missed with probability <= 2 (2^m - 2) exp(-2 (n/4) tau^2) <= beta (see `homogeneity`).

    Args:
        tv: the smallest TV distance between the two laws to detect, in (0, 1].
        m: outcomes of the two laws together, >= 2.
        alpha: false-alarm probability allowed, in (0, 1).
        beta: miss probability allowed at TV >= tv, in (0, 1).

    Returns:
        n per sample.
    """
    tau = _check_tv(tv) / 2.0
    m = check_int("m", m, 2)
    log_alpha = math.log(check_level(alpha, "alpha"))
    log_beta = math.log(check_level(beta, "beta")) - math.log(2.0)
    exponent = log_subsets(m) - min(log_alpha, log_beta)
    return math.ceil(4.0 * exponent / (2.0 * tau * tau))


def detectable_tv(n: int, *, m: int, alpha: float = 1e-4) -> float:
    """The smallest TV the one-sample test with n draws catches; the inverse of `samples_needed`.

    Args:
        n: sample size, >= 1.
        m: outcomes, >= 2.
        alpha: false-alarm probability and miss probability allowed, in (0, 1).

    Returns:
        2 tau with tau = sqrt(ln((2^m - 2) / alpha) / (2 n)); a value above 1 means no law
        can be told apart with n draws.
    """
    n = check_int("n", n, 1)
    return 2.0 * tv_threshold(n, check_int("m", m, 2), check_level(alpha, "alpha"))
