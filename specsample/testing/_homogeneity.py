"""Two-sample homogeneity: do two samplers follow the same (unknown) law?"""

from __future__ import annotations

import dataclasses

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from specsample._array import check_int
from specsample.testing._inputs import as_ids, check_level, check_tau
from specsample.testing._pool import merge, pool_by_expected
from specsample.testing._power import tv_false_alarm, tv_threshold

__all__ = ["HomogeneityResult", "homogeneity"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class HomogeneityResult:
    """The verdict of `homogeneity` and the numbers behind it.

    Attributes:
        passed: the TV test passed and the G-test's p-value is >= alpha.
        pvalue: the G-test of homogeneity's p-value.
        tv: the TV distance between the two empirical laws, over the pooled outcomes.
        tau: the TV threshold; the test fails when tv > tau.
        tv_bound: (2^m - 2) exp(-2 n_eff tau^2), capped at 1, with
            n_eff = n_a n_b max(n_a, n_b) / (n_a + n_b)^2: the TV test's false-alarm bound.
        detectable_tv: 2 tau (see `homogeneity` for the miss probability).
        n_a: size of the first sample.
        n_b: size of the second sample.
        m: outcomes after pooling the rare ones.
        alpha: the level asked for.
        method: the tests used.
    """

    passed: bool
    pvalue: float
    tv: float
    tau: float
    tv_bound: float
    detectable_tv: float
    n_a: int
    n_b: int
    m: int
    alpha: float
    method: str = "two-sample-tv-concentration+g-test"

    def __str__(self) -> str:
        """One line: the verdict, the TV test, the G-test."""
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict} homogeneity: n_a={self.n_a}, n_b={self.n_b}, m={self.m}, "
                f"TV={self.tv:.4g} vs tau={self.tau:.4g} (false-alarm bound "
                f"{self.tv_bound:.2g}, detects TV >= {self.detectable_tv:.4g}), "
                f"G-test p={self.pvalue:.3g} (alpha={self.alpha:.2g})")


def _pair(samples_a: object, samples_b: object) -> tuple[NDArray[np.integer], int]:
    """Both samples stacked [n_a + n_b] or [n_a + n_b, L], and n_a."""
    a = as_ids(samples_a, "samples_a", rows=True)
    b = as_ids(samples_b, "samples_b", rows=True)
    if a.shape[1:] != b.shape[1:]:
        raise ValueError(f"samples_b: expected outcomes of the same shape as samples_a "
                         f"({a.shape[1:]}), got {b.shape[1:]}")
    if np.result_type(a, b).kind not in "iu":  # int64 with uint64 would become float64
        raise TypeError(f"samples_a, samples_b: expected integer dtypes with a common integer "
                        f"type, got {a.dtype} and {b.dtype}")
    return np.concatenate([a, b]), int(a.shape[0])


def _table(both: NDArray[np.integer], n_a: int, bins: int | None) -> NDArray[np.float64]:
    """Counts [2, m] of each sample over the outcomes, rare outcomes pooled by combined count."""
    _, dense = np.unique(both, axis=0, return_inverse=True)
    dense = dense.reshape(-1)  # [N] ids in [0, distinct)
    distinct = int(dense.max()) + 1
    if bins is not None and distinct > bins:
        # Keep the bins - 1 outcomes most frequent in the combined sample (ties: the smaller
        # outcome), pool the rest: again a function of the combined multiset only.
        ranked = np.argsort(-np.bincount(dense, minlength=distinct), kind="stable")
        labels = np.full(distinct, bins - 1, dtype=np.intp)
        labels[ranked[: bins - 1]] = np.arange(bins - 1)
        dense, distinct = labels[dense], bins
    counts = [np.bincount(part, minlength=distinct) for part in (dense[:n_a], dense[n_a:])]
    smaller = min(n_a, both.shape[0] - n_a)
    # The smallest expected cell count of each column under the null; it depends on the
    # combined sample only, so the pooling is symmetric in a and b.
    labels = pool_by_expected(smaller * (counts[0] + counts[1]) / both.shape[0])
    return np.stack([merge(c, labels) for c in counts])


