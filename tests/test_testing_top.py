"""`specsample.testing.most_likely_sequences` and `project_sequences`: the outcomes of a
goodness-of-fit test of a sampler's first tokens, fixed by the law before any sample."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specsample.testing import most_likely_sequences, project_sequences


def random_chain(vocab: int, seed: int, zeros: bool = False):  # type: ignore[no-untyped-def]
    """A law of the next token for every prefix, a fixed function of the prefix (seeded by it),
    with calls counted."""
    calls: list[tuple[int, ...]] = []

    def law_of(prefix: tuple[int, ...]) -> np.ndarray:
        calls.append(prefix)
        rng = np.random.default_rng([seed, len(prefix), *prefix])
        probs = rng.dirichlet(np.full(vocab, 0.4))
        if zeros:
            probs[rng.random(vocab) < 0.4] = 0.0
            probs = probs / probs.sum() if probs.sum() > 0 else np.eye(vocab)[0]
        return probs

    return law_of, calls


def brute_force(law_of, vocab: int, length: int) -> dict[tuple[int, ...], float]:  # type: ignore[no-untyped-def]
    out = {}
    for seq in itertools.product(range(vocab), repeat=length):
        mass = 1.0
        for i in range(length):
            mass *= float(law_of(seq[:i])[seq[i]])
        out[seq] = mass
    return out


@settings(max_examples=40, deadline=None)
@given(vocab=st.integers(2, 5), length=st.integers(1, 3), count=st.integers(1, 9), seed=st.integers(0, 10**6),
       zeros=st.booleans())
def test_the_most_likely_sequences_are_those_of_a_full_enumeration(vocab: int, length: int, count: int,
                                                                  seed: int, zeros: bool) -> None:
    law_of, _ = random_chain(vocab, seed, zeros)
    every = brute_force(law_of, vocab, length)
    positive = sorted((m for m in every.values() if m > 0), reverse=True)
    sequences, masses = most_likely_sequences(law_of, count=count, length=length)
    assert len(sequences) == min(count, len(positive))
    assert np.allclose(masses, positive[:len(sequences)], rtol=1e-12, atol=0)  # the best, in order
    for seq, mass in zip(sequences, masses, strict=True):
        assert len(seq) == length and every[seq] == pytest.approx(mass, rel=1e-12)
    assert len(set(sequences)) == len(sequences)


def test_a_likely_first_token_with_spread_out_continuations_loses_to_a_certain_path() -> None:
    """First token 0 has 0.6 but spreads its continuations over 4 tokens (0.15 each); token
    1 has 0.4 and one certain continuation (0.4): a search that keeps only the best first
    tokens (greedy, or a beam of 1) returns (0, x) first; the exact order starts with (1, 3)."""
    def law_of(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix == ():
            return np.array([0.6, 0.4, 0.0, 0.0])
        if prefix == (1,):
            return np.array([0.0, 0.0, 0.0, 1.0])
        return np.full(4, 0.25)

    sequences, masses = most_likely_sequences(law_of, count=3, length=2)
    assert sequences == [(1, 3), (0, 0), (0, 1)]
    assert masses.tolist() == pytest.approx([0.4, 0.15, 0.15])


def test_the_search_reads_only_prefixes_as_likely_as_the_last_sequence() -> None:
    """Each law is read once per expanded prefix, and only prefixes at least as likely as the
    last sequence returned are expanded: far fewer reads than the full tree."""
    vocab, length, count = 6, 3, 7
    law_of, calls = random_chain(vocab, seed=11)
    quiet, _ = random_chain(vocab, seed=11)  # the same law, its reads not counted
    _, masses = most_likely_sequences(law_of, count=count, length=length)
    assert len(calls) == len(set(calls))
    for prefix in calls:
        mass = float(np.prod([quiet(prefix[:i])[prefix[i]] for i in range(len(prefix))]))
        assert mass >= masses[-1] * (1 - 1e-12)
    assert len(calls) < 1 + vocab + vocab**2  # the tree's inner prefixes


def test_fewer_sequences_come_back_when_fewer_have_positive_probability() -> None:
    def law_of(prefix: tuple[int, ...]) -> np.ndarray:
        return np.array([0.0, 1.0, 0.0]) if prefix else np.array([0.5, 0.0, 0.5])

    sequences, masses = most_likely_sequences(law_of, count=5, length=2)
    assert sequences == [(0, 1), (2, 1)] and masses.tolist() == [0.5, 0.5]


@pytest.mark.parametrize("kwargs, law, match", [
    ({"count": 0, "length": 2}, [0.5, 0.5], "count"),
    ({"count": 2, "length": 0}, [0.5, 0.5], "length"),
    ({"count": 2, "length": 2}, [[0.5, 0.5]], r"law_of: expected probabilities of shape \[V\]"),
    ({"count": 2, "length": 2}, [0.5, 0.6], "summing to 1"),
    ({"count": 2, "length": 2}, [1.5, -0.5], "summing to 1"),
    ({"count": 2, "length": 2}, [float("nan"), 1.0], "finite"),
])
def test_most_likely_sequences_validates(kwargs: dict[str, object], law: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        most_likely_sequences(lambda prefix: law, **kwargs)  # type: ignore[arg-type]


def test_bool_sizes_and_a_law_that_is_no_function_are_refused() -> None:
    with pytest.raises(TypeError, match="length: expected an int, got bool True"):
        most_likely_sequences(lambda prefix: [0.5, 0.5], count=2, length=True)
    with pytest.raises(TypeError, match="count: expected an int, got bool True"):
        most_likely_sequences(lambda prefix: [0.5, 0.5], count=True, length=2)
    with pytest.raises(TypeError, match=r"law_of: expected a function of a prefix .* got list"):
        most_likely_sequences([0.5, 0.5], count=2, length=2)  # type: ignore[arg-type]


def test_a_law_summing_slightly_over_one_is_normalised_so_the_order_holds() -> None:
    """A child more likely than its parent (a law summing to 1 + 5e-7, within the tolerance)
    would break the search's order: laws are normalised, and the best sequence comes first."""
    def law_of(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix == ():
            return np.array([0.4, 0.39999999, 0.20000001])
        return np.array([1 + 5e-7, 0.0, 0.0]) if prefix == (1,) else np.array([1.0, 0.0, 0.0])

    sequences, masses = most_likely_sequences(law_of, count=2, length=2)
    assert sequences == [(0, 0), (1, 0)] and masses[0] >= masses[1]
    assert most_likely_sequences(law_of, count=1, length=2)[0] == [(0, 0)]


def test_sequences_whose_probability_underflows_are_not_returned() -> None:
    def law_of(prefix: tuple[int, ...]) -> np.ndarray:
        return np.array([1 - 1e-200, 1e-200])

    sequences, masses = most_likely_sequences(law_of, count=5, length=2)
    assert sequences == [(0, 0), (0, 1), (1, 0)] and bool(np.all(masses > 0))


def test_a_law_whose_vocabulary_changes_with_the_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match=r"law_of: expected probabilities of shape \[2\] after prefix \(0,"):
        most_likely_sequences(lambda prefix: [1.0, 0.0, 0.0] if prefix else [0.6, 0.4], count=2, length=2)


def test_project_sequences_maps_rows_to_the_first_equal_sequence_else_the_rest() -> None:
    rows = np.array([[1, 2], [3, 4], [1, 2], [2, 1], [3, 4]])
    assert project_sequences(rows, [(1, 2), (3, 4)]).tolist() == [0, 1, 0, 2, 1]
    assert project_sequences(rows, []).tolist() == [0] * 5
    with pytest.raises(ValueError, match=r"tokens: expected integer ids of shape \[n, L\]"):
        project_sequences(np.array([1, 2]), [(1,)])
    with pytest.raises(ValueError, match=r"tokens: expected integer ids"):
        project_sequences(np.array([[0.5, 1.0]]), [(1, 2)])
    with pytest.raises(ValueError, match=r"sequences: expected tuples of 2 token ids >= 0 each .* got "
                                         r"\(1, 2, 3\) as sequence 1"):
        project_sequences(rows, [(1, 2), (1, 2, 3)])
    for bad in ((1.7, 2), (True, 2), (-1, 2), (2**63, 2), 5):
        with pytest.raises(ValueError, match="sequences: expected tuples of 2 token ids"):
            project_sequences(rows, [bad])  # type: ignore[list-item]
