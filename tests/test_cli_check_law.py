"""The tests `specsample check` runs on its samples (`specsample.cli._check_law`), on a toy
chain law whose samples are drawn here: a sampler of the exact law passes, one of a law at
TV 0.2 from it fails.

Sample size n = 3,000 sequences of 3 tokens per test, alpha = 1e-3: each test's false-failure
bound is 1e-3 (so < 4e-3 for the four tests of the passing case); the tests detect TV 0.05
on the projected law at that n with miss rate <= 1e-3, and the failing case sits at
TV >= 0.2 on the first token's projection.
"""

from __future__ import annotations

import numpy as np
import pytest

from specsample.cli._check_law import BINS, LENGTH, law_tests, sequence_ids

VOCAB = 12


def _law(prefix: tuple[int, ...], shifted: bool = False) -> np.ndarray:
    """A chain law over VOCAB tokens with spread: token t after prefix weighs 1 / (1 + (t +
    shift) mod V), shift the last token (0 at the start); `shifted` moves 0.2 of the first
    token's mass from the likeliest token to the eleventh."""
    shift = prefix[-1] if prefix else 0
    weights = 1.0 / (1.0 + (np.arange(VOCAB) + shift) % VOCAB)
    law = weights / weights.sum()
    if shifted and not prefix:
        law = law.copy()
        law[0] -= 0.2
        law[10] += 0.2
    return law


def _draw(n: int, shifted: bool, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty((n, LENGTH), dtype=np.int64)
    for i in range(n):
        prefix: tuple[int, ...] = ()
        for j in range(LENGTH):
            out[i, j] = rng.choice(VOCAB, p=_law(prefix, shifted))
            prefix = (*prefix, int(out[i, j]))
    return out


def test_exact_sampler_passes_every_test() -> None:
    spec, plain = _draw(3000, False, 1), _draw(3000, False, 2)
    results, sequences, masses = law_tests(spec, plain, _law, alpha=1e-3)
    assert len(results) == 4 and all(r.passed for r in results.values()), results
    # The outcomes are the law's BINS - 1 likeliest sequences, found from the law alone.
    assert len(sequences) == BINS - 1 and all(len(q) == LENGTH for q in sequences)
    every = {(a, b, c): _law(())[a] * _law((a,))[b] * _law((a, b))[c]
             for a in range(VOCAB) for b in range(VOCAB) for c in range(VOCAB)}
    best = sorted(every.values(), reverse=True)[:BINS - 1]
    assert np.allclose(masses, best)


def test_shifted_sampler_fails_against_the_exact_law_and_plain() -> None:
    spec, plain = _draw(3000, True, 1), _draw(3000, False, 2)
    results, _, _ = law_tests(spec, plain, _law, alpha=1e-3)
    failed = [what for what, r in results.items() if not r.passed]
    assert any(what.startswith("first token, spec vs exact") for what in failed), results
    assert "first token, spec vs plain" in failed, results


def test_without_plain_only_the_exact_tests_run() -> None:
    results, _, _ = law_tests(_draw(500, False, 3), None, _law, alpha=1e-3)
    assert sorted(results) == sorted(what for what in results if "exact p" in what) and len(results) == 2


def test_sequence_ids_are_distinct_per_sequence() -> None:
    rows = np.array([[1, 2, 3], [3, 2, 1], [1, 2, 3], [0, 0, 2**20]])
    ids = sequence_ids(rows)
    assert ids[0] == ids[2] and len(set(ids.tolist())) == 3


@pytest.mark.parametrize("bad", [np.zeros((4, 2), dtype=np.int64), np.zeros((4, 3)),
                                 np.zeros(3, dtype=np.int64)])
def test_samples_of_the_wrong_shape_or_type_are_refused(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"spec: expected integer token ids of shape \[n, 3\]"):
        law_tests(bad, None, _law, alpha=1e-3)
    with pytest.raises(ValueError, match="plain: expected"):
        law_tests(np.zeros((4, 3), dtype=np.int64), bad, _law, alpha=1e-3)
