"""Thm 3.8's ratings with the verify's cost: the fastest K, a head's fastest fan-out, and the
width of a batch's round that ends the call soonest."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from specsample.core.metrics import predicted_speedup
from specsample.engine import ratings
from specsample.engine.ratings import batch_width, fastest_fan_out, fastest_k, rounds_to_finish


def _simulated_rounds(drafts: list[int], rates: list[float], remaining: list[int], runs: int) -> float:
    """Mean rounds until every row is done, by direct simulation of each row's acceptances."""
    rng, total = random.Random(1), 0
    for _ in range(runs):
        left, rounds = list(remaining), 0
        while any(n > 0 for n in left):
            rounds += 1
            for b, n in enumerate(left):
                if n > 0:
                    gained = 1
                    while gained <= drafts[b] and rng.random() < rates[b]:
                        gained += 1
                    left[b] = n - gained
        total += rounds
    return total / runs


@pytest.mark.parametrize(("drafts", "rates", "remaining"), [
    ([1, 1], [0.3, 0.3], [48, 48]), ([2, 2], [0.8, 0.8], [50, 50]), ([4] * 8, [0.5] * 8, [64] * 8),
    ([3, 3], [0.6, 0.2], [20, 30]), ([4, 4], [0.9, 0.9], [8, 10]), ([2, 0], [0.5, 0.5], [9, 7]),
    ([4], [0.6], [30])])
def test_rounds_to_finish_matches_a_simulation(drafts: list[int], rates: list[float],
                                               remaining: list[int]) -> None:
    # 3,000 simulated calls: the simulated mean's standard error is below 0.5% of it in each
    # case (rounds vary by a few per call), so a 4% tolerance leaves the renewal
    # approximation's own error (under 2.5% here) room, and a model off by a tenth fails.
    simulated = _simulated_rounds(drafts, rates, remaining, 3000)
    assert rounds_to_finish(drafts, rates, remaining) == pytest.approx(simulated, rel=0.04)


def test_rounds_to_finish_sees_what_a_naive_mean_misses() -> None:
    """Negative control for the tolerance above: eight level rows' naive r / mu (22.9 rounds),
    which ignores the spread of the rows (the call waits for the slowest), is more than 4%
    off the simulated mean; the renewal approximation is within it."""
    simulated = _simulated_rounds([1] * 8, [0.4] * 8, [32] * 8, 3000)
    naive = 32 / 1.4
    assert naive != pytest.approx(simulated, rel=0.04)
    assert rounds_to_finish([1] * 8, [0.4] * 8, [32] * 8) == pytest.approx(simulated, rel=0.04)


def test_rounds_to_finish_exact_cases_and_bad_input() -> None:
    assert rounds_to_finish([4], [0.9], [1]) == 1  # never below the fewest rounds possible
    assert rounds_to_finish([4, 4], [0.9, 0.9], [3, 2]) >= 1
    assert rounds_to_finish([0, 0], [0.5, 0.5], [7, 9]) == 9  # plain steps: one token a round
    assert rounds_to_finish([2, 3], [1.0, 1.0], [9, 9]) == 3  # always accepted: ceil(r / (n + 1))
    with pytest.raises(ValueError, match="drafts, rates, remaining: expected equally long"):
        rounds_to_finish([1, 1], [0.5], [3, 3])
    with pytest.raises(ValueError, match=r"rates: expected rates in \[0, 1\], got \[0.5, 1.5\]"):
        rounds_to_finish([1, 1], [0.5, 1.5], [3, 3])
    with pytest.raises(ValueError, match=r"remaining: expected ints >= 1, got \[3, 0\]"):
        rounds_to_finish([1, 1], [0.5, 0.5], [3, 0])
    with pytest.raises(ValueError, match=r"drafts: expected ints >= 0, got \[-1, 1\]"):
        rounds_to_finish([-1, 1], [0.5, 0.5], [3, 3])


def test_rounds_to_finish_is_never_below_a_rows_own_mean() -> None:
    # Eight level rows, one of them accepting almost never: the call cannot end before that
    # row alone would. Its CDF is a step narrower than the integral's grid, which without
    # the bound put the last row's end at 67.993 rounds, under the row's own 67.996.
    rates = [0.39, 0.12, 0.35, 5.34e-5, 0.81, 0.56, 0.91, 0.20]
    drafts = [6, 7, 6, 4, 7, 7, 2, 2]
    alone = rounds_to_finish([4], [5.34e-5], [68])
    assert 67.99 < alone < 68
    assert rounds_to_finish(drafts, rates, [68] * 8) >= alone


