"""Metrics: Leviathan et al.'s Eq. 1 and Thm 3.8, tallies, the alpha MLE."""

from __future__ import annotations

import json
import math

import pytest

from specsample.bench.stats import merge_metrics
from specsample.core.metrics import Metrics, expected_tokens_per_round, predicted_speedup, tally


@pytest.mark.parametrize(("alpha", "k", "expected"), [
    (0.5, 1, 1.5), (0.5, 3, 1.875), (0.8, 4, (1 - 0.8**5) / 0.2), (0.0, 5, 1.0), (0.9, 2, 2.71),
    (0.6, 8, (1 - 0.6**9) / 0.4),
])
def test_expected_tokens_per_round_eq1(alpha: float, k: int, expected: float) -> None:
    assert expected_tokens_per_round(alpha, k) == pytest.approx(expected, rel=1e-12)
    # Eq. 1 is the geometric sum 1 + alpha + ... + alpha^K
    geometric = sum(alpha**j for j in range(k + 1))
    assert expected_tokens_per_round(alpha, k) == pytest.approx(geometric, rel=1e-12)


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_alpha_one_gives_k_plus_one(k: int) -> None:
    assert expected_tokens_per_round(1.0, k) == k + 1
    assert expected_tokens_per_round(1, k) == k + 1
    assert expected_tokens_per_round(1 - 1e-12, k) == pytest.approx(k + 1, rel=1e-6)


def test_expected_tokens_increase_with_alpha_and_k() -> None:
    values = [expected_tokens_per_round(a / 10, 4) for a in range(11)]
    assert values == sorted(values) and values[0] == 1.0 and values[-1] == 5.0
    by_k = [expected_tokens_per_round(0.7, k) for k in range(1, 8)]
    assert by_k == sorted(by_k)


