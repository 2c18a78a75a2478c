"""verify_block: block verification (Sun et al. 2025), its laws, properties and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_generate import ROWS, expected_law, first_three, models
from test_verify import _case, _well_formed

from specsample import ModelDrafter, SamplingParams, sample, verify, verify_block
from specsample.core.verify_block import block_final_token
from specsample.testing import broken, goodness_of_fit

# Context-free laws with p != q on every token, so that block and token-wise verification
# differ and each broken rule below moves the law far (V = 3).
P = np.array([0.5, 0.3, 0.2])
Q = np.array([0.2, 0.3, 0.5])


def completed_blocks(verifier, *, p: np.ndarray, q: np.ndarray, k: int, rows: int, seed: int,
                     lengths: np.ndarray | None = None) -> np.ndarray:
    """Outcome ids of K+1 tokens: one round's emitted tokens, completed by sampling from p.

    For context-free p, q the completed block of an exact verifier follows p^(K+1).
    """
    rng = np.random.Generator(np.random.Philox(seed))
    vocab = len(p)
    drafts = sample(np.broadcast_to(q, (rows, k, vocab)), rng.random((rows, k)))  # [rows, K]
    target = np.broadcast_to(p, (rows, k + 1, vocab))
    kwargs = {} if lengths is None else {"draft_lengths": lengths}
    verdict = verifier(drafts, np.broadcast_to(q, (rows, k, vocab)), target, rng.random((rows, k + 1)),
                       **kwargs)
    fill = sample(target, rng.random((rows, k + 1)))  # [rows, K+1], i.i.d. from p
    slots = np.arange(k + 1)[None, :]
    tokens = np.where(slots <= verdict.num_accepted[:, None], verdict.tokens, fill)
    return tokens @ (vocab ** np.arange(k, -1, -1))


def product_law(p: np.ndarray, k: int) -> np.ndarray:
    law = np.ones(1)
    for _ in range(k + 1):
        law = np.outer(law, p).ravel()
    return law


# n = 200,000 rows, M = 27 outcomes (K = 2, V = 3): tau = sqrt((ln(2^27 - 2) + ln(1e4)) / 2n)
# ~= 0.0084, false failure <= 1e-4 (plus <= 1e-4 for the G-test); a law at TV >= 2 tau ~= 0.017
# fails with probability >= 1 - 1e-4. Fixed seeds keep CI deterministic.
@pytest.mark.parametrize("lengths", [None, "ragged"])
def test_completed_block_follows_the_product_law(lengths):
    ragged = None if lengths is None else np.arange(ROWS) % 3  # L_b in {0, 1, 2}
    samples = completed_blocks(verify_block, p=P, q=Q, k=2, rows=ROWS, seed=1, lengths=ragged)
    result = goodness_of_fit(samples, product_law(P, 2))
    assert result.passed, str(result)


@pytest.mark.parametrize("name", ["block-without-correction", "block-q-one", "resample-from-p"])
def test_broken_block_rules_are_rejected(name):
    samples = completed_blocks(broken.VERIFIERS[name], p=P, q=Q, k=2, rows=ROWS, seed=2)
    result = goodness_of_fit(samples, product_law(P, 2))
    assert not result.passed and result.tv > 2 * result.tau, f"{name} was not caught: {result}"


def test_one_hot_q_for_sampled_drafts_is_exact():
    # Conditioning on the drafted tokens makes them deterministic proposals: verifying sampled
    # drafts with q = one-hot is exact (only slower), unlike mixing q = 1 into the weights alone.
    def one_hot(drafts, q, p, u):
        return verify_block(drafts, None, p, u)

    result = goodness_of_fit(completed_blocks(one_hot, p=P, q=Q, k=2, rows=ROWS, seed=3),
                             product_law(P, 2))
    assert result.passed, str(result)


def test_generation_with_block_verification_follows_the_target_across_rounds():
    # The first 3 tokens of the full loop, context-dependent n-gram models, K = 2: the same
    # harness, n, tau and power as tests/test_generate.py.
    target, draft = models()
    samples = first_three(target, ModelDrafter(draft), rows=ROWS, params=SamplingParams(), k=2, seed=4,
                          verifier=verify_block)
    result = goodness_of_fit(samples, expected_law(target, SamplingParams()))
    assert result.passed, str(result)


def test_numpy_and_torch_float64_agree_exactly():
    rng = np.random.default_rng(5)
    drafts, q, p, u = _case(rng, 4000, 4, 16)
    lengths = rng.integers(0, 5, size=4000)
    for kwargs in ({}, {"draft_lengths": lengths}):
        ref = verify_block(drafts, q, p, u, **kwargs)
        out = verify_block(*(torch.from_numpy(a) for a in (drafts, q, p, u)),
                           **{k: torch.from_numpy(v) for k, v in kwargs.items()})
        assert isinstance(out.tokens, torch.Tensor) and out.tokens.dtype == torch.int64
        assert np.array_equal(ref.tokens, out.tokens.numpy())
        assert np.array_equal(ref.num_accepted, out.num_accepted.numpy())
        _well_formed(ref.tokens, ref.num_accepted, drafts, p)
    det = verify_block(drafts, None, p, u)
    assert np.array_equal(det.tokens, verify_block(torch.from_numpy(drafts), None, torch.from_numpy(p),
                                                   torch.from_numpy(u)).tokens.numpy())


def test_draft_lengths_cut_the_block():
    rng = np.random.default_rng(6)
    drafts, q, p, u = _case(rng, 3000, 3, 8)
    full = verify_block(drafts, q, p, u)
    assert np.array_equal(full.tokens, verify_block(drafts, q, p, u, draft_lengths=np.full(3000, 3)).tokens)
    lengths = rng.integers(0, 4, size=3000)
    out = verify_block(drafts, q, p, u, draft_lengths=lengths)
    assert np.all(out.num_accepted <= lengths)
    _well_formed(out.tokens, out.num_accepted, drafts, p)
    none = verify_block(drafts, q, p, u, draft_lengths=np.zeros(3000, dtype=np.int64))
    assert np.all(none.num_accepted == 0)
    assert np.array_equal(none.tokens[:, 0], sample(p[:, 0], u[:, 3]))  # straight from P_1
    # A block of L drafts is the block rule on the first L slots, its bonus from P_{L+1}.
    for length in (1, 2):
        cut = verify_block(drafts[:, :length], q[:, :length], p[:, : length + 1],
                           np.concatenate([u[:, :length], u[:, 3:]], axis=1))
        got = verify_block(drafts, q, p, u, draft_lengths=np.full(3000, length))
        assert np.array_equal(got.num_accepted, cut.num_accepted)
        assert np.array_equal(got.tokens[:, : length + 1], cut.tokens)


def _law(values: list[int]) -> np.ndarray:
    arr = np.array(values, dtype=np.float64)
    return arr / arr.sum() if arr.sum() > 0 else np.eye(len(values))[0]


_row = st.lists(st.integers(0, 4), min_size=4, max_size=4)


@settings(max_examples=150, deadline=None)
@given(p_rows=st.lists(_row, min_size=3, max_size=3), q_rows=st.lists(_row, min_size=2, max_size=2),
       picks=st.lists(st.integers(0, 3), min_size=2, max_size=2),
       u=st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.999]), min_size=3, max_size=3),
       deterministic=st.booleans())
def test_properties_on_small_laws(p_rows, q_rows, picks, u, deterministic):
    p = np.stack([_law(r) for r in p_rows])[None]  # [1, 3, 4], zeros included
    q = np.stack([_law(r) for r in q_rows])[None]  # [1, 2, 4]
    drafts = np.array([[pick if q[0, i, pick] > 0 else int(np.argmax(q[0, i]))
                        for i, pick in enumerate(picks)]])  # a token q can draw
    out = verify_block(drafts, None if deterministic else q, p, np.array([u]))
    n = int(out.num_accepted[0])
    assert 0 <= n <= 2
    # A draft with p(x) = 0 ends the block before it (p_i = 0 makes every later h_j = 0), even at u = 0.
    zero = [i for i in range(2) if p[0, i, drafts[0, i]] == 0]
    assert not zero or n <= zero[0]
    assert p[0, n, out.tokens[0, n]] > 0  # the final token has positive target mass
    if u == [0.0, 0.0, 0.0] and not zero:
        assert n == 2  # eta = 0 passes h_K = p_K > 0
    if deterministic:  # one-hot q: the same rule as the materialised one-hot
        one_hot = np.eye(4)[drafts]
        assert np.array_equal(out.tokens, verify_block(drafts, one_hot, p, np.array([u])).tokens)


@given(u=st.lists(st.floats(0.0, 0.999), min_size=4, max_size=4))
@settings(max_examples=100, deadline=None)
def test_p_equals_q_accepts_everything_and_disjoint_supports_nothing(u):
    law = np.array([0.5, 0.25, 0.25, 0.0])
    p = np.broadcast_to(law, (1, 4, 4)).copy()
    drafts = np.array([[0, 1, 2]])
    same = verify_block(drafts, p[:, :3], p, np.array([u]))
    assert int(same.num_accepted[0]) == 3 and np.array_equal(same.tokens[0, :3], drafts[0])
    disjoint_q = np.broadcast_to(np.array([0.0, 0.0, 0.0, 1.0]), (1, 3, 4))
    disjoint = verify_block(np.array([[3, 3, 3]]), disjoint_q, p, np.array([u]))
    assert int(disjoint.num_accepted[0]) == 0
    assert int(disjoint.tokens[0, 0]) == int(sample(law, np.array(u[3])))  # the residual is p itself


def test_zero_residual_mass_falls_back_to_p_and_zero_q_gives_no_nan():
    # A residual with no mass has probability 0 in exact arithmetic (P(tau = i) is proportional
    # to its mass Z_{i+1}) but rounding can reach it: the final token then comes from P_{tau+1}.
    p = np.array([[[0.5, 0.5, 0.0]] * 3])
    q = np.array([[[0.5, 0.5, 0.0]] * 2])
    weights = np.ones((1, 2))
    for u in (0.2, 0.7):
        token = block_final_token(weights, q, p, np.array([0]), np.array([2]), np.array([u]))
        assert int(token[0]) == int(sample(p[0, 0], np.array(u)))
    with np.errstate(all="raise"):  # q(x) = 0 at an unchecked input: guarded, no division by zero
        bad_q = np.array([[[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]])
        out = verify_block(np.array([[0, 1]]), bad_q, p, np.array([[0.5, 0.5, 0.7]]), check=False)
    assert int(out.num_accepted[0]) == 2


def test_inputs_are_not_modified():
    rng = np.random.default_rng(8)
    args = _case(rng, 50, 3, 6)
    lengths = rng.integers(0, 4, size=50)
    copies = [a.copy() for a in (*args, lengths)]
    verify_block(*args, draft_lengths=lengths)
    assert all(np.array_equal(a, b) for a, b in zip((*args, lengths), copies, strict=True))


@pytest.mark.parametrize(("lengths", "error", "match"), [
    (np.array([0, 1, 4]), ValueError, r"draft_lengths: expected values in \[0, 3\], got range \[0, 4\]"),
    (np.array([0, -1, 2]), ValueError, r"draft_lengths: expected values in \[0, 3\]"),
    (np.array([0, 1]), ValueError, r"draft_lengths: expected shape \[3\], got \[2\]"),
    (np.array([0.0, 1.0, 2.0]), TypeError, r"draft_lengths: expected an integer array, got dtype float64"),
])
def test_bad_draft_lengths_name_the_argument(lengths, error, match):
    drafts, q, p, u = _case(np.random.default_rng(9), 3, 3, 5)
    with pytest.raises(error, match=match):
        verify_block(drafts, q, p, u, draft_lengths=lengths)


def test_bad_input_is_checked_as_verify_checks_it():
    drafts, q, p, u = _case(np.random.default_rng(10), 3, 3, 5)
    u[0, 0] = 1.0
    with pytest.raises(ValueError, match=r"uniforms: expected values in \[0, 1\)"):
        verify_block(drafts, q, p, u)
    with pytest.raises(ValueError, match="draft_probs: expected shape"):
        verify_block(drafts, q[:, :2], p, u * 0.5)


def test_k_equal_1_matches_token_wise_verification_away_from_ties():
    # At K = 1, h_1 = p_1 = min(1, p(x)/q(x)): the token-wise rule, tested as u < p/q instead of
    # u q < p, so rows may differ only where u sits within rounding of p/q.
    rng = np.random.default_rng(11)
    drafts, q, p, u = _case(rng, 20000, 1, 8)
    a, b = verify(drafts, q, p, u), verify_block(drafts, q, p, u)
    px, qx = p[np.arange(20000), 0, drafts[:, 0]], q[np.arange(20000), 0, drafts[:, 0]]
    differ = np.any(a.tokens != b.tokens, axis=1)
    assert np.all(np.abs(u[differ, 0] * qx[differ] - px[differ]) <= 1e-12)
