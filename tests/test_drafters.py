"""ModelDrafter over the reference n-gram: q is the draft's exact law given the drafted prefix."""

from __future__ import annotations

import numpy as np
import pytest
from specsample_backends.reference import NGramModel, random_ngram

from specsample.core.params import SamplingParams
from specsample.core.protocols import Drafter
from specsample.core.rng import uniforms
from specsample.core.sample import sample
from specsample.drafters.model import DraftState, ModelDrafter, confidence_lengths

CAPACITY = 32


def _law(model: NGramModel, context: list[int]) -> np.ndarray:
    return np.array([float(x) for x in model.law(tuple(context))])


def _prompt(rows: list[list[int]], width: int = CAPACITY) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.zeros((len(rows), width), dtype=np.int64)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = row
    return tokens, np.array([len(r) for r in rows], dtype=np.int64)


@pytest.fixture
def model() -> NGramModel:
    # order 2 and zeros: the law depends on the last two tokens and has holes
    return random_ngram(6, order=2, seed=3, zeros=0.4)


def test_is_a_drafter(model: NGramModel) -> None:
    assert isinstance(ModelDrafter(model), Drafter)


def test_rejects_a_non_model() -> None:
    with pytest.raises(TypeError, match="model: expected a specsample Model, got str"):
        ModelDrafter("ngram")  # type: ignore[arg-type]


def test_start_prefills_all_but_the_last_prompt_token(model: NGramModel) -> None:
    tokens, lengths = _prompt([[1, 2, 3, 4], [5, 1], [2]])
    state = ModelDrafter(model).start(tokens, lengths, CAPACITY)
    assert isinstance(state, DraftState)
    assert state.window == 1
    assert state.cache.lengths.tolist() == [3, 1, 0]
    assert state.cache.capacity == CAPACITY
    assert state.cache.buffers[0, :3].tolist() == [1, 2, 3]
    assert state.cache.buffers[1, 0] == 5


def _check_proposal(model: NGramModel, committed: list[list[int]], proposal_tokens: np.ndarray,
                    probs: np.ndarray) -> None:
    for b, prefix in enumerate(committed):
        context = list(prefix)
        for i, x in enumerate(proposal_tokens[b].tolist()):
            np.testing.assert_allclose(probs[b, i], _law(model, context), rtol=0, atol=1e-12)
            assert probs[b, i, x] > 0
            context.append(x)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_propose_shapes_and_exact_laws(model: NGramModel, k: int) -> None:
    rows = [[1, 2, 3], [4, 0, 5]]
    tokens, lengths = _prompt(rows)
    drafter = ModelDrafter(model)
    state = drafter.start(tokens, lengths, CAPACITY)
    u = uniforms(7, 0, 2, k)
    proposal = drafter.propose(state, tokens, lengths, k, SamplingParams(), u)
    assert proposal.tokens.shape == (2, k)
    assert proposal.tokens.dtype == np.int64
    assert proposal.probs.shape == (2, k, model.vocab_size)
    assert proposal.probs.dtype == np.float64
    _check_proposal(model, rows, proposal.tokens, proposal.probs)
    # the tokens are drawn with the given uniforms from the reported law
    for i in range(k):
        np.testing.assert_array_equal(proposal.tokens[:, i], sample(proposal.probs[:, i], u[:, i]))
    # the cache holds the prompt and all drafts but the last
    assert proposal.state.cache.lengths.tolist() == [3 + k - 1, 3 + k - 1]
    assert proposal.state.window == 1
    # inputs untouched
    assert state.cache.lengths.tolist() == [2, 2]


def test_draft_tokens_have_positive_q_over_many_seeds(model: NGramModel) -> None:
    rows = [[0], [1, 2], [3, 4, 5]]
    tokens, lengths = _prompt(rows)
    drafter = ModelDrafter(model)
    for seed in range(40):
        state = drafter.start(tokens, lengths, CAPACITY)  # a proposal consumes the draft cache
        proposal = drafter.propose(state, tokens, lengths, 4, SamplingParams(), uniforms(seed, 0, 3, 4))
        q = np.take_along_axis(proposal.probs, proposal.tokens[:, :, None], axis=2)
        assert np.all(q > 0)


def test_propose_ragged_lengths(model: NGramModel) -> None:
    rows = [[2, 3, 4, 5, 1], [1], [3, 3]]
    tokens, lengths = _prompt(rows)
    drafter = ModelDrafter(model)
    state = drafter.start(tokens, lengths, CAPACITY)
    proposal = drafter.propose(state, tokens, lengths, 3, SamplingParams(), uniforms(1, 0, 3, 3))
    _check_proposal(model, rows, proposal.tokens, proposal.probs)
    assert proposal.state.cache.lengths.tolist() == [7, 3, 4]


