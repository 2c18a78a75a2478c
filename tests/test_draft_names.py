"""Drafter names: the shared syntax (NAME@T, hybrid, auto) and how `auto` chooses its model
and a head's fan-out from measured costs."""

from __future__ import annotations

import dataclasses

import pytest
from specsample_backends.reference import random_ngram

from specsample.api.draft_names import DraftSpec, compose_drafter, split_name
from specsample.drafters.hybrid import HybridDrafter
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.drafters.model import DraftRating, ModelDrafter
from specsample.engine.scheduler import HEAD_FAN_OUT_MAX, PRIOR, Prior, Scheduler, rated_fan_out
from specsample.engine.scheduler import prior_of as _prior


def _gate(drafter: HybridDrafter) -> Scheduler:
    assert isinstance(drafter.scheduler, Scheduler)
    return drafter.scheduler


def _models():  # type: ignore[no-untyped-def]
    target = random_ngram(5, order=2, seed=4, concentration=0.6, zeros=0.2)
    return target, random_ngram(5, order=2, seed=5, concentration=0.6, zeros=0.2)


@pytest.mark.parametrize(("name", "want"), [
    ("lookup", (None, "lookup", None)),
    ("int8@0.4", (None, "int8", 0.4)),
    ("hybrid", ("hybrid", "head", None)),
    ("hybrid:early-exit:10@0.4", ("hybrid", "early-exit:10", 0.4)),
    ("auto", ("auto", "head", None)),
    ("auto:int8", ("auto", "int8", None)),
    ("hybrids", (None, "hybrids", None)),  # a name that only starts like a kind is the backend's
])
def test_split_name_gives_kind_inner_and_threshold(name: str, want: tuple[object, ...]) -> None:
    assert split_name(name, default_model="head") == want


