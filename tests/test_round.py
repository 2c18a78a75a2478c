"""One round: the speculative step and the plain step (K = 0) a drafter may ask for."""

from __future__ import annotations

import numpy as np
import pytest
from specsample_backends.reference import random_ngram

from specsample import ModelDrafter, SamplingParams
from specsample.core.sample import sample
from specsample.core.warp import warp
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.engine.round import round_step, start


def _start(drafter, prompt: list[list[int]], target):
    tokens = np.array(prompt, dtype=np.int64)
    lengths = np.full(tokens.shape[0], tokens.shape[1], dtype=np.int64)
    return start(target, drafter, tokens, lengths, capacity=tokens.shape[1] + 8,
                 stop_lengths=lengths + 6)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_plain_step_samples_one_token_from_p(temperature: float) -> None:
    target = random_ngram(7, order=2, seed=1, concentration=0.5)
    params = SamplingParams(temperature=temperature)
    state = _start(PromptLookupDrafter(), [[1, 2, 3], [4, 5, 6], [0, 0, 1]], target)
    u = np.array([[0.1], [0.5], [0.95]])
    new, result = round_step(state, target, PromptLookupDrafter(), k=0, params=params, uniforms=u)
    logits, _ = target.forward(state.tokens[:, :3], target.new_cache(3, 4))  # a fresh cache
    expected = sample(warp(logits[:, 2, :], params), u[:, 0])
    assert new.tokens[:, 3].tolist() == expected.tolist()
    assert new.lengths.tolist() == [4, 4, 4] and result.emitted.tolist() == [1, 1, 1]
    assert result.verdict.num_accepted.tolist() == [0, 0, 0]
    assert new.target_cache.lengths.tolist() == [3, 3, 3]  # L - 1 entries, as after any round
    # The next round continues from there as usual.
    after, _ = round_step(new, target, PromptLookupDrafter(), k=2, params=params,
                          uniforms=np.full((3, 5), 0.3))
    assert (after.lengths >= 5).all()


def test_a_plain_step_needs_a_stateless_drafter() -> None:
    target = random_ngram(7, order=2, seed=1, concentration=0.5)
    drafter = ModelDrafter(random_ngram(7, order=2, seed=2, concentration=0.5))
    state = _start(drafter, [[1, 2, 3]], target)
    with pytest.raises(ValueError, match=r"k: 0 \(a plain step\) needs a stateless drafter"):
        round_step(state, target, drafter, k=0, params=SamplingParams(), uniforms=np.zeros((1, 1)))


@pytest.mark.parametrize(("k", "u", "match"), [
    (-1, (1, 1), "k: expected an int >= 0, got -1"),
    (True, (1, 3), "k: expected an int, got bool True"),
    (0, (1, 3), "uniforms: expected shape"),
])
def test_bad_round_arguments(k: int, u: tuple[int, int], match: str) -> None:
    target = random_ngram(7, order=2, seed=1, concentration=0.5)
    state = _start(PromptLookupDrafter(), [[1, 2, 3]], target)
    with pytest.raises((TypeError, ValueError), match=match):
        round_step(state, target, PromptLookupDrafter(), k=k, params=SamplingParams(),
                   uniforms=np.zeros(u))