def test_propose_greedy_takes_the_argmax(model: NGramModel) -> None:
    rows = [[1, 2], [3, 4]]
    tokens, lengths = _prompt(rows)
    drafter = ModelDrafter(model)
    state = drafter.start(tokens, lengths, CAPACITY)
    proposal = drafter.propose(state, tokens, lengths, 3, SamplingParams(temperature=0), uniforms(0, 0, 2, 3))
    for b, prefix in enumerate(rows):
        context = list(prefix)
        for i in range(3):
            expected = int(np.argmax(_law(model, context)))
            assert proposal.tokens[b, i] == expected
            assert proposal.probs[b, i].tolist() == np.eye(model.vocab_size)[expected].tolist()
            context.append(expected)


def test_advance_rolls_back_to_l_minus_2_and_next_round_feeds_two(model: NGramModel) -> None:
    k = 3
    rows = [[1, 2, 3], [4, 5]]
    tokens, lengths = _prompt(rows)
    drafter = ModelDrafter(model)
    state = drafter.start(tokens, lengths, CAPACITY)
    proposal = drafter.propose(state, tokens, lengths, k, SamplingParams(), uniforms(2, 0, 2, k))
    drafts = proposal.tokens.tolist()
    # Row 0 accepts 1 draft then a final token that differs from the rejected draft;
    # row 1 accepts all k drafts and a bonus token.
    final0 = (drafts[0][1] + 1) % model.vocab_size
    committed = [rows[0] + drafts[0][:1] + [final0], rows[1] + drafts[1] + [0]]
    tokens, new_lengths = _prompt(committed)
    state = drafter.advance(proposal.state, new_lengths)
    assert state.window == 2
    assert state.cache.lengths.tolist() == [len(c) - 2 for c in committed]
    assert state.cache.buffers is proposal.state.cache.buffers  # a rollback, not a copy

    second = drafter.propose(state, tokens, new_lengths, k, SamplingParams(), uniforms(2, 1, 2, k))
    _check_proposal(model, committed, second.tokens, second.probs)
    cache = second.state.cache
    # the two fed tokens overwrite the stale draft positions with the committed ones
    for b, row in enumerate(committed):
        assert cache.buffers[b, : len(row)].tolist() == row
    assert cache.lengths.tolist() == [len(c) + k - 1 for c in committed]
    assert second.state.window == 2


def test_advance_clips_at_zero(model: NGramModel) -> None:
    tokens, lengths = _prompt([[1], [2]])
    drafter = ModelDrafter(model)
    state = drafter.start(tokens, lengths, CAPACITY)
    advanced = drafter.advance(state, np.array([1, 3], dtype=np.int64))
    assert advanced.cache.lengths.tolist() == [0, 1]
    assert advanced.window == 2


# ---------------------------------------------------------------- confidence threshold

def test_confidence_lengths_keep_the_first_low_draft() -> None:
    conf = np.array([[0.9, 0.2, 0.1], [0.1, 0.9, 0.9], [0.9, 0.8, 0.7], [0.5, 0.5, 0.49]])
    assert confidence_lengths(conf, 0.5).tolist() == [2, 1, 3, 3]
    # Negative control: the rule's boundary is strict (a draft at exactly the threshold stays).
    assert confidence_lengths(np.array([[0.5, 0.4]]), 0.5).tolist() == [2]


@pytest.mark.parametrize("threshold", [0, 1, -0.1, 1.5, True, "0.4", float("nan")])
def test_a_threshold_outside_the_open_interval_is_a_clear_error(model: NGramModel, threshold) -> None:
    with pytest.raises(ValueError, match="threshold: expected None or a number in \\(0, 1\\)"):
        ModelDrafter(model, threshold=threshold)
    with pytest.raises(ValueError, match="threshold: expected a number in \\(0, 1\\)"):
        confidence_lengths(np.ones((1, 2)), threshold)


def test_thresholded_drafts_stop_per_row_and_the_round_stops_when_all_have(model: NGramModel) -> None:
    tokens, lengths = _prompt([[1, 2, 3], [4, 5], [0, 1, 2, 3, 4]])
    plain, sure = ModelDrafter(model), ModelDrafter(model, threshold=0.25)
    u = uniforms(3, 0, 3, 6, like=tokens)
    full = plain.propose(plain.start(tokens, lengths, CAPACITY), tokens, lengths, 6, SamplingParams(), u)
    cut = sure.propose(sure.start(tokens, lengths, CAPACITY), tokens, lengths, 6, SamplingParams(), u)
    assert cut.lengths is not None and full.lengths is None
    made = cut.tokens.shape[1]
    # The same uniforms give the same drafts, up to where drafting stopped.
    np.testing.assert_array_equal(cut.tokens, full.tokens[:, :made])
    np.testing.assert_allclose(cut.probs, full.probs[:, :made])
    # Each row keeps drafts up to its first one with q(x) < 0.25 (q is the temperature-1 law).
    conf = np.take_along_axis(full.probs, full.tokens[..., None], axis=-1)[..., 0]
    expected = confidence_lengths(conf, 0.25)
    np.testing.assert_array_equal(cut.lengths, expected)
    assert made == expected.max() and len(set(expected.tolist())) > 1  # rows differ