@pytest.mark.parametrize(("name", "error", "match"), [
    (3, TypeError, "draft: expected a name \\(str\\), got int"),
    ("int8@high", ValueError, "draft: expected NAME@THRESHOLD with a number after '@', got 'int8@high'"),
    ("int8@1.5", ValueError, "threshold: expected a number in \\(0, 1\\) after '@' in 'int8@1.5', got 1.5"),
    ("int8@0", ValueError, "threshold: expected a number in \\(0, 1\\)"),
])
def test_bad_names_are_named(name: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        split_name(name, default_model="head")  # type: ignore[arg-type]


def test_a_plain_name_goes_to_the_backend_unchanged_and_a_kind_needs_a_model() -> None:
    target, _ = _models()
    lookup = PromptLookupDrafter()
    assert compose_drafter("lookup", lambda n: lookup, default_model="x") is lookup
    with pytest.raises(ValueError, match="draft: 'hybrid:lookup' needs a model draft for 'lookup'"):
        compose_drafter("hybrid:lookup", lambda n: lookup, default_model="x")
    stopped = compose_drafter("m@0.3", lambda n: ModelDrafter(target), default_model="m")
    assert isinstance(stopped, ModelDrafter) and stopped.threshold == 0.3
    hybrid = compose_drafter("hybrid@0.3", lambda n: ModelDrafter(target), default_model="m")
    assert isinstance(hybrid, HybridDrafter) and hybrid.model.threshold == 0.3


def test_a_heads_fan_out_is_rated_over_at_most_the_largest_fan_out() -> None:
    # Hit rates past HEAD_FAN_OUT_MAX are not considered, however high; with a flat verify
    # cost the widest considered fan-out wins, with a steep one a narrower one.
    hits = (0.3, 0.45, 0.55, 0.6, 0.99, 0.99)
    flat, rates = rated_fan_out(hits, 0.1, lambda batch, width: 1.0)
    assert flat == HEAD_FAN_OUT_MAX and len(rates) == HEAD_FAN_OUT_MAX
    steep, _ = rated_fan_out(hits, 0.1, lambda batch, width: 1 + 0.2 * (width - 1))
    assert steep < HEAD_FAN_OUT_MAX


def test_a_drafters_prior_is_its_fan_out_hit_rate_else_its_alpha_else_the_default() -> None:
    target, _ = _models()
    drafter = ModelDrafter(target)
    assert _prior(drafter) == PRIOR.alpha
    drafter = ModelDrafter(target, rating=DraftRating(prior_alpha=0.25))
    assert _prior(drafter) == 0.25 and _prior(drafter, 2) == 0.25
    drafter = ModelDrafter(target, rating=DraftRating(prior_alpha=0.25, fan_out_hits=(0.3, 0.5)))
    assert _prior(drafter, 2) == 0.5 and _prior(drafter, 3) == 0.25 and _prior(drafter) == 0.25


def test_bare_auto_chooses_the_model_whose_one_draft_round_rates_fastest() -> None:
    """(1 + prior alpha) / (c + cost(2 positions)) per candidate: a cheap draft with a low
    prior beats a dear one with a high prior, and loses once it costs more; a candidate that
    does not load is left out and said so; the chosen prior is the model's."""
    target, draft = _models()
    cheap, dear = ModelDrafter(draft, rating=DraftRating(prior_alpha=0.3)), ModelDrafter(target)

    def load(name: str) -> ModelDrafter:
        if name == "missing":
            raise FileNotFoundError("no such head")
        return {"cheap": cheap, "dear": dear}[name]

    def pick(costs: dict[str, float]) -> HybridDrafter:
        return compose_drafter("auto", load, default_model="dear", candidates=("missing", "cheap", "dear"),
                               cost=lambda d: costs["cheap" if d is cheap else "dear"],
                               width_cost=lambda batch, width: 1.05)

    chosen = pick({"cheap": 0.1, "dear": 0.8})  # 1.3 / 1.15 = 1.13 against 1.8 / 1.85 = 0.97
    assert chosen.model is cheap and _gate(chosen).prior == Prior(0.3, 8.0)
    assert _gate(chosen).cost_ratio == 0.1
    assert "chose cheap" in chosen.describe(4) and "left out: missing (no such head)" in chosen.describe(4)
    # Negative control: the same cheap draft at c = 0.5 (1.3 / 1.55 = 0.84) loses.
    chosen = pick({"cheap": 0.5, "dear": 0.8})
    assert chosen.model is dear and _gate(chosen).prior == PRIOR and "chose dear" in chosen.describe(4)
    # "auto:NAME" and "auto@T" keep their model.
    named = compose_drafter("auto:cheap", load, default_model="dear", candidates=("dear",),
                            cost=lambda d: 0.1)
    assert isinstance(named, HybridDrafter) and named.model is cheap and _gate(named).choice is None
    assert _gate(named).prior == Prior(0.3, 8.0)  # the drafter's own prior, as when `auto` chooses it
    assert _gate(compose_drafter("auto:dear", load, default_model="dear", cost=lambda d: 0.1)).prior == PRIOR
    with pytest.raises(ValueError, match="candidates: none loads for this target: missing"):
        compose_drafter("auto", load, default_model="dear", candidates=("missing",), cost=lambda d: 0.1)


@pytest.mark.parametrize(("name", "spec"), [
    ("lookup", DraftSpec(model="lookup")),
    ("auto", DraftSpec(kind="auto")),
    ("hybrid:int8@0.4", DraftSpec(kind="hybrid", model="int8", threshold=0.4)),
    ("auto:early-exit:10", DraftSpec(kind="auto", model="early-exit:10")),
])
def test_a_name_parses_into_its_spec_and_back(name: str, spec: DraftSpec) -> None:
    assert DraftSpec.parse(name) == spec and spec.name == name
    assert DraftSpec.from_dict(dataclasses.asdict(spec)) == spec


@pytest.mark.parametrize(("values", "match"), [
    ({"kind": "fast"}, "draft.kind: expected one of hybrid, auto or none, got 'fast'"),
    ({}, "draft.model: expected a drafter name where no kind is given"),
    ({"model": "head", "threshold": 1.5}, r"draft.threshold: expected a number in \(0, 1\), got 1.5"),
    ({"model": ""}, "draft.model: expected a non-empty drafter name"),
    ({"model": "head", "depth": 3}, r"draft: unknown keys \['depth'\]"),
])
def test_a_bad_spec_is_a_clear_error(values: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DraftSpec.from_dict(values)
