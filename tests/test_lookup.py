"""PromptLookupDrafter: the most recent n-gram match, static shapes, lossless in generation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from specsample_backends.reference import random_ngram

from specsample.core.params import SamplingParams
from specsample.core.protocols import Drafter
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.engine.generate import generate, generate_plain

PARAMS = SamplingParams()


def _reference(seq: list[int], k: int, ngram_max: int, ngram_min: int) -> list[int]:
    """The rule in plain Python: longest n first, latest earlier end, periodic beyond L-1."""
    length = len(seq)
    end = length - 2
    for n in range(ngram_max, ngram_min - 1, -1):
        hits = [e for e in range(n - 1, length - 1) if length >= n and seq[e - n + 1: e + 1] == seq[-n:]]
        if hits:
            end = max(hits)
            break
    period = length - 1 - end
    return [seq[end + 1 + i % period] for i in range(k)]


def _pad(rows: list[list[int]], width: int, fill: int = 0) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.full((len(rows), width), fill, dtype=np.int64)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = row
    return tokens, np.array([len(r) for r in rows], dtype=np.int64)


def test_is_a_drafter_and_stateless() -> None:
    drafter = PromptLookupDrafter()
    assert isinstance(drafter, Drafter)
    tokens, lengths = _pad([[1, 2]], 4)
    assert drafter.start(tokens, lengths, 4) is None
    assert drafter.advance(None, lengths) is None


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_known_cases(lib: str) -> None:
    rows = [[1, 2, 3, 4, 1, 2, 3],  # 3-gram match: its continuation, then periodic
            [5, 6, 7, 8, 9, 5],  # 1-gram match
            [7],  # nothing to match: repeat the last token
            [1, 2, 1, 2, 1, 2, 1],  # the most recent match wins
            [1, 2, 3, 9, 5, 3, 8, 1, 2, 3]]  # a longer match beats a more recent shorter one
    tokens, lengths = _pad(rows, 12, fill=4)
    if lib == "torch":
        tokens, lengths = torch.from_numpy(tokens), torch.from_numpy(lengths)
    got = PromptLookupDrafter().propose(None, tokens, lengths, 4, PARAMS, None)
    assert got.probs is None and got.state is None
    assert np.asarray(got.tokens).tolist() == [[4, 1, 2, 3], [6, 7, 8, 9], [7, 7, 7, 7], [2, 1, 2, 1],
                                               [9, 5, 3, 8]]
    assert np.asarray(got.tokens).dtype == np.int64


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=4),
       k=st.integers(1, 6), ngram_min=st.integers(1, 3), extra=st.integers(0, 2),
       garbage=st.integers(0, 3))
def test_matches_the_python_rule_and_ignores_garbage(rows: list[list[int]], k: int, ngram_min: int,
                                                     extra: int, garbage: int) -> None:
    ngram_max = ngram_min + extra
    tokens, lengths = _pad(rows, 14, fill=garbage)
    got = PromptLookupDrafter(ngram_max, ngram_min).propose(None, tokens, lengths, k, PARAMS, None)
    for b, row in enumerate(rows):  # rows are independent of the batch and of positions >= L
        assert got.tokens[b].tolist() == _reference(row, k, ngram_max, ngram_min)


def test_greedy_generation_equals_plain_greedy() -> None:
    target = random_ngram(8, order=2, seed=5, concentration=0.2)
    prompts, lengths = _pad([[1, 2, 3, 1, 2], [4, 4], [6]], 5)
    greedy = SamplingParams(temperature=0)
    spec = generate(target, PromptLookupDrafter(), prompts, prompt_lengths=lengths, max_new_tokens=30,
                    params=greedy, k=4)
    plain = generate_plain(target, prompts, prompt_lengths=lengths, max_new_tokens=30, params=greedy)
    assert np.array_equal(spec.sequences, plain.sequences)
    assert spec.metrics.accepted > 0  # greedy n-gram text repeats: lookups get accepted


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_draft_lengths_are_k_only_after_a_confident_match(lib: str) -> None:
    rows = [[5, 6, 7, 8, 9, 5],  # a 1-gram match only
            [7],  # no match
            [1, 2, 3, 1, 2]]  # a 2-gram match
    tokens, lengths = _pad(rows, 8, fill=5)
    if lib == "torch":
        tokens, lengths = torch.from_numpy(tokens), torch.from_numpy(lengths)

    def lengths_of(drafter: PromptLookupDrafter, k: int) -> list[int]:
        return [int(v) for v in drafter.draft_lengths(tokens, lengths, k)]

    drafter = PromptLookupDrafter()
    assert drafter.confident == 2
    assert lengths_of(drafter, 4) == [1, 0, 4]
    assert lengths_of(drafter, 0) == [0, 0, 0]
    assert lengths_of(PromptLookupDrafter(confident=1), 4) == [4, 0, 4]
    assert lengths_of(PromptLookupDrafter(confident=None), 4) == [4, 4, 4]
    # A row's length is a function of that row alone.
    alone = drafter.draft_lengths(tokens[2:], lengths[2:], 4)
    assert [int(v) for v in alone] == [4]
    assert PromptLookupDrafter(3, 3).confident == 3


def test_shortened_rounds_keep_greedy_output_and_count_each_k() -> None:
    target = random_ngram(8, order=2, seed=5, concentration=0.2)
    prompts, lengths = _pad([[1, 2, 3, 4, 5, 6, 7, 0]], 8)
    greedy = SamplingParams(temperature=0)
    spec = generate(target, PromptLookupDrafter(), prompts, prompt_lengths=lengths,
                    max_new_tokens=40, params=greedy, k=4)
    plain = generate_plain(target, prompts, prompt_lengths=lengths, max_new_tokens=40, params=greedy)
    assert np.array_equal(spec.sequences, plain.sequences)
    counts = spec.metrics.k_counts
    assert counts[0] > 0 and counts[1] > 0 and counts[4] > 0 and sum(counts) == spec.metrics.rounds
    # Plain steps draft nothing and stay out of the accepted-length histogram.
    drafting = sum(counts[1:])
    assert spec.metrics.drafted == sum(k * n for k, n in enumerate(counts))
    assert sum(spec.metrics.histogram) == drafting
    assert spec.metrics.emitted == 40


@pytest.mark.parametrize(("args", "match"), [((0, 1), "ngram_max"), ((2, 3), "ngram_min"),
                                             ((2, True), "ngram_min"),
                                             ((3, 1, 4), "confident: expected None or an int in "
                                                         r"\[1, 3\], got 4")])
def test_bad_ngram_sizes(args: tuple[int, int], match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        PromptLookupDrafter(*args)


def test_bad_inputs() -> None:
    tokens, lengths = _pad([[1, 2]], 4)
    drafter = PromptLookupDrafter()
    with pytest.raises(ValueError, match="k: expected an int >= 1"):
        drafter.propose(None, tokens, lengths, 0, PARAMS, None)
    with pytest.raises(ValueError, match="lengths"):
        drafter.propose(None, tokens, lengths[None], 2, PARAMS, None)
    with pytest.raises(ValueError, match="k: expected an int >= 0, got -1"):
        drafter.draft_lengths(tokens, lengths, -1)
