"""The full loop on the reference backend: laws of the first 3 tokens, greedy, stops."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from specsample_backends.reference import NGramModel, random_ngram
from specsample_backends.reference.backend import noisy

from specsample import SamplingParams, generate, generate_plain, get_backend, iterate, warp
from specsample.testing import autoregressive_law, goodness_of_fit

PROMPT = [1, 2]
VOCAB = 3


def models(weight: float = 0.5) -> tuple[NGramModel, NGramModel]:
    """A context-dependent target (order 2, V = 3, with zeros) and a draft near it."""
    target = random_ngram(VOCAB, order=2, seed=7, concentration=0.7, zeros=0.2)
    return target, noisy(target, weight)


def first_three(target, drafter, *, rows: int, params: SamplingParams, k: int, seed: int = 0,
                verifier=None) -> np.ndarray:
    """Outcome ids t0 * 9 + t1 * 3 + t2 of the first 3 emitted tokens of `rows` runs."""
    from specsample import verify

    prompt = np.tile(np.array(PROMPT), (rows, 1))
    out = generate(target, drafter, prompt, max_new_tokens=3, params=params, k=k, seed=seed,
                   verifier=verifier or verify)
    new = out.sequences[:, len(PROMPT):len(PROMPT) + 3]
    return new[:, 0] * 9 + new[:, 1] * 3 + new[:, 2]


def expected_law(target: NGramModel, params: SamplingParams) -> np.ndarray:
    """The target's law of 3 tokens after PROMPT, warped as the sampler warps it."""
    def law(context):
        row = np.array([float(x) for x in target.law(context)])
        with np.errstate(divide="ignore"):
            warped = [Fraction(float(x)) for x in warp(np.log(row), params)]
        return [x / sum(warped) for x in warped]  # exactly normalised

    exact = autoregressive_law(law, PROMPT, length=3, vocab_size=VOCAB)
    out = np.zeros(VOCAB**3)
    for (a, b, c), prob in exact.items():
        out[a * 9 + b * 3 + c] = float(prob)
    return out


# n = 200,000 independent rows, M = 27 outcomes: tau = sqrt((ln(2^27 - 2) + ln(1e4)) / 2n)
# ~= 0.0084 at false-failure <= 1e-4 (plus <= 1e-4 for the G-test); a law at TV >= 0.017
# is rejected with probability >= 1 - 1e-4. Fixed seeds make CI deterministic.
ROWS = 200_000


@pytest.mark.parametrize(("params", "k"), [
    (SamplingParams(), 1),
    (SamplingParams(), 2),
    (SamplingParams(temperature=0.7, top_k=2), 2),
    (SamplingParams(temperature=1.3, top_p=0.8), 3),
])
def test_first_three_tokens_follow_the_target_law(params, k):
    target, draft = models()
    backend = get_backend("reference")
    drafter = backend.load_drafter("noisy:0.5", target)
    assert isinstance(drafter.model, NGramModel)
    samples = first_three(target, drafter, rows=ROWS, params=params, k=k, seed=11)
    result = goodness_of_fit(samples, expected_law(target, params))
    assert result.passed, str(result)
    del draft


def test_prompt_lookup_drafts_keep_the_law():
    target, _ = models()
    samples = first_three(target, get_backend("reference").load_drafter("lookup", target),
                          rows=ROWS, params=SamplingParams(), k=2, seed=12)
    result = goodness_of_fit(samples, expected_law(target, SamplingParams()))
    assert result.passed, str(result)


@pytest.mark.parametrize(("draft", "k", "seed"), [("noisy:0.5@0.5", 3, 14), ("hybrid", 2, 15),
                                                  ("hybrid@0.5", 3, 16)])
def test_thresholds_and_hybrid_drafts_keep_the_law(draft, k, seed):
    """A confidence threshold stops rows at different lengths (a stopping time of the draft);
    the hybrid copies where the context repeats and drafts from the model elsewhere. Its
    negative control, a threshold that drops the low-confidence draft, is in
    test_negative_controls.py."""
    target, _ = models()
    drafter = get_backend("reference").load_drafter(draft, target)
    samples = first_three(target, drafter, rows=ROWS, params=SamplingParams(), k=k, seed=seed)
    result = goodness_of_fit(samples, expected_law(target, SamplingParams()))
    assert result.passed, str(result)


def test_the_gated_hybrid_keeps_the_law():
    """`auto`'s rule: a row drafts from the model only while its own acceptance predicts a
    speedup (here a poor draft and a weak prior: rows turn to plain steps after a rejection,
    within the first three tokens)."""
    from specsample import ModelDrafter
    from specsample.drafters.hybrid import HybridDrafter
    from specsample.engine.scheduler import Prior, Scheduler

    target, _ = models()
    drafter = HybridDrafter(ModelDrafter(noisy(target, 0.9)),
                            scheduler=Scheduler(cost_ratio=0.4, prior=Prior(0.9, 1.0)))
    samples = first_three(target, drafter, rows=ROWS, params=SamplingParams(), k=2, seed=17)
    result = goodness_of_fit(samples, expected_law(target, SamplingParams()))
    assert result.passed, str(result)


