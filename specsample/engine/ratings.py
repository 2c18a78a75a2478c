"""Thm 3.8's ratings with the verify's cost counted: the fastest constant K (`fastest_k`), a
head's fastest fan-out (`fastest_fan_out`), and the width of a batch's round that ends the
call soonest (`batch_width`). Pure functions of rates and costs; `auto` decides with them in
`specsample.engine.scheduler`."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

from specsample._array import check_int
from specsample.core.metrics import expected_tokens_per_round

__all__ = ["batch_width", "fastest_fan_out", "fastest_k", "rounds_to_finish"]


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
                round_cost: Callable[[int, int], float], *, siblings: Sequence[bool] | None = None,
                narrowed: Callable[[int, int], float] | None = None) -> int:
    """The drafts per row for a round of `batch` rows that Thm 3.8's acceptance model
    predicts to finish the call soonest.

    A round is as wide as its widest row: one row that drafts K makes the target verify
    K + 1 positions of every row, which in a full batch costs several plain steps. And a
    call ends when its last row does, so a round is worth how far it brings that end
    nearer, not how many tokens all rows commit. Each candidate width w (0, a plain step,
    a row's own length, or a power of two below the longest) is rated, per plain step of
    the same batch (`round_cost(batch, w)`, 1 at w = 0), by the better of two plans that
    begin with it (the wider on a tie):

    - this round alone: with R the most tokens any active row has left, the round moves
      the end by G = R - max_b (r_b - e_b), r_b the row's tokens left and e_b = 1 + its
      accepted drafts (each of its min(L_b, w) drafts accepted in turn with probability
      alpha(L_b), independently across rows; but see `siblings`):
      P(G >= g) = prod_b P(e_b >= r_b - R + g).
      For one row E[G] is Thm 3.8's expected tokens per round, so at batch 1 this is
      Thm 3.8 with the verify's cost measured at each width.
    - this width to the end (`rounds_to_finish`): R over the expected rounds until every
      row is done; rated only where one round cannot end the call (R > w + 1), since its
      approximation is for rows with several rounds to go. Rows that start level gain
      little from one round (all of them must accept for the end to move), but over many
      rounds the rows' leads even out, and the call ends about when the average row does.

    Neither plan moves the end by more than E[e] of a row with R tokens left, so a width
    whose E[e] (or, for the second plan, whose rounds' cheap lower bound) over its cost
    cannot beat a narrower width's rating is not rated further: the same choice, without
    the integral on every round of a batch that takes plain steps.

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
        siblings: per row (in the order of `lengths`), whether its drafts are siblings
            (a head's fan-out: the m likeliest next tokens, one draft position): it gains
            at most one token from them. None: every row's drafts are a chain.
        narrowed: for `siblings` rows in a round narrower than their m: (m, j) -> the
            factor on the row's rate for its j < m siblings (fewer candidates hold the
            target's token less often than its record of m says; e.g. a head's held-out
            hits[j - 1] / hits[m - 1]). None: such a round counts none of them.
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
    if siblings is None:
        siblings = [False] * len(lengths)
    elif len(siblings) != len(lengths) or any(not isinstance(f, bool) for f in siblings):
        raise ValueError(f"siblings: expected {len(lengths)} bools (one per row of lengths), got "
                         f"{list(siblings)!r}")
    most = max(remaining)

    def drafts_at(width: int) -> tuple[list[int], list[float]]:
        """Each row's drafts that a round of `width` can accept in turn, and their rate."""
        drafts, at = [], []
        for n, fan, rate in zip(lengths, siblings, rates, strict=True):
            if not fan or n <= width:
                drafts.append(min(n, 1) if fan else min(n, width))
                at.append(rate)
                continue
            factor = 0.0 if narrowed is None or width < 1 else float(narrowed(n, width))
            if not 0 <= factor <= 1:
                raise ValueError(f"narrowed: expected a factor in [0, 1], got {factor!r} for {width} of "
                                 f"{n} siblings")
            drafts.append(1 if factor > 0 else 0)
            at.append(rate * factor)
        return drafts, at

    def at_least(emitted: int, rate: float, drafts: int) -> float:
        """P(e >= emitted) for a row accepting each draft at `rate` and verifying `drafts`."""
        return 1.0 if emitted <= 1 else rate ** (emitted - 1) if emitted <= drafts + 1 else 0.0

    def speed(width: int, best: float) -> float:
        """The width's rating; where it cannot reach `best`, a bound below `best` instead."""
        drafts, at = drafts_at(width)
        cost = 1.0 if width == 0 else float(round_cost(batch, width))
        if not cost > 0:
            raise ValueError(f"round_cost: expected a positive cost, got {cost!r} at width {width}")
        # Neither plan moves the end by more than a last row's own mean tokens a round, E[e].
        # Summed term by term as `gain` sums the same powers (not the closed form of
        # `expected_tokens_per_round`), so that the bound holds in floating point too.
        bound = min(sum(rate ** i for i in range(n + 1))
                    for n, rate, left in zip(drafts, at, remaining, strict=True) if left == most) / cost
        if bound < best:
            return bound
        gain = 0.0
        for g in range(1, min(most, width + 1) + 1):
            chance = 1.0
            for n, rate, left in zip(drafts, at, remaining, strict=True):
                chance *= at_least(left - most + g, rate, n)
            gain += chance
        if len(lengths) > 1 and 0 < width < most - 1:  # one round cannot end the call
            rows = _renewal(drafts, at, remaining)
            # The rounds to finish are at least `rows.floor`, so this plan's rate is at
            # most most / floor: a width that cannot beat the best even so needs no integral.
            bound = max(gain, most / rows.floor) / cost
            if bound < best:
                return bound
            gain = max(gain, most / rows.rounds())
        return gain / cost

    longest = max(lengths)
    halves = {1 << i for i in range(longest.bit_length()) if 1 << i < longest}
    chosen, best = 0, -math.inf
    for width in sorted({0, *lengths, *halves}):
        rated = speed(width, best)
        if rated >= best:  # the wider on a tie
            chosen, best = width, rated
    return chosen


def rounds_to_finish(drafts: Sequence[int], rates: Sequence[float], remaining: Sequence[int]) -> float:
    """The expected rounds until the last of a batch's rows is done, when every round
    drafts `drafts[b]` tokens for row b, each accepted in turn with probability `rates[b]`,
    and row b has `remaining[b]` tokens left.

    A row's tokens a round, e = 1 + its accepted drafts, have mean mu and variance s^2, so
    by renewal theory the rounds it needs for r tokens are about normal with mean
    (r - 1 + overshoot) / mu and variance r s^2 / mu^3 (a row that never drafts, or always
    accepts, needs exactly ceil(r / mu)). The expected largest of independent rows' rounds,
    E[max_b T_b] = lo + integral from lo of (1 - prod_b P(T_b <= t)) dt, is integrated
    numerically (Simpson's rule) from lo, the point below which the latest row is almost
    surely not done; never below the fewest rounds possible, max_b ceil(r_b / (n_b + 1)),
    nor below any row's own mean (E[max_b T_b] >= max_b E[T_b]; a nearly certain row's CDF
    is a step that the rule's grid can blur).

    Args:
        drafts: each row's drafts a round, >= 0.
        rates: each row's per-draft acceptance, in [0, 1].
        remaining: each row's tokens left, >= 1.
    """
    if not drafts or len(rates) != len(drafts) or len(remaining) != len(drafts):
        raise ValueError(f"drafts, rates, remaining: expected equally long non-empty lists, got "
                         f"{len(drafts)}, {len(rates)}, {len(remaining)}")
    for n, rate, left in zip(drafts, rates, remaining, strict=True):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"drafts: expected ints >= 0, got {list(drafts)!r}")
        if not 0 <= rate <= 1:
            raise ValueError(f"rates: expected rates in [0, 1], got {list(rates)!r}")
        if isinstance(left, bool) or not isinstance(left, int) or left < 1:
            raise ValueError(f"remaining: expected ints >= 1, got {list(remaining)!r}")
    return _rounds_to_finish(drafts, rates, remaining)


def _rounds_to_finish(drafts: Sequence[int], rates: Sequence[float], remaining: Sequence[int]) -> float:
    """`rounds_to_finish` on checked inputs (`batch_width` checks its own, once a call)."""
    return _renewal(drafts, rates, remaining).rounds()


@dataclasses.dataclass(frozen=True)
class _Renewal:
    """Each row's rounds to finish as a normal law (mean, spread), and `floor`: a lower
    bound on the expected rounds until the last row is done, with no integral: the fewest
    rounds possible, and the latest row's own mean (E[max_b T_b] >= max_b E[T_b])."""

    means: list[float]
    spreads: list[float]
    floor: float

    def rounds(self) -> float:
        """The expected rounds until the last row is done, never below `floor`."""
        means, spreads = self.means, self.spreads
        lo = max(0.0, *(m - 8 * s for m, s in zip(means, spreads, strict=True)))
        hi = max(m + 8 * s for m, s in zip(means, spreads, strict=True))
        # Level rows share a law: each distinct one counted once, its CDF raised to its count.
        random_rows = collections.Counter((m, s) for m, s in zip(means, spreads, strict=True) if s > 0)
        if hi - lo <= 1e-12 or not random_rows:
            return self.floor

        def late(t: float) -> float:  # P(max_b T_b > t)
            done = 1.0
            for (m, s), count in random_rows.items():
                done *= (0.5 * (1 + math.erf((t - m) / (s * math.sqrt(2))))) ** count
            return 1 - done

        steps = 128  # even, for Simpson's rule
        h = (hi - lo) / steps
        total = late(lo) + late(hi) + sum((4 if i % 2 else 2) * late(lo + i * h) for i in range(1, steps))
        return max(self.floor, lo + total * h / 3)


def _renewal(drafts: Sequence[int], rates: Sequence[float], remaining: Sequence[int]) -> _Renewal:
    """The rows' renewal laws (`rounds_to_finish`), on checked inputs."""
    means, spreads = [], []
    for n, rate, left in zip(drafts, rates, remaining, strict=True):
        chances = [rate ** i for i in range(n + 1)]  # P(e >= i + 1)
        mu = sum(chances)
        second = sum((2 * i + 1) * p for i, p in enumerate(chances))  # E[e^2]
        variance = max(0.0, second - mu * mu)
        if variance == 0:  # e = mu every round
            means.append(float(math.ceil(left / mu)))
            spreads.append(0.0)
            continue
        # Done once its tokens pass left - 1; the expected overshoot of a lattice renewal
        # process past a level is (E[e^2] + mu) / (2 mu).
        means.append((left - 1 + (second + mu) / (2 * mu)) / mu)
        spreads.append(math.sqrt(left * variance / mu ** 3))
    # No row is done before every draft of every round could have carried it there.
    fewest = max(math.ceil(left / (n + 1)) for n, left in zip(drafts, remaining, strict=True))
    return _Renewal(means, spreads, max(float(fewest), max(means)))