def _every_width_rated(lengths: list[int], remaining: list[int], batch: int, alpha: float,
                       cost: Callable[[int, int], float]) -> int:
    """`batch_width` for chains as its docstring states it, every width's plans rated in full."""
    most = max(remaining)

    def at_least(emitted: int, n: int) -> float:
        return 1.0 if emitted <= 1 else alpha ** (emitted - 1) if emitted <= n + 1 else 0.0

    def speed(width: int) -> float:
        drafts = [min(n, width) for n in lengths]
        gain = sum(math.prod(at_least(left - most + g, n) for n, left in zip(drafts, remaining, strict=True))
                   for g in range(1, min(most, width + 1) + 1))
        if len(lengths) > 1 and 0 < width < most - 1:
            gain = max(gain, most / rounds_to_finish(drafts, [alpha] * len(lengths), remaining))
        return gain / (1.0 if width == 0 else cost(batch, width))

    halves = {1 << i for i in range(max(lengths).bit_length()) if 1 << i < max(lengths)}
    return max(sorted({0, *lengths, *halves}), key=lambda w: (speed(w), w))


def test_batch_width_leaves_out_only_widths_that_cannot_win(monkeypatch: pytest.MonkeyPatch) -> None:
    """A width whose bound (a last row's E[e], or the rounds to finish at least the latest
    row's mean) over its cost is below the best rating so far is not rated in full: the
    choice is the same as with every width rated, over 400 random batches, and a full batch
    of head rows that cannot pay integrates nothing."""
    rng = random.Random(3)
    for _ in range(400):
        batch = rng.choice([2, 3, 8])
        lengths = [rng.choice([0, 1, 2, 4, 8, 16]) for _ in range(batch)]
        remaining = [rng.randint(1, 64) for _ in range(batch)]
        alpha, slope = rng.uniform(0.05, 0.95), rng.uniform(0.01, 0.4)

        def cost(b: int, w: int, slope: float = slope) -> float:
            return 1 + slope * w * b / 4

        args = (lengths, remaining, batch, alpha, cost)
        assert batch_width(*args) == _every_width_rated(*args), args
    integrals = []
    rounds = ratings._Renewal.rounds
    monkeypatch.setattr(ratings._Renewal, "rounds", lambda self: integrals.append(1) or rounds(self))
    assert batch_width([1] * 8, list(range(40, 48)), 8, 0.4, lambda b, w: 1.49) == 0
    assert integrals == []
    assert batch_width([1] * 8, list(range(40, 48)), 8, 0.4, lambda b, w: 1.05) == 1
    assert integrals


def test_level_rows_draft_where_each_gains_on_average() -> None:
    # Two rows with 48 tokens left, one draft each at alpha 0.3, a round costing 1.12 plain
    # steps: one round moves the end by 1 + 0.3^2 = 1.09 (< 1.12), yet drafting to the end
    # takes about 38.3 rounds instead of 48 (43 plain steps' cost), so the round drafts.
    assert 1 + 0.3 ** 2 < 1.12 < 48 / rounds_to_finish([1, 1], [0.3, 0.3], [48, 48])
    assert batch_width([1, 1], [48, 48], 2, 0.3, lambda b, w: 1.12) == 1
    # One of them never drafting: the other's drafts cannot bring the end nearer.
    assert batch_width([1, 0], [48, 48], 2, 0.3, lambda b, w: 1.12) == 0
    # Every row one token from its stop: no plan gains from drafts.
    assert batch_width([4, 4], [1, 1], 2, 0.9, lambda b, w: 1 + 0.1 * w) == 0


