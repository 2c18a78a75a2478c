"""K policies: a constant K, and one adapted to the measured acceptance."""

from __future__ import annotations

import dataclasses

import pytest

from specsample.core.metrics import Metrics, predicted_speedup, tally
from specsample.engine.policy import AdaptiveK, ConstantK, KPolicy, k_policy


def _rounds(k: int, accepted: list[int]) -> Metrics:
    metrics = Metrics()
    for n in accepted:
        metrics = tally(metrics, k=k, accepted=[n], emitted=[n + 1], active=[True], elapsed_s=0.0)
    return metrics


def test_constant_k() -> None:
    policy = ConstantK(k=3)
    assert isinstance(policy, KPolicy)
    assert policy.k_max == 3
    assert policy.next_k(Metrics()) == 3
    assert policy.next_k(_rounds(3, [0] * 50)) == 3
    assert ConstantK().k == 4


@pytest.mark.parametrize("k", [0, -1, 2.0, True, "4", None])
def test_constant_k_rejects_bad_k(k: object) -> None:
    with pytest.raises((TypeError, ValueError), match=r"k: expected an int") as info:
        ConstantK(k=k)  # type: ignore[arg-type]
    assert repr(k) in str(info.value)


def test_policies_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ConstantK(k=2).k = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        AdaptiveK().c = 1.0  # type: ignore[misc]


def test_adaptive_k_high_acceptance_picks_the_largest_k() -> None:
    policy = AdaptiveK()
    assert isinstance(policy, KPolicy)
    assert policy.k_max == 8
    assert policy.next_k(_rounds(8, [8] * 100)) == 8


def test_adaptive_k_low_acceptance_picks_k_one() -> None:
    assert AdaptiveK().next_k(_rounds(4, [0] * 100)) == 1


def test_adaptive_k_without_data_uses_the_prior() -> None:
    policy = AdaptiveK()
    assert policy.alpha(Metrics()) == pytest.approx(policy.prior_alpha)
    best = max(policy.choices, key=lambda k: predicted_speedup(policy.prior_alpha, k, policy.c))
    assert policy.next_k(Metrics()) == best


def test_adaptive_k_grows_with_acceptance() -> None:
    policy = AdaptiveK()
    chosen = [policy.next_k(_rounds(4, [n] * 40)) for n in range(5)]
    assert chosen == sorted(chosen)
    assert chosen[0] == 1
    assert chosen[-1] == 8


def test_adaptive_k_alpha_is_smoothed_mle() -> None:
    policy = AdaptiveK(prior_alpha=0.5, prior_weight=2.0)
    metrics = _rounds(3, [3, 1, 0, 2])  # 6 acceptances, 3 rejections
    assert policy.alpha(metrics) == pytest.approx((6 + 1) / (9 + 2))
    assert AdaptiveK(prior_weight=0.0).alpha(metrics) == pytest.approx(6 / 9)


def test_adaptive_k_only_returns_choices() -> None:
    policy = AdaptiveK(choices=(2, 5))
    assert policy.k_max == 5
    assert policy.next_k(_rounds(5, [5] * 100)) == 5
    assert policy.next_k(_rounds(5, [0] * 100)) == 2


def test_adaptive_k_expensive_draft_picks_k_one() -> None:
    # With c = 1 a draft token costs a target forward: drafting more never pays.
    assert AdaptiveK(c=1.0).next_k(_rounds(8, [8] * 100)) == 1


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"choices": ()}, "choices"), ({"choices": (0, 2)}, "choices"), ({"choices": (True,)}, "choices"),
    ({"choices": (1.5,)}, "choices"), ({"c": -0.1}, "c: expected"), ({"prior_alpha": 1.0}, "prior_alpha"),
    ({"prior_alpha": -0.1}, "prior_alpha"), ({"prior_weight": -1.0}, "prior_weight"),
])
def test_adaptive_k_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AdaptiveK(**kwargs)  # type: ignore[arg-type]


def test_k_policy_parses_int_and_adaptive() -> None:
    assert k_policy(5) == ConstantK(k=5)
    policy = k_policy("adaptive", c=0.3)
    assert isinstance(policy, AdaptiveK)
    assert policy.c == 0.3
    assert k_policy("adaptive") == AdaptiveK()


@pytest.mark.parametrize("k", ["4", "Adaptive", 2.0, True, None, 0, -3])
def test_k_policy_errors(k: object) -> None:
    with pytest.raises(ValueError, match=r"k: expected an int >= 1") as info:
        k_policy(k)  # type: ignore[arg-type]
    assert repr(k) in str(info.value)
