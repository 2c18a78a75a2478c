"""Thm 3.8's ratings with the verify's cost counted: the fastest constant K (`fastest_k`), a
head's fastest fan-out (`fastest_fan_out`), and the width of a batch's round that ends the
call soonest (`batch_width`). Pure functions of rates and costs; `auto` decides with them in
`specsample.engine.scheduler`."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from specsample._array import check_int
from specsample.core.metrics import expected_tokens_per_round

__all__ = ["batch_width", "fastest_fan_out", "fastest_k"]


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
    _check_c(c)
    check_int("k_max", k_max, 1)
    _check_callable(width_cost)
    rates: list[float] = []
    for k in range(1, k_max + 1):
        cost = k * float(c) + _cost_at(width_cost, k + 1)
        rates.append(expected_tokens_per_round(float(alpha), k) / cost)
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
    _check_c(c)
    _check_callable(width_cost)
    rated = [(1 + hit) / (float(c) + _cost_at(width_cost, m + 1)) for m, hit in enumerate(rates, start=1)]
    best = max(range(len(rated)), key=lambda i: (rated[i], -i))
    return best + 1, tuple(rated)


def _check_c(c: Any) -> None:
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < float("inf"):
        raise ValueError(f"c: expected a finite cost ratio >= 0, got {c!r}")


def _check_callable(width_cost: Any) -> None:
    if not callable(width_cost):
        raise TypeError(f"width_cost: expected a function positions -> cost, got {type(width_cost).__name__}")


def _cost_at(width_cost: Callable[[int], float], positions: int) -> float:
    cost = float(width_cost(positions))
    if not 0 < cost < float("inf"):
        raise ValueError(f"width_cost: expected a positive finite cost, got {cost!r} at {positions} "
                         f"positions")
    return cost


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