def test_batch_width_rates_a_round_by_how_far_it_moves_the_calls_end() -> None:
    from specsample.core.metrics import expected_tokens_per_round
    # One row: the end moves by the row's own tokens, Thm 3.8's E (1.9375 at alpha 0.5, K=4).
    assert batch_width([4], [100], 1, 0.5, lambda b, w: 1.93) == 4
    assert batch_width([4], [100], 1, 0.5, lambda b, w: 1.94) == 0
    assert expected_tokens_per_round(0.5, 4) == pytest.approx(1.9375)
    # Eight rows with as many tokens left: one row's copies never bring the end nearer,
    # whatever they commit, so any width that costs more than a plain step loses.
    lengths = [4, 0, 0, 0, 0, 0, 0, 0]
    assert batch_width(lengths, [64] * 8, 8, 0.5, lambda b, w: 1.01) == 0
    assert batch_width(lengths, [64] * 8, 8, 0.5, lambda b, w: 1.0) == 4  # a tie: the wider
    # Two level rows drafting 2 at alpha 0.8: one round moves the end by E[G] = 1 + 0.8^2 +
    # (0.8^2)^2 = 2.0496 (both must accept), but drafting 2 to the end moves it 50 / E[rounds]
    # a round, about 2.3: the rows' leads even out, and that plan rates the width.
    to_end = 50 / rounds_to_finish([2, 2], [0.8, 0.8], [50, 50])
    assert 2.25 < to_end < 2.35
    assert batch_width([2, 2], [50, 50], 2, 0.8, lambda b, w: to_end - 0.01) == 2
    assert batch_width([2, 2], [50, 50], 2, 0.8, lambda b, w: to_end + 0.01) == 0
    # A row ahead of the last one: its drafts are worth nothing, the last row's are.
    assert batch_width([4, 0], [10, 20], 2, 0.5, lambda b, w: 1.1) == 0
    assert batch_width([0, 4], [10, 20], 2, 0.5, lambda b, w: 1.93) == 4
    # A row 2 tokens ahead holds the end back only once the last row gains 4 or more:
    # P(G >= g) = P(e_1 >= g - 2) P(e_2 >= g), e_b - 1 accepted of 4 drafts at alpha 0.9.
    g = 1 + 0.9 + 0.9 ** 2 + 0.9 * 0.9 ** 3 + 0.9 ** 2 * 0.9 ** 4
    assert batch_width([4, 4], [8, 10], 2, 0.9, lambda b, w: g - 0.01) == 4
    assert batch_width([4, 4], [8, 10], 2, 0.9, lambda b, w: g + 0.01) == 0
    # The end cannot move past the tokens left.
    assert batch_width([3], [1], 1, 1.0, lambda b, w: 1.01) == 0
    assert batch_width([2, 3], [9, 9], 2, 1.0, lambda b, w: 1.0) == 3  # free width: the widest
    assert batch_width([0, 0], [9, 9], 2, 0.9, lambda b, w: 1.0) == 0
    # Acceptance by wanted length: a row wanting 4 at alpha(4) = 0.9 is worth a 5-wide round
    # that a pooled 0.3 would refuse, and a row wanting 1 at alpha(1) = 0.3 is not.
    by_length = {1: 0.3, 4: 0.9}.__getitem__
    assert batch_width([4], [50], 1, by_length, lambda b, w: 1.5) == 4
    assert batch_width([4], [50], 1, 0.3, lambda b, w: 1.5) == 0
    assert batch_width([1], [50], 1, by_length, lambda b, w: 1.5) == 0
    # A row narrowed to w drafts keeps its own rate: [4, 1] at width 1 is rated with 0.9 and 0.3.
    two = 50 / rounds_to_finish([1, 1], [0.9, 0.3], [50, 50])  # the slower row sets the end
    assert two > 1 + 0.9 * 0.3  # one round's gain: both rows must gain
    assert batch_width([4, 1], [50, 50], 2, by_length, lambda b, w: {1: two - 0.01}.get(w, 99.0)) == 1
    assert batch_width([4, 1], [50, 50], 2, by_length, lambda b, w: {1: two + 0.01}.get(w, 99.0)) == 0
    # Powers of two below the longest length are candidates too: a row wanting 8 at a modest
    # rate is best verified 2 or 4 wide when wide verifies cost more (Thm 3.8 per width).
    steps = {1: 1.43, 2: 1.46, 4: 1.53, 8: 1.75}
    asked: list[int] = []
    best = {w: expected_tokens_per_round(0.6, w) / steps[w] for w in steps}
    assert batch_width([8], [50], 1, 0.6, lambda b, w: asked.append(w) or steps[w]) == max(best, key=best.get)
    assert sorted(asked) == [1, 2, 4, 8] and max(best, key=best.get) == 4
    assert batch_width([8], [50], 1, 0.95, lambda b, w: steps[w]) == 8
    with pytest.raises(ValueError, match=r"alpha: expected a rate in \[0, 1\], got 1.5 at 2 drafts"):
        batch_width([2], [50], 1, lambda d: 1.5, lambda b, w: 1.0)
    # One rate per row: two rows wanting 4, a copy at 0.9 and a model draft at 0.3, are rated
    # each at its own rate (the same lengths with a pooled rate would say otherwise).
    assert batch_width([4, 0], [50, 40], 2, [0.9, 0.3], lambda b, w: 1.5) == 4
    assert batch_width([0, 4], [40, 50], 2, [0.9, 0.3], lambda b, w: 1.5) == 0
    assert batch_width([4, 0], [50, 40], 2, 0.3, lambda b, w: 1.5) == 0
    with pytest.raises(ValueError, match="alpha: expected 2 rates"):
        batch_width([4, 0], [50, 40], 2, [0.9], lambda b, w: 1.5)
    # The batch it is asked about is the batch given.
    seen: list[int] = []
    batch_width([3], [9], 5, 0.5, lambda b, w: seen.append(b) or 1.0)
    assert set(seen) == {5}


