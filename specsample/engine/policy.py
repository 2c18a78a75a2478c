"""How many tokens to draft per round: a constant K, or one adapted to acceptance."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from specsample._array import check_int
from specsample.core.metrics import Metrics, expected_tokens_per_round, predicted_speedup

__all__ = ["WIDTH_PRIOR", "AdaptiveK", "ConstantK", "KPolicy", "batch_width", "fastest_fan_out", "fastest_k",
           "k_policy"]

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


def fastest_k(alpha: float, c: float, width_cost: Callable[[int], float], k_max: int
              ) -> tuple[int, tuple[float, ...]]:
    """The constant K in [1, k_max] that Thm 3.8 rates fastest once the verify's cost is
    counted: (1 - alpha^(K+1)) / (1 - alpha) expected tokens per round over the round's cost
    in plain steps, K c + width_cost(K + 1). Every K is rated: a measured verify cost may
    rise in steps, so a K that rates below its predecessor does not rule out a longer one.

    Args:
        alpha: the draft's per-token acceptance, in [0, 1].
        c: one draft step's cost over a one-position target forward, finite and >= 0.
        width_cost: positions -> a target forward of that many positions over one of one
            position (> 0).
        k_max: the largest K considered, >= 1.

    Returns:
        K (the smaller on a tie) and the rate of each K = 1..k_max, in tokens per plain
        step's cost (a plain step rates 1).
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha: expected a rate in [0, 1], got {alpha!r}")
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < float("inf"):
        raise ValueError(f"c: expected a finite cost ratio >= 0, got {c!r}")
    check_int("k_max", k_max, 1)
    if not callable(width_cost):
        raise TypeError(f"width_cost: expected a function positions -> cost, got {type(width_cost).__name__}")
    rates: list[float] = []
    for k in range(1, k_max + 1):
        cost = float(width_cost(k + 1))
        if not 0 < cost < float("inf"):
            raise ValueError(f"width_cost: expected a positive finite cost, got {cost!r} at "
                             f"{k + 1} positions")
        rates.append(expected_tokens_per_round(float(alpha), k) / (k * float(c) + cost))
    best = max(range(len(rates)), key=lambda i: (rates[i], -i))
    return best + 1, tuple(rates)


def fastest_fan_out(hits: Sequence[float], c: float, width_cost: Callable[[int], float]
                    ) -> tuple[int, tuple[float, ...]]:
    """The fan-out m in [1, len(hits)] whose depth-1 round Thm 3.8 rates fastest once the
    verify's cost is counted: 1 + hits[m - 1] expected tokens a round (the committed token,
    plus one when the target's token is among the m candidates) over the round's cost in
    plain steps, c (one draft step, whatever m) + width_cost(m + 1). Every m is rated: the
    verify's cost may stay flat over several widths and then rise in a step.

    Args:
        hits: hits[m - 1] = the chance that m candidates hold the target's token, each in
            [0, 1] and none below its predecessor (more candidates hold at least as much).
        c: the draft step's cost over a one-position target forward, finite and >= 0.
        width_cost: positions -> a target forward of that many positions over one of one
            position (> 0).

    Returns:
        m (the smaller on a tie) and the rate of each m = 1..len(hits), in tokens per plain
        step's cost (a plain step rates 1).
    """
    if isinstance(hits, (str, bytes)) or not isinstance(hits, Sequence) or not hits:
        raise ValueError(f"hits: expected a non-empty sequence of rates, got {hits!r}")
    rates = [float(h) for h in hits]
    if any(not 0 <= h <= 1 for h in rates) or any(b < a for a, b in itertools.pairwise(rates)):
        raise ValueError(f"hits: expected rates in [0, 1], none below its predecessor, got {list(hits)!r}")
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < float("inf"):
        raise ValueError(f"c: expected a finite cost ratio >= 0, got {c!r}")
    if not callable(width_cost):
        raise TypeError(f"width_cost: expected a function positions -> cost, got {type(width_cost).__name__}")
    rated: list[float] = []
    for m, hit in enumerate(rates, start=1):
        cost = float(width_cost(m + 1))
        if not 0 < cost < float("inf"):
            raise ValueError(f"width_cost: expected a positive finite cost, got {cost!r} at {m + 1} "
                             f"positions")
        rated.append((1 + hit) / (float(c) + cost))
    best = max(range(len(rated)), key=lambda i: (rated[i], -i))
    return best + 1, tuple(rated)