@pytest.mark.parametrize(("alpha", "k", "c"), [(0.8, 4, 0.1), (0.5, 1, 0.0), (0.9, 6, 0.05), (1.0, 3, 0.2)])
def test_predicted_speedup_thm_3_8(alpha: float, k: int, c: float) -> None:
    expected = (k + 1) / (k * c + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
    assert predicted_speedup(alpha, k, c) == pytest.approx(expected, rel=1e-12)


def test_predicted_speedup_example() -> None:
    # alpha = 0.8, K = 4, c = 0.1: (1 - 0.32768) / (0.2 * 1.4)
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx(0.67232 / 0.28, rel=1e-12)


@pytest.mark.parametrize(("alpha", "k", "match"), [
    (-0.1, 3, "alpha"), (1.1, 3, "alpha"), (math.nan, 3, "alpha"),
    (0.5, -1, "k"), (0.5, 2.0, "k"), (0.5, True, "k"),
])
def test_bad_alpha_or_k(alpha: float, k: int, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=f"^{match}: expected") as info:
        expected_tokens_per_round(alpha, k)
    assert str(alpha if match == "alpha" else k) in str(info.value)
    with pytest.raises((TypeError, ValueError), match=f"^{match}: expected"):
        predicted_speedup(alpha, k, 0.1)


@pytest.mark.parametrize("c", [-0.1, math.nan, math.inf])
def test_bad_cost_ratio(c: float) -> None:
    with pytest.raises(ValueError, match=r"c: expected a finite cost ratio >= 0") as info:
        predicted_speedup(0.5, 2, c)
    assert str(c) in str(info.value)


def test_empty_metrics_rates_are_zero() -> None:
    metrics = Metrics()
    assert metrics.acceptance_rate == 0.0
    assert metrics.alpha == 0.0
    assert metrics.mean_tokens_per_round == 0.0
    assert metrics.tokens_per_s == 0.0
    assert metrics.mean_k == 0.0


def test_tally_one_round_counts_active_rows_only() -> None:
    metrics = tally(Metrics(), k=3, accepted=[3, 1, 99], emitted=[4, 2, 99], active=[True, True, False],
                    elapsed_s=0.5)
    assert metrics.rounds == 1
    assert metrics.row_rounds == 2
    assert metrics.drafted == 6
    assert metrics.accepted == 4
    assert metrics.emitted == 6
    assert metrics.histogram == (0, 1, 0, 1)
    assert metrics.full_rounds == 1
    assert metrics.k_counts == (0, 0, 0, 1)
    assert metrics.elapsed_s == 0.5


def test_tally_accumulates_and_is_a_new_value() -> None:
    first = tally(Metrics(), k=3, accepted=[3, 1], emitted=[4, 2], active=[True, True], elapsed_s=0.5)
    second = tally(first, k=1, accepted=[0, 1], emitted=[1, 2], active=[True, True], elapsed_s=0.25)
    assert first.rounds == 1 and first.histogram == (0, 1, 0, 1)  # unchanged
    assert second.rounds == 2
    assert second.row_rounds == 4
    assert second.drafted == 3 * 2 + 1 * 2
    assert second.accepted == 5
    assert second.emitted == 9
    assert second.histogram == (1, 2, 0, 1)
    assert second.full_rounds == 2  # row 0 in round 1 (3 of 3) and row 1 in round 2 (1 of 1)
    assert second.k_counts == (0, 1, 0, 1)
    assert second.elapsed_s == pytest.approx(0.75)
    assert second.acceptance_rate == pytest.approx(5 / 8)
    assert second.mean_tokens_per_round == pytest.approx(9 / 4)
    assert second.tokens_per_s == pytest.approx(9 / 0.75)
    assert second.mean_k == pytest.approx(2.0)


def test_alpha_is_the_truncated_geometric_mle() -> None:
    # One row, K = 3, accepted lengths 3, 1, 0, 2: 6 acceptances, 3 rejections (the full round has none).
    metrics = Metrics()
    for n in (3, 1, 0, 2):
        metrics = tally(metrics, k=3, accepted=[n], emitted=[n + 1], active=[True], elapsed_s=0.0)
    assert metrics.alpha == pytest.approx(6 / 9)
    assert metrics.acceptance_rate == pytest.approx(6 / 12)

    def log_likelihood(a: float) -> float:
        # P(N = n) = a^n (1 - a) for n < K, a^K for n = K
        return sum(n * math.log(a) + (math.log(1 - a) if n < 3 else 0.0) for n in (3, 1, 0, 2))

    grid = [i / 1000 for i in range(1, 1000)]
    assert max(grid, key=log_likelihood) == pytest.approx(metrics.alpha, abs=1e-3)


def test_alpha_all_accepted_is_one() -> None:
    metrics = tally(Metrics(), k=4, accepted=[4, 4], emitted=[5, 5], active=[True, True], elapsed_s=0.0)
    assert metrics.alpha == 1.0
    assert metrics.predicted_speedup(0.0) == pytest.approx(5.0)


def test_metrics_predicted_speedup_uses_alpha_and_mean_k() -> None:
    metrics = Metrics()
    for n in (3, 1, 0, 2):
        metrics = tally(metrics, k=3, accepted=[n], emitted=[n + 1], active=[True], elapsed_s=0.0)
    assert metrics.predicted_speedup(0.1) == pytest.approx(predicted_speedup(6 / 9, 3, 0.1))


def test_predicted_speedup_sums_rounds_of_each_k() -> None:
    # 2 rounds at K=1 and 1 at K=4: expected tokens and costs add up round by round.
    metrics = Metrics()
    for k, n in ((1, 1), (1, 0), (4, 2)):
        metrics = tally(metrics, k=k, accepted=[n], emitted=[n + 1], active=[True], elapsed_s=0.0)
    alpha, c = metrics.alpha, 0.2
    tokens = 2 * expected_tokens_per_round(alpha, 1) + expected_tokens_per_round(alpha, 4)
    assert alpha == pytest.approx(3 / 5)
    assert metrics.predicted_speedup(c) == pytest.approx(tokens / (2 * (1 * c + 1) + (4 * c + 1)))
    with pytest.raises(ValueError, match="c: expected a finite cost ratio >= 0, got -1"):
        metrics.predicted_speedup(-1)


def test_plain_steps_count_one_token_for_one_forward() -> None:
    # K = 0 rounds (a drafter with nothing to propose): no drafts, no histogram entry, alpha
    # from the drafted rounds only, and one token per target forward in the prediction.
    assert expected_tokens_per_round(0.7, 0) == 1.0 and predicted_speedup(0.7, 0, 0.3) == 1.0
    metrics = tally(Metrics(), k=3, accepted=[2], emitted=[3], active=[True], elapsed_s=0.0)
    alone = metrics
    for _ in range(3):
        metrics = tally(metrics, k=0, accepted=[0], emitted=[1], active=[True], elapsed_s=0.0)
    assert metrics.k_counts == (3, 0, 0, 1) and metrics.histogram == alone.histogram
    assert metrics.drafted == 3 and metrics.alpha == alone.alpha == pytest.approx(2 / 3)
    assert metrics.mean_tokens_per_round == pytest.approx(6 / 4)
    c = 0.1
    assert metrics.predicted_speedup(c) == pytest.approx(
        (expected_tokens_per_round(2 / 3, 3) + 3) / ((3 * c + 1) + 3))


def test_as_dict_is_json_serialisable() -> None:
    metrics = tally(Metrics(), k=2, accepted=[2, 0], emitted=[3, 1], active=[True, True], elapsed_s=0.1)
    summary = metrics.as_dict()
    decoded = json.loads(json.dumps(summary))
    assert decoded["histogram"] == [1, 0, 1]
    assert decoded["k_counts"] == [0, 0, 1]
    assert decoded["accepted"] == 2
    assert decoded["alpha"] == pytest.approx(metrics.alpha)
    assert decoded["acceptance_rate"] == pytest.approx(0.5)
    assert decoded["mean_tokens_per_round"] == pytest.approx(2.0)
    assert decoded["tokens_per_s"] == pytest.approx(40.0)
    assert decoded["mean_k"] == pytest.approx(2.0)


def test_tally_counts_each_rows_own_draft_length() -> None:
    """A row that verified 2 drafts and accepted both saw no rejection, in a round with K = 4;
    a row with no drafts (a plain step inside the round) saw none either."""
    m = tally(Metrics(), k=4, accepted=[2, 1, 0, 4], emitted=[3, 2, 1, 5], active=[True] * 4,
              elapsed_s=1.0, drafted=[2, 3, 0, 4])
    assert m.drafted == 9 and m.accepted == 7 and m.full_rounds == 3
    assert m.alpha == 7 / (7 + 1)  # one rejection (row 1)
    same_k = tally(Metrics(), k=4, accepted=[2, 1, 0, 4], emitted=[3, 2, 1, 5], active=[True] * 4,
                   elapsed_s=1.0)
    assert same_k.drafted == 16 and same_k.full_rounds == 1  # negative control: K for every row


def test_alpha_at_splits_the_evidence_by_a_rows_own_draft_length() -> None:
    """Rows that verified 1 draft and rows that verified 4 are counted apart: accepted and
    accepted-plus-rejections at each length, with the prior added at that length alone."""
    m = tally(Metrics(), k=4, accepted=[0, 4, 1, 0], emitted=[1, 5, 2, 1], active=[True, True, True, False],
              elapsed_s=1.0, drafted=[1, 4, 4, 1])  # row 3 is done: not counted
    m = tally(m, k=1, accepted=[1, 0, 0, 0], emitted=[2, 1, 1, 1], active=[True] * 4, elapsed_s=1.0)
    assert m.accepted_at == (0, 1, 0, 0, 5) and m.trials_at == (0, 5, 0, 0, 6)
    assert m.alpha_at(1, 0.0, 0.0) == 1 / 5 and m.alpha_at(4, 0.0, 0.0) == 5 / 6
    assert m.alpha_at(2, 0.5, 8.0) == 0.5  # no evidence: the prior
    assert m.alpha_at(4, 0.5, 4.0) == (5 + 2) / (6 + 4)
    assert m.alpha_at(9, 0.0, 0.0) == 0.0  # no trials at all
    # The pooled alpha mixes both lengths (negative control: it is neither).
    assert m.alpha == 6 / 11 and m.alpha not in (m.alpha_at(1, 0, 0), m.alpha_at(4, 0, 0))
    with pytest.raises(ValueError, match="drafts: expected an int >= 1"):
        m.alpha_at(0, 0.5, 8.0)
    assert json.loads(json.dumps(m.as_dict()))["trials_at"] == [0, 5, 0, 0, 6]


def test_tally_files_acceptance_under_the_wanted_length() -> None:
    """A row that wanted 8 drafts but verified 2 (a narrowed round) is evidence on its
    8-draft proposals: accepting both of 2 is no rejection, filed at 8."""
    m = tally(Metrics(), k=2, accepted=[2, 0], emitted=[3, 1], active=[True, True], elapsed_s=1.0,
              drafted=[2, 1], wanted=[8, 1])
    assert m.accepted_at == (0, 0, 0, 0, 0, 0, 0, 0, 2) and m.trials_at == (0, 1, 0, 0, 0, 0, 0, 0, 2)
    assert m.alpha_at(8, 0.0, 0.0) == 1.0 and m.alpha_at(1, 0.0, 0.0) == 0.0
    by_drafted = tally(Metrics(), k=2, accepted=[2, 0], emitted=[3, 1], active=[True, True],
                       elapsed_s=1.0, drafted=[2, 1])  # without `wanted`: by what was verified
    assert by_drafted.accepted_at == (0, 0, 2) and by_drafted.alpha_at(8, 0.5, 1.0) == 0.5


def test_tally_files_copies_apart_from_model_drafts() -> None:
    """A copy and a model draft of the same wanted length are separate evidence: a row that
    copied 4 and accepted all, and one whose model draft of 4 failed at once."""
    m = tally(Metrics(), k=4, accepted=[4, 0], emitted=[5, 1], active=[True, True], elapsed_s=1.0,
              wanted=[4, 4], copied=[True, False])
    assert m.copied_accepted_at == (0, 0, 0, 0, 4) and m.copied_trials_at == (0, 0, 0, 0, 4)
    assert m.accepted_at == (0, 0, 0, 0, 0) and m.trials_at == (0, 0, 0, 0, 1)
    assert m.alpha_at(4, 0.0, 0.0, copied=True) == 1.0 and m.alpha_at(4, 0.0, 0.0) == 0.0
    # Pooled (negative control) they would read 0.8 for both kinds.
    pooled = tally(Metrics(), k=4, accepted=[4, 0], emitted=[5, 1], active=[True, True],
                   elapsed_s=1.0, wanted=[4, 4])
    assert pooled.alpha_at(4, 0.0, 0.0) == 0.8 and pooled.copied_trials_at == ()
    merged = merge_metrics([m.as_dict(), m.as_dict()])
    assert merged.copied_accepted_at == (0, 0, 0, 0, 8) and merged.trials_at == (0, 0, 0, 0, 2)
    with pytest.raises(ValueError, match="copied: expected 2 flags"):
        tally(Metrics(), k=4, accepted=[4, 0], emitted=[5, 1], active=[True, True], elapsed_s=1.0,
              copied=[True])


def test_tally_counts_a_fan_outs_siblings_as_one_trial_a_round() -> None:
    """Siblings (a head's fan-out of 3): at most one is accepted, so a round is one trial, a
    hit or not, and the rate filed is the hit rate; filed as a chain (negative control) the
    same rounds read hits / (rounds + hits)."""
    rounds = ((1, 2), (0, 1), (1, 2), (0, 1))  # (accepted, emitted): hit, miss, hit, miss
    m = chain = Metrics()
    for accepted, emitted in rounds:
        kw = dict(k=3, accepted=[accepted, 2], emitted=[emitted, 3], active=[True, True], elapsed_s=1.0,
                  drafted=[3, 2], wanted=[3, 2], copied=[False, True])
        m = tally(m, siblings=[True, False], **kw)  # type: ignore[arg-type]
        chain = tally(chain, **kw)  # type: ignore[arg-type]
    assert m.accepted_at == (0, 0, 0, 2) and m.trials_at == (0, 0, 0, 4)
    assert m.alpha_at(3, 0.0, 0.0) == 0.5
    assert chain.alpha_at(3, 0.0, 0.0) == pytest.approx(2 / 6)
    # The copying row's chain is filed as before, apart.
    assert m.copied_accepted_at == chain.copied_accepted_at == (0, 0, 8)
    with pytest.raises(ValueError, match="siblings: expected 2 flags"):
        tally(Metrics(), k=3, accepted=[1, 0], emitted=[2, 1], active=[True, True], elapsed_s=1.0,
              siblings=[True])


def test_a_hybrids_prediction_prices_each_kind_of_round_at_its_own_cost() -> None:
    """Copy rounds (every drafting row copied) at their own acceptance and copy_c, model
    rounds at the model drafts' acceptance and c; plain steps at one token a forward."""
    m = Metrics()
    rounds = (  # (K, accepted, copied)
        (8, 8, True), (8, 2, True), (1, 0, False), (1, 1, False), (1, 0, False), (0, 0, False))
    for k, accepted, copied in rounds:
        m = tally(m, k=k, accepted=[accepted], emitted=[accepted + 1], active=[True], elapsed_s=0.0,
                  wanted=[k], copied=[copied])
    assert m.copied_k_counts == (0, 0, 0, 0, 0, 0, 0, 0, 2) and m.k_counts == (1, 3, 0, 0, 0, 0, 0, 0, 2)
    copy_alpha, model_alpha = 10 / 11, 1 / 3  # copies: 10 accepted, 1 rejection; model: 1 of 3
    c, copy_c = 0.12, 0.03
    tokens = 2 * expected_tokens_per_round(copy_alpha, 8) + 3 * expected_tokens_per_round(model_alpha, 1) + 1
    cost = 2 * (8 * copy_c + 1) + 3 * (c + 1) + 1
    assert m.predicted_speedup(c, copy_c=copy_c) == pytest.approx(tokens / cost)
    # Negative control: pooled (no copy_c), the same rounds read one alpha and one c.
    pooled = m.alpha
    assert m.predicted_speedup(c) == pytest.approx(
        (2 * expected_tokens_per_round(pooled, 8) + 3 * expected_tokens_per_round(pooled, 1) + 1)
        / (2 * (8 * c + 1) + 3 * (c + 1) + 1))
    assert m.predicted_speedup(c) != pytest.approx(m.predicted_speedup(c, copy_c=copy_c))
    # A round of a batch counts as a copy only when every row that drafted copied.
    mixed = tally(Metrics(), k=4, accepted=[4, 0], emitted=[5, 1], active=[True, True], elapsed_s=0.0,
                  wanted=[4, 4], copied=[True, False])
    assert mixed.copied_k_counts == () and merge_metrics([m.as_dict(), m.as_dict()]).copied_k_counts == \
        (0, 0, 0, 0, 0, 0, 0, 0, 4)
    with pytest.raises(ValueError, match=r"c: expected a finite cost ratio >= 0, got -0\.5"):
        m.predicted_speedup(c, copy_c=-0.5)