def test_thresholded_drafts_reach_the_round(model: NGramModel) -> None:
    from specsample.engine.round import round_step, start

    tokens, lengths = _prompt([[1, 2, 3], [4, 5], [0, 1, 2, 3, 4]])
    drafter = ModelDrafter(model, threshold=0.25)
    state = start(model, drafter, tokens[:, :5], lengths, capacity=CAPACITY, stop_lengths=lengths + 20)
    seen = set()
    for index in range(6):
        state, result = round_step(state, model, drafter, k=4, params=SamplingParams(),
                                   uniforms=uniforms(5, index, 3, 9, like=tokens))
        # p = q here: every kept draft is accepted, and nothing past a row's own length.
        active = result.active
        np.testing.assert_array_equal(result.verdict.num_accepted[active], result.drafted[active])
        seen.update(result.drafted[active].tolist())
    assert len(seen) > 1


# ---------------------------------------------------------------- a draft over a vocabulary subset

class _Supported(NGramModel):
    """An n-gram whose laws are 0 outside `ids`, stating them (or any other list) as its support."""

    def __init__(self, table: np.ndarray, support: object) -> None:
        super().__init__(table)
        self.support = support


def _holed(vocab: int = 6, holes: tuple[int, ...] = (1, 4)) -> np.ndarray:
    """random_ngram's table with ids `holes` never drawn: columns of zeros, rows renormalised."""
    table = random_ngram(vocab, order=2, seed=5).table.copy()
    table[..., list(holes)] = 0.0
    return table / table.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.7, top_k=2),
                                    SamplingParams(temperature=0.8, top_p=0.6),
                                    SamplingParams(temperature=0)],
                         ids=["t1", "top-k", "top-p", "greedy"])
@pytest.mark.parametrize("threshold", [None, 0.3])
def test_a_support_draws_the_full_warps_tokens_from_the_same_law(params: SamplingParams,
                                                                   threshold: float | None) -> None:
    table = _holed()
    subset, full = _Supported(table, np.array([0, 2, 3, 5])), _Supported(table, None)
    tokens, lengths = _prompt([[1, 2, 3], [4, 5], [0, 2, 3, 5, 2]])
    drafters = [ModelDrafter(m, threshold=threshold) for m in (subset, full)]
    assert drafters[0].support.tolist() == [0, 2, 3, 5] and drafters[1].support is None
    for seed in range(25):
        u = uniforms(seed, 0, 3, 4, like=tokens)
        a, b = (d.propose(d.start(tokens, lengths, CAPACITY), tokens, lengths, 4, params, u)
                for d in drafters)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.probs, b.probs, rtol=0, atol=1e-12)
        assert np.all(a.probs[..., [1, 4]] == 0)
        assert (a.lengths is None) == (threshold is None)
        if threshold is not None:
            np.testing.assert_array_equal(a.lengths, b.lengths)


def test_a_support_that_leaves_out_drawn_ids_changes_the_drafts() -> None:
    # Negative control for the test above: a support missing id 5 (which has mass) cannot
    # propose it, so the drafts differ from the full warp's; q is still the law drawn from.
    table = _holed()
    short, full = ModelDrafter(_Supported(table, np.array([0, 2, 3]))), ModelDrafter(_Supported(table, None))
    tokens, lengths = _prompt([[1, 2, 3], [4, 5]])
    differ = False
    for seed in range(25):
        u = uniforms(seed, 0, 2, 3, like=tokens)
        a, b = (d.propose(d.start(tokens, lengths, CAPACITY), tokens, lengths, 3, SamplingParams(), u)
                for d in (short, full))
        differ |= not np.array_equal(a.tokens, b.tokens)
        assert np.all(np.take_along_axis(a.probs, a.tokens[..., None], axis=-1) > 0)
        assert np.all(a.probs[..., 5] == 0)
    assert differ


@pytest.mark.parametrize(("support", "message"), [
    (np.array([3, 2]), "not ascending"), (np.array([0, 0, 1]), "not ascending"),
    (np.array([0, 6]), "ids from 0 to 6"), (np.array([-1, 2]), "ids from -1 to 2"),
    (np.array([[0, 2]]), "shape \\(1, 2\\)"), (np.array([0.0, 2.0]), "dtype float64"),
    (np.array([], dtype=np.int64), "shape \\(0,\\)"), (np.arange(7), "shape \\(7,\\)"),
])
def test_a_bad_support_is_a_clear_error(support: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=f"model.support: expected .*{message}"):
        ModelDrafter(_Supported(_holed(), support))


def test_a_support_of_every_id_is_the_full_warp() -> None:
    assert ModelDrafter(_Supported(_holed(), np.arange(6))).support is None
