"""Drafter names: the syntax every backend shares on top of its own names.

"NAME@T" (a model draft that stops at confidence T), "hybrid" / "hybrid:NAME" (prompt lookup
where the context repeats, the model NAME elsewhere) and "auto" / "auto:NAME" (that hybrid
with its model's rounds rated by Thm 3.8 from costs measured here), composed into the
drafters of `specsample.drafters.hybrid`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specsample.core.protocols import Drafter, FeatureDrafter
from specsample.drafters.hybrid import PRIOR_ALPHA, FeatureHybridDrafter, HybridDrafter, one_draft_width
from specsample.drafters.model import ModelDrafter
from specsample.engine.policy import fastest_fan_out

__all__ = ["HEAD_FAN_OUT", "HEAD_FAN_OUT_MAX", "choose_model", "compose_drafter", "rated_fan_out",
           "split_name"]

# How many candidates `auto` tries a round where a feature head drafts, for a head whose card
# gives no held-out fan-out hit rates (or where the verify's cost is not measured); with
# both, `specsample.engine.policy.fastest_fan_out` chooses, up to `HEAD_FAN_OUT_MAX`: the width cost
# counts the target forward only, and past 4 candidates the tree verify's own work per
# candidate made rounds slower than that cost predicts (README, "Draft trees from a head").
HEAD_FAN_OUT = 3
HEAD_FAN_OUT_MAX = 4


def _threshold(name: str) -> tuple[str, float | None]:
    base, at, tail = name.rpartition("@")
    if not at:
        return name, None
    try:
        value = float(tail)
    except ValueError:
        raise ValueError(f"draft: expected NAME@THRESHOLD with a number after '@', got {name!r}") from None
    if not 0 < value < 1:
        raise ValueError(f"threshold: expected a number in (0, 1) after '@' in {name!r}, got {tail}")
    return base, value


def split_name(name: str, *, default_model: str) -> tuple[str | None, str, float | None]:
    """(kind, inner, threshold) of a drafter name in the shared syntax: kind is "hybrid",
    "auto" or None; inner the backend's own name (`default_model` for a bare kind);
    threshold the number after '@' or None. E.g. "hybrid:early-exit:10@0.4" gives
    ("hybrid", "early-exit:10", 0.4)."""
    if not isinstance(name, str):
        raise TypeError(f"draft: expected a name (str), got {type(name).__name__}")
    base, threshold = _threshold(name)
    kind = next((k for k in ("hybrid", "auto") if base == k or base.startswith(f"{k}:")), None)
    inner = default_model if base == kind else base.removeprefix(f"{kind}:") if kind else base
    return kind, inner, threshold


def compose_drafter(name: str, load: Callable[[str], Drafter], *, default_model: str,
                    cost: Callable[[ModelDrafter], float] | None = None,
                    width_cost: Callable[[int, int], float] | None = None,
                    candidates: Sequence[str] = ()) -> Drafter:
    """A backend's drafter by name, with the shared syntax on top of its own names.

    "NAME@T": the model drafter NAME stopping each row at confidence T (see `ModelDrafter`);
    "hybrid" (the model `default_model`) or "hybrid:NAME": prompt lookup where the context
    repeats, NAME elsewhere; "hybrid@T" / "hybrid:NAME@T" combine both; "auto" or
    "auto:NAME": the hybrid whose model drafts only where Thm 3.8 predicts them faster
    than plain steps, with c measured by `cost`, and, given `width_cost`, rounds of a batch
    narrowed where their width costs more than it gains (see `HybridDrafter`), starting
    from the model's own prior acceptance (`prior_alpha`, else `PRIOR_ALPHA`); a feature
    head there fans out (its m likeliest tokens as siblings, one step a round, m as
    `_fan_out` chooses). A bare
    "auto" with `candidates` (model names) takes the one `choose_model` predicts fastest
    here instead of `default_model`. Other names go to `load` unchanged.
    """
    kind, inner, threshold = split_name(name, default_model=default_model)
    if name == "auto" and candidates:
        if cost is None:
            raise ValueError(f"draft: {name!r} needs a backend that measures the draft's cost")
        return choose_model(candidates, load, cost=cost, width_cost=width_cost)
    drafter = load(inner)
    if threshold is None and kind is None:
        return drafter
    if not isinstance(drafter, ModelDrafter):
        raise ValueError(f"draft: {name!r} needs a model draft for {inner!r}, got a "
                         f"{type(drafter).__name__}")
    if threshold is not None:
        drafter = type(drafter)(drafter.model, threshold=threshold)  # a head stays a head
    hybrid = FeatureHybridDrafter if isinstance(drafter, FeatureDrafter) else HybridDrafter
    if kind == "auto":
        if cost is None:
            raise ValueError(f"draft: {name!r} needs a backend that measures the draft's cost")
        c = cost(drafter)
        fan_out = _fan_out(drafter, c, width_cost)
        return hybrid(drafter, cost_ratio=c, width_cost=width_cost,
                      prior_alpha=_prior(drafter, fan_out), fan_out=fan_out)
    return hybrid(drafter) if kind else drafter


def _fan_out(drafter: Drafter, c: float, width_cost: Callable[[int, int], float] | None) -> int:
    """`auto`'s fan-out for a model draft: a chain (0) unless it is a feature head (a cheap
    step, a low top-1 acceptance); for a head whose card gives its held-out fan-out hit
    rates (`fan_out_hits`) and with the verify's cost measured, the m <= `HEAD_FAN_OUT_MAX`
    that `fastest_fan_out` rates fastest here; else `HEAD_FAN_OUT`."""
    if not isinstance(drafter, FeatureDrafter):
        return 0
    hits = getattr(drafter, "fan_out_hits", None)
    if hits is None or width_cost is None:
        return HEAD_FAN_OUT
    return rated_fan_out(hits, c, width_cost)[0]


def rated_fan_out(hits: Sequence[float], c: float, width_cost: Callable[[int, int], float]
                  ) -> tuple[int, tuple[float, ...]]:
    """A head's fan-out at batch 1: `fastest_fan_out` over its hit rates of at most
    `HEAD_FAN_OUT_MAX` candidates, with `width_cost` (batch, width) as the backend measures it."""
    return fastest_fan_out(hits[:HEAD_FAN_OUT_MAX], c, lambda positions: width_cost(1, positions))


def _prior(drafter: Drafter, fan_out: int = 0) -> float:
    """The acceptance a model draft states for itself, for rounds of that fan-out: a fan-out
    of m whose hit rates the drafter gives (`fan_out_hits`) starts from hits[m - 1] (its
    evidence is one trial a round, a hit or not); otherwise `prior_alpha` (e.g. a head's
    held-out alpha from its card), else `PRIOR_ALPHA`."""
    hits = getattr(drafter, "fan_out_hits", None)
    if fan_out and hits is not None and fan_out <= len(hits):
        return float(hits[fan_out - 1])
    return float(getattr(drafter, "prior_alpha", PRIOR_ALPHA))


def choose_model(candidates: Sequence[str], load: Callable[[str], Drafter], *,
                 cost: Callable[[ModelDrafter], float],
                 width_cost: Callable[[int, int], float] | None = None) -> HybridDrafter:
    """`auto`'s model: of the `candidates` that load for this target, the one whose one-draft
    round Thm 3.8 rates fastest here: (1 + alpha) / (c + cost(w positions)), w the positions of
    its one-step round (2, or 1 + its fan-out m for a head: `_fan_out`), with c measured
    by `cost`, alpha the drafter's prior for that round (`_prior`) and the verify's cost
    from `width_cost` (else 1). A candidate that does not load (FileNotFoundError or
    ValueError: e.g. no head trained for this target) is left out, and said so.

    Returns:
        The `auto` hybrid over that model, its prior the model's; `choice` says why.
    """
    if isinstance(candidates, str) or not candidates:
        raise ValueError(f"candidates: expected a non-empty sequence of model names, got {candidates!r}")
    rated, skipped = [], []
    for name in candidates:
        try:
            drafter = load(name)
        except (FileNotFoundError, ValueError) as err:
            skipped.append(f"{name} ({err})")
            continue
        if not isinstance(drafter, ModelDrafter):
            raise ValueError(f"candidates: {name!r} is not a model draft ({type(drafter).__name__})")
        c = float(cost(drafter))
        fan_out = _fan_out(drafter, c, width_cost)
        alpha = _prior(drafter, fan_out)
        wide = 1.0 if width_cost is None else float(width_cost(1, one_draft_width(fan_out)))
        rated.append(((1 + alpha) / (c + wide), name, drafter, c, alpha, fan_out))
    if not rated:
        raise ValueError(f"candidates: none loads for this target: {'; '.join(skipped)}")
    rated.sort(key=lambda r: -r[0])
    _, name, drafter, c, alpha, fan_out = rated[0]
    hybrid = FeatureHybridDrafter if isinstance(drafter, FeatureDrafter) else HybridDrafter
    chosen = hybrid(drafter, cost_ratio=c, width_cost=width_cost, prior_alpha=alpha, fan_out=fan_out)
    chosen.choice = ("model " + ", ".join(
        f"{n}: c = {cc:.2f}, {f'a fan-out of {m}, prior hit rate' if m else 'prior alpha'} {a:.2f}, "
        f"a one-draft round at {r:.2f} plain steps' tokens per cost"
        for r, n, _, cc, a, m in rated) + f"; chose {name}" +
        (f" (left out: {'; '.join(skipped)})" if skipped else ""))
    return chosen
