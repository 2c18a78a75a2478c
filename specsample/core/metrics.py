"""Acceptance metrics and the speedup predicted by Leviathan et al. (2023)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from fractions import Fraction
from typing import TypeVar

from specsample._array import check_int

__all__ = ["Costs", "Metrics", "expected_tokens_per_round", "predicted_speedup", "tally"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Costs:
    """The cost side of Thm 3.8 on one machine, in units of a one-position target forward.

    Attributes:
        c: a draft step's cost, finite and >= 0.
        width: None, or (batch, positions) -> a target forward of that many positions per
            row over one of one position, at that batch size (> 0; measured by a backend).
    """

    c: float
    width: Callable[[int, int], float] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.c, bool) or not isinstance(self.c, (int, float)) or not 0 <= self.c < float("inf"):
            raise ValueError(f"c: expected a finite cost ratio >= 0, got {self.c!r}")
        if self.width is not None and not callable(self.width):
            raise TypeError(f"width: expected None or a function (batch, positions) -> cost, got "
                            f"{type(self.width).__name__}")


Rate = TypeVar("Rate", float, Fraction)


def _check_alpha_k(alpha: float | Fraction, k: int) -> None:
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha: expected a rate in [0, 1], got {alpha}")
    check_int("k", k, 0)


def expected_tokens_per_round(alpha: Rate, k: int) -> Rate:
    """E[tokens per round] = (1 - alpha^(K+1)) / (1 - alpha) (Leviathan et al., Eq. 1).

    K = 0 (a plain step) gives 1. Exact for a Fraction alpha (the result is a Fraction),
    a float otherwise.
    """
    _check_alpha_k(alpha, k)
    if alpha == 1:
        return alpha * (k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """Walltime speedup (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)) (Thm 3.8).

    Assumes i.i.d. acceptance with rate alpha and a draft costing c target forwards.
    """
    return expected_tokens_per_round(alpha, k) / (k * _cost_ratio(c) + 1)


def _cost_ratio(c: float) -> float:
    if not math.isfinite(c) or c < 0:
        raise ValueError(f"c: expected a finite cost ratio >= 0, got {c}")
    return c


@dataclasses.dataclass(frozen=True, kw_only=True)
class Metrics:
    """Counts over a generation; rates derive from them.

    Attributes:
        rounds: speculative rounds run (a round counts once for the batch).
        row_rounds: (row, round) pairs in which the row was active.
        drafted: draft tokens proposed to active rows.
        accepted: draft tokens accepted.
        emitted: tokens committed (accepted + final, cut at EOS / max tokens).
        histogram: histogram[n] = row-rounds with drafts (K >= 1) that accepted exactly n.
        full_rounds: row-rounds that accepted every draft (no rejection).
        k_counts: k_counts[k] = rounds run with K = k (K = 0: a plain step, no draft).
        elapsed_s: wall time of the rounds, in seconds.
        accepted_at, trials_at: accepted_at[d] = drafts accepted by row-rounds that wanted
            d drafts (verified d, or fewer where a round was narrowed), trials_at[d] = those
            plus their rejections: `alpha`'s evidence split by a row's wanted draft length
            (a drafter's short and long proposals are accepted at different rates). Rows
            whose proposal was a copy of earlier context (a hybrid drafter's prompt lookup
            rows) are counted apart, in copied_accepted_at and copied_trials_at: a copy and a
            model draft of the same length are accepted at very different rates. A row whose
            drafts were siblings (a head's fan-out: at most one of them is accepted) counts
            one trial a round, a hit or not, so its rate is the fan-out's hit rate.
        copied_k_counts: copied_k_counts[k] = rounds run with K = k >= 1 in which every row
            that drafted proposed a copy (no draft model ran: `predicted_speedup` prices them
            at the copying drafter's own cost).
    """

    rounds: int = 0
    row_rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    histogram: tuple[int, ...] = ()
    full_rounds: int = 0
    k_counts: tuple[int, ...] = ()
    elapsed_s: float = 0.0
    accepted_at: tuple[int, ...] = ()
    trials_at: tuple[int, ...] = ()
    copied_accepted_at: tuple[int, ...] = ()
    copied_trials_at: tuple[int, ...] = ()
    copied_k_counts: tuple[int, ...] = ()

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float:
        """Per-token acceptance estimate: accepted / (accepted + rejections).

        The maximum-likelihood estimate of alpha under the truncated geometric
        law of accepted lengths (rounds that accepted all K drafts saw no rejection).
        """
        return self.alpha_with_prior(0.0, 0.0)

    def alpha_with_prior(self, prior_alpha: float, prior_weight: float) -> float:
        """`alpha` with `prior_weight` pseudo-trials at rate `prior_alpha` added (0 if no trials)."""
        rejections = self.row_rounds - self.full_rounds
        trials = self.accepted + rejections + prior_weight
        return (self.accepted + prior_alpha * prior_weight) / trials if trials else 0.0

    def alpha_at(self, drafts: int, prior_alpha: float, prior_weight: float, *,
                 copied: bool = False) -> float:
        """The acceptance of rows that wanted `drafts` drafts (with `copied`, of those whose
        proposal was a copy), with `prior_weight` pseudo-trials at rate `prior_alpha` added
        (0 if no trials)."""
        check_int("drafts", drafts, 1)
        accepted_at, trials_at = ((self.copied_accepted_at, self.copied_trials_at) if copied
                                  else (self.accepted_at, self.trials_at))
        accepted = accepted_at[drafts] if drafts < len(accepted_at) else 0
        trials = (trials_at[drafts] if drafts < len(trials_at) else 0) + prior_weight
        return (accepted + prior_alpha * prior_weight) / trials if trials else 0.0

    @property
    def mean_tokens_per_round(self) -> float:
        """Committed tokens per active row-round."""
        return self.emitted / self.row_rounds if self.row_rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Committed tokens per second of wall time."""
        return self.emitted / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mean_k(self) -> float:
        """The average K over rounds."""
        total = sum(self.k_counts)
        return sum(k * n for k, n in enumerate(self.k_counts)) / total if total else 0.0

    def predicted_speedup(self, c: float, *, copy_c: float | None = None) -> float:
        """Thm 3.8's prediction from the measured alpha and cost ratio c, per K actually run.

        With rounds at several K (an adaptive policy, a drafter that shortens rounds), the
        expected tokens and the cost (K c + 1 target forwards) of each round are summed:
        sum_K n_K E(alpha, K) / sum_K n_K (K c + 1); a constant K gives Thm 3.8 itself.
        A plain step (K = 0) counts as one token for one forward.

        With `copy_c` (a hybrid drafter: copies of earlier context in some rounds, a draft
        model's drafts in others), the theorem is applied to each kind of round: the copy
        rounds (`copied_k_counts`) at their own acceptance and cost ratio `copy_c`, the
        other rounds at the model drafts' acceptance and c.
        """
        c = _cost_ratio(c)
        runs = [(k, n) for k, n in enumerate(self.k_counts) if n]
        if not runs:
            return predicted_speedup(self.alpha, max(1, round(self.mean_k)), c)
        if copy_c is None:
            tokens = sum(n * expected_tokens_per_round(self.alpha, k) for k, n in runs)
            return tokens / sum(n * (k * c + 1) for k, n in runs)
        copy_c = _cost_ratio(copy_c)
        copies = {k: n for k, n in enumerate(self.copied_k_counts) if n}
        kinds = ((_rate(self.accepted_at, self.trials_at), c, {k: n - copies.get(k, 0) for k, n in runs}),
                 (_rate(self.copied_accepted_at, self.copied_trials_at), copy_c, copies))
        tokens = sum(n * expected_tokens_per_round(alpha, k) for alpha, _, counts in kinds
                     for k, n in counts.items())
        return tokens / sum(n * (k * cost + 1) for _, cost, counts in kinds for k, n in counts.items())

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready summary."""
        return {**dataclasses.asdict(self), "histogram": list(self.histogram),
                "k_counts": list(self.k_counts), "accepted_at": list(self.accepted_at),
                "trials_at": list(self.trials_at), "copied_accepted_at": list(self.copied_accepted_at),
                "copied_trials_at": list(self.copied_trials_at),
                "copied_k_counts": list(self.copied_k_counts), "acceptance_rate": self.acceptance_rate,
                "alpha": self.alpha, "mean_tokens_per_round": self.mean_tokens_per_round,
                "tokens_per_s": self.tokens_per_s, "mean_k": self.mean_k}


def _add_at(counts: tuple[int, ...], index: int, amount: int) -> tuple[int, ...]:
    grown = list(counts) + [0] * max(0, index + 1 - len(counts))
    grown[index] += amount
    return tuple(grown)


def _rate(accepted_at: tuple[int, ...], trials_at: tuple[int, ...]) -> float:
    """Accepted over trials, pooled over the lengths (0 without trials)."""
    trials = sum(trials_at)
    return sum(accepted_at) / trials if trials else 0.0


def tally(metrics: Metrics, *, k: int, accepted: list[int], emitted: list[int],
          active: list[bool], elapsed_s: float, drafted: list[int] | None = None,
          wanted: list[int] | None = None, copied: list[bool] | None = None,
          siblings: list[bool] | None = None) -> Metrics:
    """Add one round (per-row accepted and emitted counts) to `metrics`.

    `drafted` gives the drafts each row verified when rows differ (default: k each); a row
    that accepted all of its own drafts saw no rejection. `wanted` gives the length each
    row asked for, under which its acceptance is filed (`accepted_at`; default: `drafted`);
    `copied` says which rows proposed a copy (filed in `copied_accepted_at`; default: none);
    a round of K >= 1 in which every row that drafted copied counts in `copied_k_counts`.
    `siblings` says which rows' drafts were siblings (default: none): such a row counts one
    trial, accepted or not.
    """
    for name, flags in (("copied", copied), ("siblings", siblings)):
        if flags is not None and len(flags) != len(active):
            raise ValueError(f"{name}: expected {len(active)} flags (one per row), got {len(flags)}")
    histogram = metrics.histogram
    evidence = {False: (metrics.accepted_at, metrics.trials_at),
                True: (metrics.copied_accepted_at, metrics.copied_trials_at)}
    rows = [i for i, a in enumerate(active) if a]
    own = [k] * len(active) if drafted is None else drafted
    for i in rows if k >= 1 else []:
        histogram = _add_at(histogram, accepted[i], 1)
        if own[i] >= 1:
            asked = own[i] if wanted is None else max(wanted[i], own[i])
            kind = bool(copied[i]) if copied is not None else False
            accepted_at, trials_at = evidence[kind]
            sibling = siblings is not None and siblings[i]
            trials = 1 if sibling else accepted[i] + (accepted[i] < own[i])
            evidence[kind] = (_add_at(accepted_at, asked, accepted[i]), _add_at(trials_at, asked, trials))
    return dataclasses.replace(
        metrics,
        rounds=metrics.rounds + 1,
        row_rounds=metrics.row_rounds + len(rows),
        drafted=metrics.drafted + sum(own[i] for i in rows),
        accepted=metrics.accepted + sum(accepted[i] for i in rows),
        emitted=metrics.emitted + sum(emitted[i] for i in rows),
        histogram=histogram,
        full_rounds=metrics.full_rounds + sum(1 for i in rows if accepted[i] == own[i]),
        k_counts=_add_at(metrics.k_counts, k, 1),
        elapsed_s=metrics.elapsed_s + elapsed_s,
        accepted_at=evidence[False][0],
        trials_at=evidence[False][1],
        copied_accepted_at=evidence[True][0],
        copied_trials_at=evidence[True][1],
        copied_k_counts=(_add_at(metrics.copied_k_counts, k, 1)
                         if k >= 1 and copied is not None and all(copied[i] for i in rows if own[i] >= 1)
                         else metrics.copied_k_counts),
    )
