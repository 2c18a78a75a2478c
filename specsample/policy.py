"""How many tokens to draft per round: a constant K, or one adapted to acceptance."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from specsample._array import check_int
from specsample.metrics import Metrics, expected_tokens_per_round, predicted_speedup

__all__ = ["WIDTH_PRIOR", "AdaptiveK", "ConstantK", "KPolicy", "batch_width", "k_policy"]

# The acceptance `batch_width` assumes before a call has evidence, and how many drafts it is
# worth: prompt lookup's pooled acceptance on the benchmark prompts is about one half.
WIDTH_PRIOR = (0.5, 8.0)


@runtime_checkable
class KPolicy(Protocol):
    """Chooses K for the next round from the metrics so far."""

    def next_k(self, metrics: Metrics) -> int:
        """K for the next round."""
        ...

    @property
    def k_max(self) -> int:
        """The largest K it may choose (caches reserve room for it)."""
        ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConstantK:
    """Always draft `k` tokens."""

    k: int = 4

    def __post_init__(self) -> None:
        check_int("k", self.k, 1)

    @property
    def k_max(self) -> int:
        return self.k

    def next_k(self, metrics: Metrics) -> int:
        return self.k


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdaptiveK:
    """Pick the K in `choices` that maximises Thm 3.8's predicted speedup.

    The rule: estimate alpha from the accepted lengths so far (the maximum-
    likelihood estimate of the truncated geometric law, pulled towards
    `prior_alpha` by `prior_weight` pseudo-trials so the first rounds are
    stable), then choose argmax_K (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)).
    With the draft costing c target forwards, that is the K with the best
    expected tokens per unit of time; it grows when drafts are accepted and
    shrinks when they are not, as Hugging Face's heuristic does, but for a
    stated reason. A small, fixed set of choices lets graph backends capture
    one graph per K.
    """

    choices: tuple[int, ...] = (1, 2, 4, 6, 8)
    c: float = 0.1
    prior_alpha: float = 0.6
    prior_weight: float = 10.0

    def __post_init__(self) -> None:
        if not self.choices or any(isinstance(k, bool) or not isinstance(k, int) or k < 1
                                   for k in self.choices):
            raise ValueError(f"choices: expected a non-empty tuple of ints >= 1, got {self.choices!r}")
        if not self.c >= 0:
            raise ValueError(f"c: expected a cost ratio >= 0, got {self.c}")
        if not 0 <= self.prior_alpha < 1 or self.prior_weight < 0:
            raise ValueError(f"prior_alpha/prior_weight: expected [0, 1) and >= 0, got "
                             f"{self.prior_alpha}, {self.prior_weight}")

    @property
    def k_max(self) -> int:
        return max(self.choices)

    def alpha(self, metrics: Metrics) -> float:
        """The smoothed acceptance estimate."""
        return metrics.alpha_with_prior(self.prior_alpha, self.prior_weight)

    def next_k(self, metrics: Metrics) -> int:
        alpha = min(self.alpha(metrics), 1 - 1e-9)
        return max(self.choices, key=lambda k: predicted_speedup(alpha, k, self.c))


def k_policy(k: int | str, *, c: float = 0.1) -> KPolicy:
    """A policy from a config value: an int K, or "adaptive"."""
    if k == "adaptive":
        return AdaptiveK(c=c)
    if isinstance(k, int) and not isinstance(k, bool):
        return ConstantK(k=k)
    raise ValueError(f"k: expected an int >= 1 or 'adaptive', got {k!r}")


def batch_width(lengths: Sequence[int], batch: int, alpha: float,
                round_cost: Callable[[int, int], float]) -> int:
    """The drafts per row for a round of `batch` rows that Thm 3.8 predicts fastest.

    A round is as wide as its widest row: one row that drafts K makes the target verify
    K + 1 positions of every row. At batch 1 that costs little more than a plain step; in a
    full batch it costs several, which the rows that draft little do not pay back. So each
    candidate width w (0, a plain step, or a row's own length) is rated by the tokens it is
    expected to commit, sum_b E(alpha, min(L_b, w)) (Thm 3.8's E, with 1 for no draft), over
    its cost in plain steps of the same batch, `round_cost(batch, w)` (1 at w = 0); the best
    wins (the wider on a tie).

    Args:
        lengths: the active rows' wanted draft lengths, each >= 0.
        batch: rows in the forward (done rows included: they are computed too), >= 1.
        alpha: per-draft acceptance, in [0, 1].
        round_cost: (batch, drafts per row) -> the round's cost in plain steps at that batch.
    """
    check_int("batch", batch, 1)
    if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in lengths):
        raise ValueError(f"lengths: expected a non-empty list of ints >= 0, got {list(lengths)!r}")
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha: expected a rate in [0, 1], got {alpha!r}")
    rate = min(alpha, 1 - 1e-9)

    def speed(width: int) -> float:
        tokens = sum(expected_tokens_per_round(rate, min(n, width)) for n in lengths)
        cost = 1.0 if width == 0 else float(round_cost(batch, width))
        if not cost > 0:
            raise ValueError(f"round_cost: expected a positive cost, got {cost!r} at width {width}")
        return tokens / cost

    return max(sorted({0, *lengths}), key=lambda w: (speed(w), w))