def test_plain_sampling_follows_the_same_law():
    target, _ = models()
    prompt = np.tile(np.array(PROMPT), (ROWS, 1))
    out = generate_plain(target, prompt, max_new_tokens=3, seed=13)
    new = out.sequences[:, 2:5]
    result = goodness_of_fit(new[:, 0] * 9 + new[:, 1] * 3 + new[:, 2],
                             expected_law(target, SamplingParams()))
    assert result.passed, str(result)


def test_greedy_equals_plain_greedy_with_ragged_prompts():
    target = random_ngram(16, order=2, seed=3, concentration=0.3)
    from specsample import ModelDrafter

    drafter = ModelDrafter(noisy(target, 0.6))
    prompts = np.array([[3, 4, 5, 6, 7], [1, 2, 0, 0, 0], [9, 0, 0, 0, 0], [5, 5, 5, 5, 0]])
    lengths = np.array([5, 2, 1, 4])
    greedy = SamplingParams(temperature=0)
    spec = generate(target, drafter, prompts, prompt_lengths=lengths, max_new_tokens=40,
                    params=greedy, k=3)
    plain = generate_plain(target, prompts, prompt_lengths=lengths, max_new_tokens=40, params=greedy)
    assert np.array_equal(spec.sequences, plain.sequences)
    assert np.array_equal(spec.lengths, lengths + 40)
    for row in range(4):  # each row alone gives the same tokens
        alone = generate(target, drafter, prompts[row:row + 1, : lengths[row]], max_new_tokens=40,
                         params=greedy, k=3)
        assert alone.new_tokens(0) == spec.new_tokens(row)
    assert spec.metrics.rounds < 40  # it did speculate


def test_rows_stop_independently_at_eos_and_max_tokens():
    target = random_ngram(6, order=1, seed=5)
    drafter = get_backend("reference").load_drafter("noisy:0.3", target)
    prompt = np.tile(np.array([1, 2]), (64, 1))
    out = generate(target, drafter, prompt, max_new_tokens=30, eos_token_id=0, k=4, seed=3, pad_id=-1)
    for row in range(64):
        new = out.new_tokens(row)
        assert 1 <= len(new) <= 30
        assert 0 not in new[:-1]  # EOS only ever as the last token
        assert new[-1] == 0 or len(new) == 30
        assert np.all(out.sequences[row, 2 + len(new):] == -1)
    assert len({len(out.new_tokens(r)) for r in range(64)}) > 1


def test_reproducible_from_the_seed_and_streaming_matches():
    target, _draft = models()
    drafter = get_backend("reference").load_drafter("noisy:0.5", target)
    prompt = np.tile(np.array(PROMPT), (8, 1))
    a = generate(target, drafter, prompt, max_new_tokens=20, seed=5)
    b = generate(target, drafter, prompt, max_new_tokens=20, seed=5)
    c = generate(target, drafter, prompt, max_new_tokens=20, seed=6)
    assert np.array_equal(a.sequences, b.sequences) and not np.array_equal(a.sequences, c.sequences)
    steps = list(iterate(target, drafter, prompt, max_new_tokens=20, seed=5))
    assert np.array_equal(steps[-1].state.tokens[:, :22], a.sequences)
    assert sum(int(s.result.emitted.sum()) for s in steps) == 8 * 20
    assert a.metrics.emitted == 160 and sum(a.metrics.histogram) == a.metrics.row_rounds


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"max_new_tokens": 0}, ValueError, "max_new_tokens: expected an int >= 1"),
    ({"max_new_tokens": 5, "seed": -1}, ValueError, r"seed: expected an int in \[0, \d+\), got -1"),
    ({"max_new_tokens": 5, "prompt_lengths": np.array([0])}, ValueError, "prompt_lengths"),
    ({"max_new_tokens": 5, "capacity": 4}, ValueError, "capacity: expected >= "),
    ({"max_new_tokens": 5, "k": 0}, ValueError, "k: expected an int >= 1"),
])
def test_bad_arguments(kwargs, error, match):
    target, _ = models()
    drafter = get_backend("reference").load_drafter("noisy:0.5", target)
    with pytest.raises(error, match=match):
        generate(target, drafter, np.array([PROMPT]), **kwargs)


def test_bad_prompts():
    target, _ = models()
    drafter = get_backend("reference").load_drafter("noisy:0.5", target)
    with pytest.raises(ValueError, match="input_ids: expected a non-empty prompt"):
        generate(target, drafter, np.zeros((1, 0), dtype=np.int64), max_new_tokens=3)
    with pytest.raises(ValueError, match=r"input_ids: expected token ids in \[0, 3\)"):
        generate(target, drafter, np.array([[1, 7]]), max_new_tokens=3)
