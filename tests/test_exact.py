"""Exact tier (no randomness): laws of rounds and sequences with Fractions.

The implementation-based check (verify and sample probed on every cell of the
uniforms) is tests/test_proofs_exact.py; here the algorithm's law as the
toolkit enumerates it is compared with the target's on many more models, and
the accepted-length law with Leviathan et al. Eq. 1.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from specsample_backends.reference import random_ngram

from specsample.testing import (
    accepted_length_law,
    autoregressive_law,
    block_thresholds,
    exact_round_law,
    exact_sequence_law,
    expected_tokens_per_round,
)


@pytest.mark.parametrize(("vocab", "order", "k", "seed"),
                         [(v, o, k, s) for v, o, k, s in itertools.product((2, 3, 4), (1, 2), (1, 2, 3), (0,))
                          if v ** (o + k) <= 4**4])
def test_sequence_law_equals_the_target_law_across_rounds(vocab, order, k, seed):
    target = random_ngram(vocab, order=order, seed=seed, concentration=0.5, zeros=0.3)
    draft = random_ngram(vocab, order=order, seed=seed + 100, concentration=0.5, zeros=0.3)
    length = k + 2  # at least two rounds
    got = exact_sequence_law(target.law, draft.law, (0, 1), k=k, vocab_size=vocab, length=length)
    assert got == autoregressive_law(target.law, (0, 1), length=length, vocab_size=vocab)


def test_round_length_law_for_context_free_p_and_q():
    p = [Fraction(1, 2), Fraction(1, 4), Fraction(1, 8), Fraction(1, 8)]
    q = [Fraction(1, 8), Fraction(1, 8), Fraction(1, 4), Fraction(1, 2)]
    alpha = sum(min(a, b) for a, b in zip(p, q, strict=True))
    for k in (1, 2, 3):
        law = exact_round_law(lambda c: p, lambda c: q, (), k=k, vocab_size=4)
        by_length: dict[int, Fraction] = {}
        for tokens, prob in law.items():
            by_length[len(tokens)] = by_length.get(len(tokens), Fraction(0)) + prob
        # P(N = j) = alpha^(j-1) (1 - alpha) for j <= K, alpha^K for K + 1 tokens.
        assert [by_length.get(j, 0) for j in range(1, k + 2)] == accepted_length_law(alpha, k)
        mean = sum(j * w for j, w in by_length.items())
        assert mean == expected_tokens_per_round(alpha, k) == (1 - alpha ** (k + 1)) / (1 - alpha)


def test_p_equals_q_and_disjoint_supports():
    p = [Fraction(1, 3)] * 3
    law = exact_round_law(lambda c: p, lambda c: p, (), k=2, vocab_size=3)
    assert all(len(t) == 3 for t in law)  # everything accepted, then the bonus token
    q = [Fraction(1), Fraction(0), Fraction(0)]
    r = [Fraction(0), Fraction(1, 2), Fraction(1, 2)]
    law = exact_round_law(lambda c: r, lambda c: q, (), k=2, vocab_size=3)
    assert law == {(1,): Fraction(1, 2), (2,): Fraction(1, 2)}


# --- block verification (Sun et al. 2025), re-derived with Fractions -------------------------

@pytest.mark.parametrize(("vocab", "order", "k", "seed", "det"),
                         [(v, o, k, s, d) for v, o, k, s, d in itertools.product((2, 3, 4), (1, 2), (1, 2, 3),
                                                                                  (0, 1), (False, True))
                          if v ** (o + k) <= 4**4])
def test_block_sequence_law_equals_the_target_law_across_rounds(vocab, order, k, seed, det):
    target = random_ngram(vocab, order=order, seed=seed, concentration=0.5, zeros=0.3)
    draft = random_ngram(vocab, order=order, seed=seed + 100, concentration=0.5, zeros=0.3)
    q = (lambda c: [Fraction(int(j == max(range(vocab), key=draft.law(c).__getitem__)))
                    for j in range(vocab)]) if det else draft.law
    got = exact_sequence_law(target.law, q, (0, 1), k=k, vocab_size=vocab, length=k + 2,
                             deterministic=det, verifier="block")
    assert got == autoregressive_law(target.law, (0, 1), length=k + 2, vocab_size=vocab)


def _accepted(law):
    return sum(w * (len(tokens) - 1) for tokens, w in law.items())


def test_the_papers_example_token_10_9_block_11_9():
    # Sun et al. (2025), Section 1: V = {a, b}, target (1/3, 2/3), draft (2/3, 1/3), K = 2.
    p, q = [Fraction(1, 3), Fraction(2, 3)], [Fraction(2, 3), Fraction(1, 3)]
    laws = {rule: exact_round_law(lambda c: p, lambda c: q, (), k=2, vocab_size=2, verifier=rule)
            for rule in ("token", "block")}
    assert _accepted(laws["token"]) == Fraction(10, 9)
    assert _accepted(laws["block"]) == Fraction(11, 9)


def test_block_accepts_at_least_as_many_drafts_in_expectation():
    # Theorem (proofs/block_verification.md): P(tau >= i) = E[Q p_i] >= E[Q prod_j min(1, P_j/Q_j)]
    # for every i: never worse; equal at K = 1; strictly better at K >= 2 when some path has a
    # draft with q > p followed by one with p > q (not every model has one).
    strict = 0
    for seed in range(6):
        target = random_ngram(3, order=2, seed=seed, concentration=0.5, zeros=0.2)
        draft = random_ngram(3, order=2, seed=seed + 50, concentration=0.5, zeros=0.2)
        for k in (1, 2, 3):
            token, block = (_accepted(exact_round_law(target.law, draft.law, (1, 2), k=k, vocab_size=3,
                                                      verifier=rule)) for rule in ("token", "block"))
            assert block == token if k == 1 else block >= token
            strict += block > token
    assert strict >= 8  # of the 12 cases with K >= 2


def test_block_equals_token_wise_in_expectation_for_one_hot_drafts():
    # q one-hot: p_i = prod_j P_j(x_j), the token-wise product, so E[tau] is the same.
    target = random_ngram(3, order=2, seed=3, concentration=0.5, zeros=0.2)
    draft = random_ngram(3, order=2, seed=53, concentration=0.5, zeros=0.2)

    def argmax(c):
        return [Fraction(int(j == max(range(3), key=draft.law(c).__getitem__))) for j in range(3)]

    token, block = (_accepted(exact_round_law(target.law, argmax, (1, 2), k=3, vocab_size=3,
                                              deterministic=True, verifier=rule))
                    for rule in ("token", "block"))
    assert block == token


def test_block_thresholds_at_the_edges():
    half, one, zero = Fraction(1, 2), Fraction(1), Fraction(0)
    p = [[half, half], [zero, one], [one, zero]]
    weights, h = block_thresholds(p, [[one, zero], [one, zero]], [0, 0])
    assert weights == [half, zero] and h == [half, zero]  # Z_2 = 1/2: (1/2) / (1/2 + 1 - 1/2)
    p = [[half, half], [half, half], [one, zero]]
    weights, h = block_thresholds(p, [[half, half], [half, half]], [0, 1])
    assert weights == [one, one] and h == [zero, one]  # 0/0 (p_1 = 1, P_2 = Q_2) reads as 0
    assert block_thresholds(p[:1], [], []) == ([], [])


def test_unknown_rule_is_a_clear_error():
    with pytest.raises(ValueError, match=r"verifier: expected one of token, block, got 'tree'"):
        exact_round_law(lambda c: [1], lambda c: [1], (), k=1, vocab_size=1, verifier="tree")
