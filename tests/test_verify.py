"""verify: exact properties, backend parity, a 1,000,000-row law check, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specsample import verify
from specsample.testing import accepted_length_law, goodness_of_fit


def _case(rng: np.random.Generator, batch: int, k: int, vocab: int, zeros: float = 0.3):
    """Random p [B, K+1, V], q [B, K, V] with zeros, drafts sampled from q, uniforms."""
    p = rng.dirichlet(np.ones(vocab), size=(batch, k + 1)) * (rng.random((batch, k + 1, vocab)) > zeros)
    p[..., 0] += 1e-3  # never an all-zero row
    p /= p.sum(-1, keepdims=True)
    q = rng.dirichlet(np.ones(vocab), size=(batch, k)) * (rng.random((batch, k, vocab)) > zeros)
    q[..., 1] += 1e-3
    q /= q.sum(-1, keepdims=True)
    cdf = np.cumsum(q, -1)
    drafts = (cdf < rng.random((batch, k, 1)) * cdf[..., -1:]).sum(-1)
    return drafts.astype(np.int64), q, p, rng.random((batch, k + 1))


def _well_formed(tokens: np.ndarray, n: np.ndarray, drafts: np.ndarray, p: np.ndarray) -> None:
    batch, k = drafts.shape
    assert tokens.shape == (batch, k + 1) and n.shape == (batch,)
    assert np.all((n >= 0) & (n <= k))
    for b in range(batch):
        m = int(n[b])
        assert np.array_equal(tokens[b, :m], drafts[b, :m])
        assert np.all(tokens[b, m + 1 :] == -1)
        # Every emitted token has positive target probability at its position.
        assert all(p[b, i, tokens[b, i]] > 0 for i in range(m + 1))


def test_numpy_and_torch_float64_agree_exactly():
    rng = np.random.default_rng(1)
    drafts, q, p, u = _case(rng, 4000, 4, 16)
    ref = verify(drafts, q, p, u)
    out = verify(*(torch.from_numpy(a) for a in (drafts, q, p, u)))
    assert isinstance(out.tokens, torch.Tensor) and out.tokens.dtype == torch.int64
    assert np.array_equal(ref.tokens, out.tokens.numpy())
    assert np.array_equal(ref.num_accepted, out.num_accepted.numpy())
    _well_formed(ref.tokens, ref.num_accepted, drafts, p)
    det = verify(drafts, None, p, u)
    assert np.array_equal(det.tokens, verify(torch.from_numpy(drafts), None, torch.from_numpy(p),
                                             torch.from_numpy(u)).tokens.numpy())


def _near_boundary(drafts, q, p, u, row: int) -> float:
    """The smallest relative gap between a uniform and a threshold it was compared with."""
    k = drafts.shape[1]
    qx = q[row, np.arange(k), drafts[row]]
    px = p[row, np.arange(k), drafts[row]]
    gaps = list(np.abs(u[row, :k] * qx - px) / np.maximum(px, qx))
    for pos in range(k + 1):  # any final-token law the row could have used
        law = np.clip(p[row, pos] - (q[row, pos] if pos < k else 0), 0, None)
        for dist in (law, p[row, pos]):
            if dist.sum() > 0:
                cdf = np.cumsum(dist) / dist.sum()
                gaps.append(float(np.min(np.abs(cdf - u[row, k]))))
    return float(min(gaps))


def test_torch_float32_differs_only_at_interval_boundaries():
    rng = np.random.default_rng(2)
    drafts, q, p, u = _case(rng, 20000, 4, 16)
    ref = verify(drafts, q, p, u)
    f32 = verify(torch.from_numpy(drafts), torch.from_numpy(q).float(), torch.from_numpy(p).float(),
                 torch.from_numpy(u).float())
    differ = np.flatnonzero(np.any(ref.tokens != f32.tokens.numpy(), axis=1))
    # Rare: at most 1 row in 1,000 (float32 keeps ~7 digits, so a row differs only
    # when a uniform falls within ~1e-6 of a threshold).
    assert len(differ) <= 20, f"{len(differ)} of 20000 rows differ"
    assert all(_near_boundary(drafts, q, p, u, int(b)) < 1e-5 for b in differ)


def test_one_million_rows_first_token_and_accepted_length_laws():
    # n = 1,000,000 rows, V = 16, K = 4, the same context-free p and q at every position.
    # goodness_of_fit at alpha = 1e-4: tau = sqrt((ln(2^16 - 2) + ln(1e4)) / 2n) ~= 0.0032,
    # so a pass certifies TV < 0.0032 < 0.005 and a law at TV >= 0.0064 fails with
    # probability >= 1 - 1e-4 (Weissman et al. 2003).
    rng = np.random.default_rng(3)
    n, k, vocab = 1_000_000, 4, 16
    p_row = rng.dirichlet(np.ones(vocab))
    q_row = rng.dirichlet(np.ones(vocab))
    p = np.broadcast_to(p_row, (n, k + 1, vocab))
    q = np.broadcast_to(q_row, (n, k, vocab))
    drafts = rng.choice(vocab, size=(n, k), p=q_row)
    out = verify(drafts, q, p, rng.random((n, k + 1)))
    first = goodness_of_fit(out.tokens[:, 0], p_row)
    assert first.passed and first.tv < 0.005, str(first)
    alpha = float(np.minimum(p_row, q_row).sum())
    geometric = [alpha**i * (1 - alpha) for i in range(k)] + [alpha**k]
    lengths = goodness_of_fit(out.num_accepted, np.array(geometric))
    assert lengths.passed, str(lengths)


def test_geometric_law_matches_the_exact_toolkit():
    from fractions import Fraction

    law = accepted_length_law(Fraction(1, 3), 4)
    assert law == [Fraction(2, 3) * Fraction(1, 3) ** i for i in range(4)] + [Fraction(1, 81)]


# --- exact properties (Hypothesis) -------------------------------------------------------

def _law(values: list[int]) -> np.ndarray:
    arr = np.array(values, dtype=np.float64)
    return arr / arr.sum()


laws = st.lists(st.integers(0, 4), min_size=4, max_size=4).filter(lambda v: sum(v) > 0)


@settings(max_examples=300, deadline=None)
@given(p_rows=st.lists(laws, min_size=3, max_size=3), q_rows=st.lists(laws, min_size=2, max_size=2),
       picks=st.lists(st.integers(0, 3), min_size=2, max_size=2),
       u=st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1 - 2**-53]), min_size=3, max_size=3),
       deterministic=st.booleans())
def test_properties_on_small_exact_laws(p_rows, q_rows, picks, u, deterministic):
    """Zeros, p = q, disjoint supports, one-hot q, u exactly at thresholds (u * q == p)."""
    p = np.stack([_law(r) for r in p_rows])[None]  # [1, 3, 4]
    q = np.stack([_law(r) for r in q_rows])[None]  # [1, 2, 4]
    if deterministic:
        q = np.eye(4)[np.array(picks)][None]
    drafts = np.array([[pk if q[0, i, pk] > 0 else int(np.argmax(q[0, i])) for i, pk in enumerate(picks)]])
    out = verify(drafts, None if deterministic else q, p, np.array([u]))
    _well_formed(out.tokens, out.num_accepted, drafts, p)
    n = int(out.num_accepted[0])
    for i in range(n):  # accepted: strictly u * q(x) < p(x)
        assert u[i] * q[0, i, drafts[0, i]] < p[0, i, drafts[0, i]]
    if n < 2:  # the first rejected one failed the strict test (u = p/q rejects)
        assert not u[n] * q[0, n, drafts[0, n]] < p[0, n, drafts[0, n]]


@pytest.mark.parametrize("u0", [0.0, 0.5, 1 - 2**-53])
def test_zero_target_probability_is_never_accepted(u0):
    p = np.array([[[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]]])
    q = np.array([[[1.0, 0.0, 0.0]]])
    out = verify(np.array([[0]]), q, p, np.array([[u0, 0.3]]))
    assert int(out.num_accepted[0]) == 0 and int(out.tokens[0, 0]) != 0
    det = verify(np.array([[0]]), None, p, np.array([[0.0, 0.3]]))
    assert int(det.num_accepted[0]) == 0 and int(det.tokens[0, 0]) != 0


def test_p_equals_q_accepts_everything_and_disjoint_accepts_nothing():
    rng = np.random.default_rng(4)
    law = rng.dirichlet(np.ones(8), size=(500, 4))
    drafts = np.array([[rng.choice(8, p=law[b, i]) for i in range(3)] for b in range(500)])
    u = rng.random((500, 4))
    same = verify(drafts, law[:, :3], law, u)
    assert np.all(same.num_accepted == 3)
    q = np.zeros((500, 3, 8))
    q[:, :, :4] = 0.25
    p = np.zeros((500, 4, 8))
    p[:, :, 4:] = 0.25
    disjoint = verify(drafts % 4, q, p, u)
    assert np.all(disjoint.num_accepted == 0) and np.all(disjoint.tokens[:, 0] >= 4)


def test_zero_residual_mass_falls_back_to_p():
    # q >= p everywhere in floating point (q = p + 2^-50 on x): rejection is possible
    # but the residual max(0, p - q) is empty, so the final token comes from p.
    p = np.array([[[0.5, 0.5], [0.5, 0.5]]])
    q = np.array([[[0.5 + 2**-50, 0.5]]])
    out = verify(np.array([[0]]), q, p, np.array([[1 - 2**-53, 0.75]]))
    assert int(out.num_accepted[0]) == 0 and int(out.tokens[0, 0]) == 1


def test_inputs_are_not_modified():
    rng = np.random.default_rng(5)
    args = _case(rng, 50, 3, 6)
    copies = [a.copy() for a in args]
    verify(*args)
    assert all(np.array_equal(a, c) for a, c in zip(args, copies, strict=True))


# --- bad input ---------------------------------------------------------------------------

def _good():
    return _case(np.random.default_rng(6), 2, 3, 5)


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda d, q, p, u: (d, q, np.where(p > 0.2, np.nan, p), u), "target_probs: expected finite"),
    (lambda d, q, p, u: (d, q, p, u + 1.0), r"uniforms: expected values in \[0, 1\)"),
    (lambda d, q, p, u: (d, q, p, -u), r"uniforms: expected values in \[0, 1\)"),
    (lambda d, q, p, u: (d, -q, p, u), "draft_probs: expected non-negative"),
    (lambda d, q, p, u: (d, q, p * 0, u), "target_probs: expected positive, finite total mass"),
    (lambda d, q, p, u: (d + 5, q, p, u), r"draft_tokens: expected token ids in \[0, 5\)"),
    (lambda d, q, p, u: (d, q[..., :4], p, u), r"draft_probs: expected shape \[2, 3, 5\]"),
    (lambda d, q, p, u: (d[:, :0], q[:, :0], p[:, :1], u[:, :1]), "K >= 1"),
    (lambda d, q, p, u: (d, q, p[:, :3], u), r"draft_tokens: expected shape \[2, 2\]"),
    (lambda d, q, p, u: (d, q, p, u[:, :2]), r"uniforms: expected shape \[2, 4\]"),
    (lambda d, q, p, u: (d, np.where(np.arange(5) == d[..., None], 0.0, q), p, u), r"q\(x\) > 0"),
])
def test_bad_input_names_the_argument(mutate, match):
    with pytest.raises(ValueError, match=match):
        verify(*mutate(*_good()))


def test_bad_dtypes():
    d, q, p, u = _good()
    with pytest.raises(TypeError, match="draft_tokens: expected an integer array"):
        verify(d.astype(np.float64), q, p, u)
    with pytest.raises(TypeError, match="target_probs: expected a real floating-point"):
        verify(d, q, p.astype(np.int64), u)
    with pytest.raises(TypeError, match="one library"):
        verify(torch.from_numpy(d), q, p, u)


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_a_row_with_draft_length_l_is_verified_as_a_round_of_k_equal_l(rule: str, deterministic: bool):
    """Per-row draft length: row b with L_b drafts gets exactly the verdict of a K = L_b round
    on the same uniforms (its first L_b acceptance draws and the final draw), for L_b = 0..K.
    L_b = 0 is a plain step: the final token is drawn from p_0."""
    from specsample.core.sample import sample
    from specsample.core.verifiers import get_verifier

    rule_fn = get_verifier(rule)
    rng = np.random.default_rng(7)
    k = 3
    for _ in range(40):
        drafts, q, p, u = _case(rng, 8, k, 6)
        probs = None if deterministic else q
        lengths = rng.integers(0, k + 1, size=8)
        got = rule_fn(drafts, probs, p, u, draft_lengths=lengths)
        for b, ell in enumerate(lengths.tolist()):
            if ell == 0:
                want_tokens, want_n = [int(sample(p[b, 0], u[b, k]))], 0
            else:
                one = rule_fn(drafts[b:b + 1, :ell], None if probs is None else probs[b:b + 1, :ell],
                              p[b:b + 1, :ell + 1], np.concatenate([u[b:b + 1, :ell], u[b:b + 1, k:]], 1))
                want_tokens, want_n = one.tokens[0].tolist(), int(one.num_accepted[0])
            assert int(got.num_accepted[b]) == want_n
            assert got.tokens[b].tolist() == want_tokens + [-1] * (k + 1 - len(want_tokens))


def test_bad_draft_lengths_name_the_argument():
    drafts, q, p, u = _case(np.random.default_rng(0), 2, 3, 5)
    with pytest.raises(ValueError, match=r"draft_lengths: expected values in \[0, 3\], got range \[1, 4\]"):
        verify(drafts, q, p, u, draft_lengths=np.array([1, 4]))
    with pytest.raises(ValueError, match="draft_lengths: expected shape"):
        verify(drafts, q, p, u, draft_lengths=np.array([1, 2, 3]))
    with pytest.raises(TypeError, match="draft_lengths: expected an integer array"):
        verify(drafts, q, p, u, draft_lengths=np.array([1.0, 2.0]))
