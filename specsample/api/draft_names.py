"""Drafter names: the syntax every backend shares on top of its own names, and the
structured form it parses into (`DraftSpec`).

"NAME@T" (a model draft that stops at confidence T), "hybrid" / "hybrid:NAME" (prompt lookup
where the context repeats, the model NAME elsewhere) and "auto" / "auto:NAME" (that hybrid
with its model's rounds rated by Thm 3.8 from costs measured here; see
`specsample.engine.scheduler`). In a config, the same as a table:

    [draft]
    kind = "auto"        # "auto", "hybrid", or absent: the model alone
    model = "head"       # the backend's own drafter name
    threshold = 0.4      # optional: stop each row at this confidence
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specsample.core.metrics import Costs
from specsample.core.protocols import Drafter, FeatureDrafter
from specsample.drafters.hybrid import FeatureHybridDrafter, HybridDrafter
from specsample.drafters.model import ModelDrafter
from specsample.engine import scheduler

__all__ = ["KINDS", "DraftSpec", "compose_drafter", "split_name"]

KINDS = ("hybrid", "auto")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftSpec:
    """A drafter as a structure: what `name` spells as "KIND:MODEL@THRESHOLD".

    Attributes:
        kind: None (the model alone), "hybrid" or "auto".
        model: the backend's own drafter name (e.g. "head", "int8", "lookup"), or None for a
            bare kind (the backend's default model).
        threshold: None, or a confidence in (0, 1) at which a model draft stops each row.
    """

    kind: str | None = None
    model: str | None = None
    threshold: float | None = None

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"draft.kind: expected one of {', '.join(KINDS)} or none, got {self.kind!r}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ValueError(f"draft.model: expected a non-empty drafter name, got {self.model!r}")
        if self.kind is None and self.model is None:
            raise ValueError("draft.model: expected a drafter name where no kind is given, got none")
        if self.threshold is not None and (isinstance(self.threshold, bool) or
                                           not isinstance(self.threshold, (int, float)) or
                                           not 0 < self.threshold < 1):
            raise ValueError(f"draft.threshold: expected a number in (0, 1), got {self.threshold!r}")

    @classmethod
    def parse(cls, name: str) -> DraftSpec:
        """The spec that `name` ("auto", "hybrid:int8@0.4", "head", ...) spells."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"draft: expected a name (str), got {name!r}")
        base, threshold = _threshold(name)
        kind = next((k for k in KINDS if base == k or base.startswith(f"{k}:")), None)
        model = None if base == kind else base.removeprefix(f"{kind}:") if kind else base
        return cls(kind=kind, model=model, threshold=threshold)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DraftSpec:
        """From a mapping (a TOML table) with keys kind, model, threshold."""
        unknown = sorted(set(values) - {"kind", "model", "threshold"})
        if unknown:
            raise ValueError(f"draft: unknown keys {unknown}; known: ['kind', 'model', 'threshold']")
        return cls(**dict(values))

    @property
    def name(self) -> str:
        """The string form, which every backend's `load_drafter` takes."""
        base = ":".join(part for part in (self.kind, self.model) if part is not None)
        return base if self.threshold is None else f"{base}@{self.threshold:g}"


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
    spec = DraftSpec.parse(name)
    return spec.kind, spec.model or default_model, spec.threshold


def compose_drafter(name: str, load: Callable[[str], Drafter], *, default_model: str,
                    cost: Callable[[ModelDrafter], float] | None = None,
                    width_cost: Callable[[int, int], float] | None = None,
                    candidates: Sequence[str] = ()) -> Drafter:
    """A backend's drafter by name, with the shared syntax on top of its own names.

    "NAME@T": the model drafter NAME stopping each row at confidence T (see `ModelDrafter`);
    "hybrid" (the model `default_model`) or "hybrid:NAME": prompt lookup where the context
    repeats, NAME elsewhere; "hybrid@T" / "hybrid:NAME@T" combine both; "auto" or
    "auto:NAME": the hybrid whose model drafts only where Thm 3.8 predicts it faster than
    plain steps, with c measured by `cost` and, given `width_cost`, rounds narrowed to the
    width that pays (`specsample.engine.scheduler.auto`). A bare "auto" with `candidates`
    (model names) takes the one `specsample.engine.scheduler.choose` rates fastest here
    instead of `default_model`. Other names go to `load` unchanged.
    """
    kind, inner, threshold = split_name(name, default_model=default_model)
    if name == "auto" and candidates:
        if cost is None:
            raise ValueError(f"draft: {name!r} needs a backend that measures the draft's cost")
        return scheduler.choose(candidates, load, cost=cost, width_cost=width_cost)
    drafter = load(inner)
    if threshold is None and kind is None:
        return drafter
    if not isinstance(drafter, ModelDrafter):
        raise ValueError(f"draft: {name!r} needs a model draft for {inner!r}, got a "
                         f"{type(drafter).__name__}")
    if threshold is not None:
        drafter = type(drafter)(drafter.model, threshold=threshold)  # a head stays a head
    if kind == "auto":
        if cost is None:
            raise ValueError(f"draft: {name!r} needs a backend that measures the draft's cost")
        return scheduler.auto(drafter, Costs(c=cost(drafter), width=width_cost))
    hybrid = FeatureHybridDrafter if isinstance(drafter, FeatureDrafter) else HybridDrafter
    return hybrid(drafter) if kind else drafter