@pytest.mark.parametrize(("args", "match"), [
    (([], [], 2, 0.5), "lengths: expected a non-empty list of ints >= 0"),
    (([1, -1], [3, 3], 2, 0.5), "lengths: expected a non-empty list of ints >= 0"),
    (([1, 1], [3], 2, 0.5), r"remaining: expected 2 ints >= 1 \(one per row of lengths\), got \[3\]"),
    (([1], [0], 2, 0.5), "remaining: expected 1 ints >= 1"),
    (([1], [3], 0, 0.5), "batch: expected an int >= 1"),
    (([1], [3], 2, 1.5), r"alpha: expected a rate in \[0, 1\], got 1.5"),
])
def test_batch_width_rejects_bad_input(args: tuple[object, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        batch_width(*args, lambda b, w: 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="round_cost: expected a positive cost"):
        batch_width([2], [3], 2, 0.5, lambda b, w: 0.0)


# -- fastest_k: the constant K Thm 3.8 rates fastest with the verify's cost counted --------------


def _rate(alpha: float, k: int, c: float, width: float) -> float:
    return (1 - alpha ** (k + 1)) / (1 - alpha) / (k * c + width)


def test_fastest_k_is_the_argmax_of_the_rate_with_the_verify_cost() -> None:
    # A cheap head with low acceptance: K = 1; a cheap, accurate draft over a flat verify: long K.
    k, rates = fastest_k(0.3, 0.12, lambda n: 1 + 0.05 * (n - 1), 8)
    assert k == 1 and rates[0] == pytest.approx(_rate(0.3, 1, 0.12, 1.05)) and len(rates) == 8
    k, rates = fastest_k(0.9, 0.02, lambda n: 1.0, 8)
    assert k == 8 and len(rates) == 8
    assert rates == pytest.approx(tuple(_rate(0.9, j, 0.02, 1.0) for j in range(1, 9)))
    assert k == max(range(1, 9), key=lambda j: _rate(0.9, j, 0.02, 1.0))


def test_fastest_k_bites_the_verify_cost_changes_the_choice() -> None:
    # Negative control: the same draft rated as if verifying were free (Thm 3.8 alone) picks
    # a longer K than with this CPU's measured growth of the verify's cost with its width.
    free, _ = fastest_k(0.8, 0.1, lambda n: 1.0, 8)
    costly, _ = fastest_k(0.8, 0.1, lambda n: 1 + 0.25 * (n - 1), 8)
    assert free == max(range(1, 9), key=lambda j: predicted_speedup(0.8, j, 0.1)) and costly < free


def test_fastest_k_rates_past_a_step_in_the_verify_cost() -> None:
    # A verify cost that jumps once and then stays flat: K = 2 rates below K = 1, yet the
    # longest K rates best; every K is rated.
    k, rates = fastest_k(0.9, 0.02, lambda n: 1.0 if n == 2 else 1.6, 8)
    assert len(rates) == 8 and rates[1] < rates[0] and k == 8


# -- fastest_fan_out: the depth-1 fan-out Thm 3.8 rates fastest with the verify's cost counted --

HITS = (0.36, 0.50, 0.60, 0.65, 0.68, 0.70)  # a head's top-m hit rates, m = 1..6


def test_fastest_fan_out_is_the_argmax_of_hits_over_the_round_cost() -> None:
    # A flat verify: every further candidate is free, so the widest fan-out wins.
    m, rates = fastest_fan_out(HITS, 0.1, lambda n: 1.0)
    assert m == 6 and rates == pytest.approx(tuple((1 + h) / 1.1 for h in HITS))
    # A verify that grows 5% a position: (1 + h_m) / (0.1 + 1 + 0.05 m) peaks at m = 3.
    m, rates = fastest_fan_out(HITS, 0.1, lambda n: 1 + 0.05 * (n - 1))
    want = [(1 + h) / (0.1 + 1 + 0.05 * j) for j, h in enumerate(HITS, start=1)]
    assert rates == pytest.approx(tuple(want)) and m == 1 + max(range(6), key=lambda i: want[i]) == 3


def test_fastest_fan_out_bites_a_step_in_the_verify_cost() -> None:
    # Negative control: a verify whose cost jumps past 4 positions stops the fan-out at 3,
    # where the same hits over a flat verify take all 6.
    m, rates = fastest_fan_out(HITS, 0.1, lambda n: 1.0 if n <= 4 else 1.5)
    assert m == 3 and rates[3] < rates[2]
    assert fastest_fan_out(HITS, 0.1, lambda n: 1.0)[0] == 6


@pytest.mark.parametrize("args, error, match", [
    (((), 0.1, lambda n: 1.0), ValueError, "hits: expected a non-empty sequence of rates"),
    (("0.5", 0.1, lambda n: 1.0), ValueError, "hits: expected a non-empty sequence of rates"),
    (((0.5, 0.4), 0.1, lambda n: 1.0), ValueError, "none below its predecessor"),
    (((0.5, 1.2), 0.1, lambda n: 1.0), ValueError, r"hits: expected rates in \[0, 1\]"),
    (((0.5,), -0.1, lambda n: 1.0), ValueError, "c: expected a finite cost ratio >= 0"),
    (((0.5,), 0.1, 1.0), TypeError, "width_cost: expected a function positions -> cost"),
    (((0.5,), 0.1, lambda n: 0.0), ValueError, "width_cost: expected a positive finite cost, got 0.0 at 2"),
])
def test_bad_fan_out_inputs_are_clear_errors(args: tuple, error: type, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(error, match=match):
        fastest_fan_out(*args)


@pytest.mark.parametrize("args, error, match", [
    ((1.5, 0.1, lambda n: 1.0, 4), ValueError, "alpha: expected a rate in"),
    ((0.5, -1.0, lambda n: 1.0, 4), ValueError, "c: expected a finite cost ratio"),
    ((0.5, float("nan"), lambda n: 1.0, 4), ValueError, "c: expected a finite cost ratio"),
    ((0.5, 0.1, lambda n: 1.0, 0), ValueError, "k_max"),
    ((0.5, 0.1, 2.0, 4), TypeError, "width_cost: expected a function"),
    ((0.5, 0.1, lambda n: 0.0, 4), ValueError, "width_cost: expected a positive finite cost, got 0.0 at 2"),
])
def test_fastest_k_rejects_bad_input(args: tuple[object, ...], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        fastest_k(*args)  # type: ignore[arg-type]


def test_a_fan_out_rows_siblings_gain_one_token_at_most() -> None:
    # Two level rows wanting 2 at 0.5, every width costing 1.5 plain steps: as chains, 2 drafts
    # to the end make about 1.65 tokens a round (pays); as two siblings each, at most one is
    # accepted, about 1.44 a round (does not), and one round alone never pays.
    chains = 48 / rounds_to_finish([2, 2], [0.5, 0.5], [48, 48])
    siblings = 48 / rounds_to_finish([1, 1], [0.5, 0.5], [48, 48])
    assert siblings < 1.5 < chains
    assert batch_width([2, 2], [48, 48], 2, 0.5, lambda b, w: 1.5) == 2
    assert batch_width([2, 2], [48, 48], 2, 0.5, lambda b, w: 1.5, siblings=[True, True]) == 0
    # One row: siblings at hit rate 0.5 make 1 + 0.5 tokens a round (a chain 1.75), and a
    # round narrower than the fan-out is no use to them.
    assert batch_width([2], [48], 1, 0.5, lambda b, w: 1.6) == 2
    assert batch_width([2], [48], 1, 0.5, lambda b, w: 1.6, siblings=[True]) == 0
    assert batch_width([2], [48], 1, 0.5, lambda b, w: 1.45, siblings=[True]) == 2
    assert batch_width([2], [48], 1, 0.5, lambda b, w: {1: 1.0}.get(w, 1.45), siblings=[True]) == 2
    # Narrowed to one of its two siblings, a row's rate is scaled (here by 0.8, as a head's
    # held-out hits[0] / hits[1] would): 1 + 0.4 tokens at 1.2 beats 1 + 0.5 at 1.45.
    costs = {1: 1.2, 2: 1.45}.__getitem__
    assert batch_width([2], [48], 1, 0.5, lambda b, w: costs(w), siblings=[True],
                       narrowed=lambda m, j: 0.8) == 1
    assert batch_width([2], [48], 1, 0.5, lambda b, w: costs(w), siblings=[True]) == 2
    with pytest.raises(ValueError, match=r"narrowed: expected a factor in \[0, 1\], got 1.5 for 1 of 2"):
        batch_width([2], [48], 1, 0.5, lambda b, w: costs(w), siblings=[True], narrowed=lambda m, j: 1.5)
    with pytest.raises(ValueError, match=r"siblings: expected 2 bools \(one per row of lengths\)"):
        batch_width([2, 2], [48, 48], 2, 0.5, lambda b, w: 1.5, siblings=[True])