def homogeneity(samples_a: object, samples_b: object, *, alpha: float = 1e-4,
                tau: float | None = None, bins: int | None = None) -> HomogeneityResult:
    """Test that two i.i.d. samples come from the same law (TV between them, then a G-test).

    Outcomes are the distinct observed ids (any integers, e.g. hashes) or rows of [n, L]
    arrays (e.g. the first L tokens of independent generations). An outcome is pooled into a
    "rare" bin when its combined count c makes an expected cell count min(n_a, n_b) c / N
    below 5 (N = n_a + n_b), as the G-test needs; the same m bins serve both tests. With
    `bins`, only the bins - 1 outcomes most frequent in the combined sample keep their own bin
    and the rest share one: m <= bins, so the TV test's bound (which grows as 2^m) stays
    useful at large n, at the price of judging the laws on those outcomes only.

    False alarm (derivation). Under the null, the N draws are i.i.d., so given the combined
    multiset (which fixes the pooling and m) the first sample is a uniformly random subset of
    size n_a of it: draws without replacement from the combined empirical law c. Hoeffding
    (1963, section 6) bounds each subset's frequency as for draws with replacement, so
    Weissman's union over subsets gives P(TV(emp_a, c) >= s) <= (2^m - 2) exp(-2 n_a s^2).
    Since emp_a - c = (n_b / N)(emp_a - emp_b), TV(emp_a, emp_b) = (N / n_b) TV(emp_a, c), so
    P(TV(emp_a, emp_b) > tau) <= (2^m - 2) exp(-2 n_a (n_b / N)^2 tau^2); using the better of
    a and b, n_eff = n_a n_b max(n_a, n_b) / N^2 (n / 4 for equal sizes n). The bound holds
    given every combined multiset, hence unconditionally: the data-dependent pooling (by
    expected count, and to `bins`) and m are exact here, not an approximation. (It is at least
    as tight as the i.i.d. route, tau = t_a + t_b with P(TV(emp_a, P) > t_a) <= alpha / 2 and
    the same for b, which would also need the unknown support size of P.) Samples must be
    independent draws; tokens of one generation are not.

    Power. If the two laws are at TV >= 2 tau over the pooled outcomes, the test passes only if
    TV(emp_a, P_a) + TV(emp_b, P_b) >= tau, with probability
    <= 2 (2^M - 2) exp(-2 tau^2 n_a n_b / (sqrt(n_a) + sqrt(n_b))^2), M the outcomes of the two
    laws together (again n / 4 for equal sizes). A difference spread over outcomes too rare to
    escape the pooled bin is invisible to both tests: choose n (`samples_needed_two_sample`)
    so that the outcomes that matter are common.

    Args:
        samples_a: outcomes [n_a] or [n_a, L] of integers (NumPy, torch CPU tensor, lists).
        samples_b: outcomes [n_b] or [n_b, L], the same L.
        alpha: the level of each test, in (0, 1).
        tau: the TV threshold, or None for the smallest one with false-alarm bound <= alpha.
        bins: at most this many outcomes (>= 2), the most frequent ones; None: no limit.

    Returns:
        A HomogeneityResult.
    """
    both, n_a = _pair(samples_a, samples_b)
    alpha = check_level(alpha, "alpha")
    given_tau = check_tau(tau)
    if bins is not None:
        bins = check_int("bins", bins, 2)
    n_b = int(both.shape[0]) - n_a
    table = _table(both, n_a, bins)  # [2, m]
    m = int(table.shape[1])
    tv = 0.5 * float(np.abs(table[0] / n_a - table[1] / n_b).sum())
    n_eff = n_a * n_b * max(n_a, n_b) / (n_a + n_b) ** 2
    threshold = tv_threshold(n_eff, m, alpha) if given_tau is None else given_tau
    pvalue = 1.0
    if m > 1:  # no Yates correction: a plain G-test at every number of degrees of freedom
        result = stats.chi2_contingency(table, correction=False, lambda_="log-likelihood")
        pvalue = float(result.pvalue)
    return HomogeneityResult(passed=tv <= threshold and pvalue >= alpha, pvalue=pvalue, tv=tv,
                             tau=threshold, tv_bound=tv_false_alarm(n_eff, threshold, m),
                             detectable_tv=2.0 * threshold, n_a=n_a, n_b=n_b, m=m,
                             alpha=alpha)