def batch_width(lengths: Sequence[int], remaining: Sequence[int], batch: int,
                alpha: float | Sequence[float] | Callable[[int], float],
                round_cost: Callable[[int, int], float]) -> int:
    """The drafts per row for a round of `batch` rows that Thm 3.8's acceptance model
    predicts to finish the call soonest.

    A round is as wide as its widest row: one row that drafts K makes the target verify
    K + 1 positions of every row, which in a full batch costs several plain steps. And a
    call ends when its last row does, so what a round is worth is how far it moves the row
    with the most tokens left, not how many tokens all rows commit: a round in which every
    row but one accepts its drafts brings the end no nearer. With R the most tokens any
    active row has left, a round of width w moves the end by G = R - max_b (r_b - e_b),
    r_b the row's tokens left and e_b = 1 + its accepted drafts (each of its min(L_b, w)
    drafts accepted in turn with probability alpha(L_b), independently across rows):
    P(G >= g) = prod_b P(e_b >= r_b - R + g). Each candidate width (0, a plain step, a
    row's own length, or a power of two below the longest) is rated by E[G] over its cost
    in plain steps of the same batch,
    `round_cost(batch, w)` (1 at w = 0); the best wins (the wider on a tie). For one row,
    E[G] is Thm 3.8's expected tokens per round, so at batch 1 this is Thm 3.8 with the
    verify's cost measured at each width.

    Args:
        lengths: the active rows' wanted draft lengths, each >= 0.
        remaining: the active rows' tokens left before their stop, each >= 1, in the
            order of `lengths`.
        batch: rows in the forward (done rows included: they are computed too), >= 1.
        alpha: per-draft acceptance in [0, 1]: one for all rows, one per row (in the order
            of `lengths`), or a function of a row's wanted length (>= 1) giving it (a
            drafter's short and long proposals, such as prompt lookup's one draft after a
            short match and K after a long one, differ in acceptance).
        round_cost: (batch, drafts per row) -> the round's cost in plain steps at that batch.
    """
    check_int("batch", batch, 1)
    if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in lengths):
        raise ValueError(f"lengths: expected a non-empty list of ints >= 0, got {list(lengths)!r}")
    if len(remaining) != len(lengths) or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                                             for n in remaining):
        raise ValueError(f"remaining: expected {len(lengths)} ints >= 1 (one per row of lengths), got "
                         f"{list(remaining)!r}")
    if callable(alpha):
        by_length = {n: float(alpha(n)) for n in set(lengths) if n >= 1}
        rates = [by_length.get(n, 0.0) for n in lengths]
    elif isinstance(alpha, (int, float)):
        rates = [float(alpha)] * len(lengths)
    else:
        rates = [float(a) for a in alpha]
        if len(rates) != len(lengths):
            raise ValueError(f"alpha: expected {len(lengths)} rates (one per row of lengths), got "
                             f"{len(rates)}")
    for n, rate in zip(lengths, rates, strict=True):
        if not 0 <= rate <= 1:
            raise ValueError(f"alpha: expected a rate in [0, 1], got {rate!r} at {n} drafts")
    most = max(remaining)

    def at_least(emitted: int, rate: float, drafts: int) -> float:
        """P(e >= emitted) for a row accepting each draft at `rate` and verifying `drafts`."""
        return 1.0 if emitted <= 1 else rate ** (emitted - 1) if emitted <= drafts + 1 else 0.0

    def speed(width: int) -> float:
        gain = 0.0
        for g in range(1, min(most, width + 1) + 1):
            chance = 1.0
            for n, rate, left in zip(lengths, rates, remaining, strict=True):
                chance *= at_least(left - most + g, rate, min(n, width))
            gain += chance
        cost = 1.0 if width == 0 else float(round_cost(batch, width))
        if not cost > 0:
            raise ValueError(f"round_cost: expected a positive cost, got {cost!r} at width {width}")
        return gain / cost

    longest = max(lengths)
    halves = {1 << i for i in range(longest.bit_length()) if 1 << i < longest}
    return max(sorted({0, *lengths, *halves}), key=lambda w: (speed(w), w))
