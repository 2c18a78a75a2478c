"""`auto`: which draft runs, in which shape, and how wide each round is.

Every decision comes from Thm 3.8 (Leviathan et al. 2023): a round that verifies K drafts
commits (1 - alpha^(K+1)) / (1 - alpha) tokens on average and costs K c + cost(K + 1)
plain steps, c the draft step's cost over a target forward and cost(w) a target forward
of w positions over one of one position, both measured on this machine (`Costs`). The
acceptance alpha starts from a prior (`Prior`) and follows the evidence: each row's own
record of the model's drafts (`HybridState.accepted`/`trials`) and each kind and length
of proposal's tally in the run's `Metrics` (`Metrics.alpha_at`).

The decisions, all here:

1. At load, which model drafts (`choose`): of the candidates, the one whose one-draft
   round rates fastest; a feature head drafts as a fan-out of its m likeliest tokens,
   m rated from its card's hit rates (`rated_fan_out`). `Choice` keeps the ratings and
   renders them as the table `specsample generate --explain` prints.
2. Per row and round, whether the row drafts from the model (`Scheduler.worth`, the gate
   `HybridDrafter` asks): only while its acceptance beats the break-even rate of a
   one-draft round; a row that copies (prompt lookup) needs no gate.
3. Per round, how wide (`Scheduler.width`): the width that `batch_width` predicts to end
   the call soonest, from the rows' tokens left, the acceptance of each kind and length,
   and the round's cost at that width (`Scheduler.round_cost`).

Also the K a model draft runs at alone (`rated_k`) and a head's shape (`head_shape`). The
ratings themselves (Thm 3.8 with the verify's cost counted) are `specsample.engine.ratings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from specsample._array import Array, check_int, namespace
from specsample.core.metrics import Costs, Metrics, predicted_speedup
from specsample.core.protocols import Drafter, FeatureDrafter
from specsample.drafters.hybrid import FeatureHybridDrafter, HybridDrafter
from specsample.drafters.model import ModelDrafter
from specsample.engine.ratings import batch_width, fastest_fan_out, fastest_k

__all__ = ["HEAD_FAN_OUT", "HEAD_FAN_OUT_MAX", "PRIOR", "RATED_K_MAX", "WIDTH_PRIOR", "Candidate", "Choice",
           "Prior", "Scheduler", "choose", "head_shape", "hits_of",
           "one_draft_width", "prior_of", "rated_fan_out", "rated_k"]


@dataclasses.dataclass(frozen=True)
class Prior:
    """An acceptance assumed before evidence, worth `weight` trials at rate `alpha`."""

    alpha: float
    weight: float

    def __post_init__(self) -> None:
        if not 0 <= self.alpha <= 1 or not 0 <= self.weight < 1e9:
            raise ValueError(f"prior: expected a rate in [0, 1] and a weight >= 0, got "
                             f"{self.alpha!r}, {self.weight!r}")


# A model draft's acceptance before a row has evidence, unless the drafter's rating states
# its own (a trained head's held-out acceptance from its card).
PRIOR = Prior(0.8, 8.0)
# The acceptance a round's width is rated at before the run has evidence on proposals of a
# kind and length: prompt lookup's pooled acceptance on the benchmark prompts is about one half.
WIDTH_PRIOR = Prior(0.5, 8.0)
# A feature head's fan-out where its card gives no hit rates or the verify's cost is not
# measured; with both, `fastest_fan_out` chooses, up to HEAD_FAN_OUT_MAX candidates (the
# width cost counts the target forward only, and past 4 candidates the tree verify's own
# work per candidate makes rounds slower than that cost predicts).
HEAD_FAN_OUT = 3
HEAD_FAN_OUT_MAX = 4
# The longest chain a model draft is rated for when none is given: a model's chain seldom
# holds past 8 drafts.
RATED_K_MAX = 8


def one_draft_width(fan_out: int) -> int:
    """Positions per row of a round where a row drafts from the model once: 2 for one chain
    draft, 1 + fan_out for a fan-out."""
    return 1 + max(1, fan_out)


class Scheduler:
    """`auto`'s rule for a hybrid drafter: the gate on each row's use of the model, and the
    cost of a round of each width (see the module docstring).

    Args:
        cost_ratio: c >= 0, the model draft's step over a target forward.
        prior: the model's acceptance before a row has evidence.
        width_cost: None, or (batch, width) -> a target forward of `width` positions per
            row over one of one position, at that batch size (measured by the backend).
            Given, rounds are narrowed to the width that pays (`width`), and a row drafts
            as soon as the narrowest round pays; without it, a row drafts while Thm 3.8
            rates K drafts above a plain step.
        fan_out: 0 (the model drafts a chain) or m >= 1 (its m likeliest next tokens as
            siblings, one draft step a round; a row's evidence is then one trial a round).
        hits: None, or a fan-out's held-out hit rates, hits[j - 1] with j candidates (a
            head's card): a round narrower than m rates a row's j < m siblings at its
            record scaled by hits[j - 1] / hits[m - 1]; without them, such a round counts
            none of its siblings.
        choice: how `choose` picked the model, if it did.
    """

    def __init__(self, *, cost_ratio: float, prior: Prior = PRIOR,
                 width_cost: Callable[[int, int], float] | None = None, fan_out: int = 0,
                 hits: Sequence[float] | None = None, choice: Choice | None = None) -> None:
        if isinstance(cost_ratio, bool) or not isinstance(cost_ratio, (int, float)) or \
                not 0 <= cost_ratio < 1e6:
            raise ValueError(f"cost_ratio: expected a finite number >= 0, got {cost_ratio!r}")
        if not isinstance(prior, Prior):
            raise TypeError(f"prior: expected a Prior, got {type(prior).__name__}")
        if width_cost is not None and not callable(width_cost):
            raise TypeError(f"width_cost: expected None or a function (batch, width) -> cost, got "
                            f"{type(width_cost).__name__}")
        self.cost_ratio, self.prior, self.width_cost = float(cost_ratio), prior, width_cost
        self.fan_out = check_int("fan_out", fan_out, 0)
        if hits is not None and (isinstance(hits, (str, bytes)) or not isinstance(hits, Sequence) or any(
                isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 < h <= 1 for h in hits)):
            raise ValueError(f"hits: expected None or hit rates in (0, 1], got {hits!r}")
        self.hits = None if hits is None else tuple(float(h) for h in hits)
        self.choice = choice

    def hybrid(self, model: ModelDrafter) -> HybridDrafter:
        """The `auto` drafter over `model`: prompt lookup where the context repeats, `model`
        elsewhere, gated and narrowed by this scheduler."""
        kind = FeatureHybridDrafter if isinstance(model, FeatureDrafter) else HybridDrafter
        return kind(model, scheduler=self)

    @property
    def narrows(self) -> bool:
        """Whether rounds are narrowed to the width that pays (the verify's cost is measured)."""
        return self.width_cost is not None

    def verify_width(self) -> int:
        """Positions per row of a round where a row drafts from the model once."""
        return one_draft_width(self.fan_out)

    def break_even(self) -> float:
        """With the verify's cost measured per width, the acceptance above which one model
        draft a round (a chain draft, or a fan-out: one step, `verify_width` positions) beats
        a plain step at batch 1: 1 + a > c + cost(verify_width positions). Rounds are then
        narrowed to the width that pays, so a row is worth drafting for as soon as the
        narrowest round pays: a row whose one draft does not pay has fewer tokens to gain
        per draft at any wider width than that draft costs."""
        assert self.width_cost is not None
        return self.cost_ratio + float(self.width_cost(1, self.verify_width())) - 1

    def worth(self, accepted: Array, trials: Array, k: int) -> Array:
        """bool [B]: rows whose model drafts are predicted to beat a plain step, from each
        row's record (`accepted` drafts out of `trials`, int64 [B]) and the prior."""
        xp = namespace(accepted)
        rate = (xp.astype(accepted, xp.float64) + self.prior.alpha * self.prior.weight) / (
            xp.astype(trials, xp.float64) + self.prior.weight)
        if self.width_cost is not None:
            return rate > self.break_even()
        if self.fan_out:  # one hit or none a round, for one draft step
            return rate > self.cost_ratio
        rate = xp.clip(rate, min=0.0, max=1.0 - 1e-12)
        tokens = (1 - rate ** (k + 1)) / (1 - rate)
        return tokens > k * self.cost_ratio + 1

    def never(self, k: int) -> bool:
        """Whether no row can ever draft from the model at K = k: the prior is below the
        break-even rate, and a row gains evidence only by drafting."""
        if k == 0:
            return False
        if self.width_cost is not None:
            return self.prior.alpha <= self.break_even()
        return predicted_speedup(self.prior.alpha, k, self.cost_ratio) <= 1

    def round_cost(self, batch: int, drafts: int, *, modelled: bool = True) -> float:
        """A round of `drafts` per row at `batch` rows, in plain steps: the wider verify, plus,
        when some row drafts from the model (`modelled`), the model's draft steps (each c)."""
        assert self.width_cost is not None
        steps = 1 if self.fan_out else drafts  # a fan-out is one draft step, whatever its width
        model = 0.0 if not modelled or self.never(drafts) else steps * self.cost_ratio
        return float(self.width_cost(batch, drafts + 1)) + model

    def width(self, wanted: Sequence[int], left: Sequence[int], copied: Sequence[bool] | None,
              batch: int, metrics: Metrics) -> int:
        """The drafts per row of a round whose active rows want `wanted` drafts (>= 0) and
        have `left` tokens before their stop, `copied` saying which propose a copy: the
        width `batch_width` predicts to end the call soonest, each row's drafts rated at the
        run's acceptance so far of proposals of its kind and length (prior `WIDTH_PRIOR`)."""
        rates = [metrics.alpha_at(n, WIDTH_PRIOR.alpha, WIDTH_PRIOR.weight, copied=bool(copied and copied[i]))
                 if n >= 1 else 0.0 for i, n in enumerate(wanted)]
        every_copy = copied is not None and all(copied[i] for i, n in enumerate(wanted) if n >= 1)
        # A fan-out's model rows propose siblings (copies are chains): at most one is accepted.
        siblings = [bool(self.fan_out) and n >= 1 and not (copied and copied[i])
                    for i, n in enumerate(wanted)]

        def cost(rows: int, drafts: int) -> float:
            return self.round_cost(rows, drafts, modelled=not every_copy)

        hits = self.hits
        narrowed = None if hits is None else lambda m, j: hits[j - 1] / hits[m - 1] if m <= len(hits) else 0.0
        return batch_width(list(wanted), list(left), batch, rates, cost, siblings=siblings, narrowed=narrowed)

    def describe(self, k: int) -> str:
        """What the auto drafter does at K = k, and why, in one paragraph."""
        c = self.cost_ratio
        if self.width_cost is not None:
            even, wide = self.break_even(), self.verify_width()
            start = "the draft model" if self.prior.alpha > even else "plain steps"
            drafts = (f"its {self.fan_out} most likely next tokens as sibling candidates, one draft "
                      f"step a round, for rows whose hit rate" if self.fan_out else
                      "the draft model only for rows whose acceptance of its drafts")
            told = (f"prompt lookup where the context repeats; elsewhere {drafts} exceeds c + "
                    f"cost({wide} positions) - 1 (c = {c:.2f}, cost {float(self.width_cost(1, wide)):.2f}: "
                    f"{even:.2f}), the rate at which that round beats a plain step (at the prior alpha "
                    f"{self.prior.alpha:.2f}, rows start with {start}, then follow their own acceptance); "
                    f"each round as wide as Thm 3.8 predicts fastest (a plain step where no width pays, "
                    f"K = {k} at most), from the verify's cost at each width measured on this machine "
                    f"and the acceptance so far of proposals of each kind and length")
        else:
            speedup = predicted_speedup(self.prior.alpha, k, c)
            start = "the draft model" if speedup > 1 else "plain steps"
            told = (f"prompt lookup where the context repeats; elsewhere the draft model only where "
                    f"Thm 3.8 predicts it faster than plain steps (c = {c:.2f}: at the prior alpha "
                    f"{self.prior.alpha:.2f} and K = {k} it predicts {speedup:.2f}x, so rows start "
                    f"with {start}, then follow their own acceptance)")
        return told if self.choice is None else f"{told}; {self.choice.sentence()}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Candidate:
    """One model draft as `choose` rated it.

    Attributes:
        name: the drafter's name.
        c: its measured cost ratio.
        fan_out: its fan-out (0: a chain).
        prior: the acceptance (a fan-out: hit rate) its one-draft round is rated at.
        widths: the verify's cost, in plain steps, at 2, 3, ... positions (measured; empty
            where the backend does not measure it).
        rate: its one-draft round's tokens per plain step's cost (a plain step rates 1).
    """

    name: str
    c: float
    fan_out: int
    prior: float
    widths: tuple[float, ...]
    rate: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    """How `choose` picked `auto`'s model: every candidate rated, the one chosen, and those
    that did not load (with why)."""

    candidates: tuple[Candidate, ...]
    chosen: str
    left_out: tuple[str, ...] = ()

    def sentence(self) -> str:
        """The ratings in one sentence."""
        rated = ", ".join(
            f"{r.name}: c = {r.c:.2f}, "
            f"{f'a fan-out of {r.fan_out}, prior hit rate' if r.fan_out else 'prior alpha'} "
            f"{r.prior:.2f}, a one-draft round at {r.rate:.2f} plain steps' tokens per cost"
            for r in self.candidates)
        skipped = f" (left out: {'; '.join(self.left_out)})" if self.left_out else ""
        return f"model {rated}; chose {self.chosen}{skipped}"

    def table(self) -> list[str]:
        """The ratings as a table of at most ~12 lines: one row per candidate (and one per
        candidate left out), then a plain step for reference."""
        spans = max((len(r.widths) for r in self.candidates), default=0)
        at = "/".join(str(w) for w in range(2, 2 + spans))
        verify = f"verify cost at {at} positions" if spans else "verify cost"
        head = ["candidate", "c", "shape", "prior", verify, "speed", "chosen"]
        rows = [[r.name, f"{r.c:.2f}", f"fan-out {r.fan_out}" if r.fan_out else "chain",
                 f"{r.prior:.2f}", " ".join(f"{w:.2f}" for w in r.widths) or "-", f"{r.rate:.2f}x",
                 "*" if r.name == self.chosen else ""] for r in self.candidates]
        rows.append(["plain step", "-", "-", "-", "1.00", "1.00x", ""])
        rows += [[skipped.split(" ")[0], "-", "-", "-", "-", "-", "left out"] for skipped in self.left_out]
        widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
        return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                for row in [head, *rows]]


def hits_of(drafter: Drafter) -> Sequence[float] | None:
    """The held-out fan-out hit rates a model draft's rating states (a head's card), else None."""
    return drafter.rating.fan_out_hits if isinstance(drafter, ModelDrafter) else None


def prior_of(drafter: Drafter, fan_out: int = 0) -> float:
    """The acceptance a model draft states for itself, for rounds of that fan-out: a fan-out
    of m whose hit rates its rating gives starts from hits[m - 1] (its evidence is one trial a
    round, a hit or not); otherwise its rating's prior alpha (e.g. a head's held-out alpha
    from its card), else `PRIOR`."""
    rating = drafter.rating if isinstance(drafter, ModelDrafter) else None
    hits = hits_of(drafter)
    if fan_out and hits is not None and fan_out <= len(hits):
        return float(hits[fan_out - 1])
    if rating is not None and rating.prior_alpha is not None:
        return float(rating.prior_alpha)
    return PRIOR.alpha


def fan_out_of(drafter: Drafter, c: float, width_cost: Callable[[int, int], float] | None) -> int:
    """`auto`'s fan-out for a model draft: a chain (0) unless it is a feature head (a cheap
    step, a low top-1 acceptance); for a head whose rating gives its held-out fan-out hit
    rates and with the verify's cost measured, the m <= `HEAD_FAN_OUT_MAX` that
    `fastest_fan_out` rates fastest here; else `HEAD_FAN_OUT`."""
    if not isinstance(drafter, FeatureDrafter):
        return 0
    hits = hits_of(drafter)
    if hits is None or width_cost is None:
        return HEAD_FAN_OUT
    return rated_fan_out(hits, c, width_cost)[0]


def rated_fan_out(hits: Sequence[float], c: float, width_cost: Callable[[int, int], float]
                  ) -> tuple[int, tuple[float, ...]]:
    """A head's fan-out at batch 1: `fastest_fan_out` over its hit rates of at most
    `HEAD_FAN_OUT_MAX` candidates, with `width_cost` (batch, width) as the backend measures it."""
    return fastest_fan_out(hits[:HEAD_FAN_OUT_MAX], c, lambda positions: width_cost(1, positions))


def auto(drafter: Drafter, costs: Costs) -> HybridDrafter:
    """`auto:NAME`: the auto hybrid over the model draft `drafter`, with its costs measured."""
    if not isinstance(drafter, ModelDrafter):
        raise ValueError(f"drafter: auto needs a model draft, got a {type(drafter).__name__}")
    fan_out = fan_out_of(drafter, costs.c, costs.width)
    return Scheduler(cost_ratio=costs.c, width_cost=costs.width, prior=Prior(prior_of(drafter, fan_out), 8.0),
                     fan_out=fan_out, hits=hits_of(drafter) if fan_out else None).hybrid(drafter)


def choose(candidates: Sequence[str], load: Callable[[str], Drafter], *,
           cost: Callable[[ModelDrafter], float],
           width_cost: Callable[[int, int], float] | None = None) -> HybridDrafter:
    """`auto`'s model: of the `candidates` that load for this target, the one whose one-draft
    round Thm 3.8 rates fastest here: (1 + alpha) / (c + cost(w positions)), w the positions
    of its one-step round (2, or 1 + its fan-out m for a head: `fan_out_of`), with c measured
    by `cost`, alpha the drafter's prior for that round (`prior_of`) and the verify's cost
    from `width_cost` (else 1). A candidate that does not load (FileNotFoundError or
    ValueError: e.g. no head trained for this target) is left out, and said so.

    Returns:
        The `auto` hybrid over that model, its prior the model's; its scheduler's `choice`
        holds the ratings.
    """
    if isinstance(candidates, str) or not candidates:
        raise ValueError(f"candidates: expected a non-empty sequence of model names, got {candidates!r}")
    rated, skipped, models = [], [], {}
    for name in candidates:
        try:
            drafter = load(name)
        except (FileNotFoundError, ValueError) as err:
            skipped.append(f"{name} ({err})")
            continue
        if not isinstance(drafter, ModelDrafter):
            raise ValueError(f"candidates: {name!r} is not a model draft ({type(drafter).__name__})")
        c = float(cost(drafter))
        fan_out = fan_out_of(drafter, c, width_cost)
        alpha = prior_of(drafter, fan_out)
        wide = 1.0 if width_cost is None else float(width_cost(1, one_draft_width(fan_out)))
        widths = () if width_cost is None else tuple(float(width_cost(1, w)) for w in range(2, 6))
        rated.append(Candidate(name=name, c=c, fan_out=fan_out, prior=alpha, widths=widths,
                               rate=(1 + alpha) / (c + wide)))
        models[name] = drafter
    if not rated:
        raise ValueError(f"candidates: none loads for this target: {'; '.join(skipped)}")
    rated.sort(key=lambda r: -r.rate)
    best = rated[0]
    choice = Choice(candidates=tuple(rated), chosen=best.name, left_out=tuple(skipped))
    scheduler = Scheduler(cost_ratio=best.c, width_cost=width_cost, prior=Prior(best.prior, 8.0),
                          fan_out=best.fan_out, choice=choice,
                          hits=hits_of(models[best.name]) if best.fan_out else None)
    return scheduler.hybrid(models[best.name])


def rated_k(drafter: Drafter, costs: Costs) -> tuple[int, str] | None:
    """The K to run a model drafter at when none is given, and why: for one that verifies all
    K every round (no confidence threshold), the K in [1, RATED_K_MAX] that Thm 3.8 rates
    fastest (`fastest_k`) from its c and the verify's cost at each width (`costs`), and its
    prior acceptance (`prior_of`). None for other drafters."""
    if not isinstance(drafter, ModelDrafter) or drafter.threshold is not None or costs.width is None:
        return None
    width, alpha = costs.width, prior_of(drafter)
    k, rates = fastest_k(alpha, costs.c, lambda positions: width(1, positions), RATED_K_MAX)
    rated = ", ".join(f"{r:.2f}" for r in rates)
    slower = "" if max(rates) >= 1 else (" (below 1: slower than plain decoding here; 'auto' takes "
                                         "plain steps where drafts do not pay)")
    return k, (f"K = {k} (none given): Thm 3.8 rates K = 1..{len(rates)} at {rated} plain steps' tokens "
               f"per cost{slower}, from c = {costs.c:.2f} and the verify's cost at each width measured "
               f"here and a prior alpha of {alpha:.2f}; --k sets it")


def head_shape(drafter: ModelDrafter, costs: Costs) -> tuple[int, str] | None:
    """A head's shape as Thm 3.8 rates it fastest here: None for its chain (at the best K,
    `fastest_k`, from its rating's held-out alpha), or (m, why) for a depth-1 fan-out of its m
    likeliest tokens (m by `rated_fan_out` from its rating's fan-out hit rates); `why` says
    both ratings. A head whose rating gives no fan-out hit rates, or costs without the
    verify's cost, drafts its chain (None, with no reason)."""
    hits = drafter.rating.fan_out_hits
    if hits is None or costs.width is None:
        return None
    width, alpha = costs.width, prior_of(drafter)
    k, chain = fastest_k(alpha, costs.c, lambda positions: width(1, positions), RATED_K_MAX)
    m, tree = rated_fan_out(hits, costs.c, width)
    why = (f"chain K = {k} at {max(chain):.2f} plain steps' tokens per cost (held-out alpha {alpha:.2f}), "
           f"fan-out of {m} at {max(tree):.2f} (held-out hit rate {hits[m - 1]:.2f}); c = {costs.c:.2f}")
    return (0 if max(tree) <= max(chain) else m), why
