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
