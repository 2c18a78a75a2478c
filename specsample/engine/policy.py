"""How many tokens to draft per round: a constant K, or one adapted to acceptance."""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

from specsample._array import check_int
from specsample.core.metrics import Metrics, predicted_speedup

__all__ = ["AdaptiveK", "ConstantK", "KPolicy", "k_policy"]


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
