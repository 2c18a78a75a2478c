"""verify_tree: a chain is token-wise verification; sizes, paths, backends and bad input.

The output law itself is checked exactly in tests/test_proofs_exact.py (proofs/exact/tree.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specsample import verify, verify_tree
from specsample.core.verify_tree import tree_depth

RNG = np.random.default_rng(7)


def _laws(batch: int, rows: int, vocab: int, zeros: float = 0.3) -> np.ndarray:
    x = RNG.gamma(0.7, size=(batch, rows, vocab)) * (RNG.random((batch, rows, vocab)) > zeros)
    x[..., 0] += 1e-3  # every row keeps some mass
    return x / x.sum(-1, keepdims=True)


def _draw(q: np.ndarray) -> np.ndarray:
    cdf = q.cumsum(-1)
    u = RNG.random(q.shape[:-1])[..., None] * cdf[..., -1:]
    return np.minimum((cdf <= u).sum(-1), q.shape[-1] - 1)


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_chain_is_token_wise_verification(deterministic: bool) -> None:
    batch, k, vocab = 400, 4, 6
    q = _laws(batch, k, vocab)
    drafts = _draw(q)
    p = _laws(batch, k + 1, vocab)
    u = RNG.random((batch, k + 1))
    probs = None if deterministic else q
    chain = verify_tree(drafts, np.array([-1, 0, 1, 2]), probs, p, u)
    token = verify(drafts, probs, p, u)
    np.testing.assert_array_equal(chain.tokens, token.tokens)
    np.testing.assert_array_equal(chain.num_accepted, token.num_accepted)
    slots = np.arange(k)[None, :]
    np.testing.assert_array_equal(chain.path, np.where(slots < token.num_accepted[:, None], slots, -1))


def test_numpy_and_torch_agree_and_the_path_matches_the_tokens() -> None:
    parents = np.array([-1, -1, 0, 0, 1, 2])
    batch, vocab = 300, 5
    q = _laws(batch, 6, vocab)
    drafts = _draw(q)
    p = _laws(batch, 7, vocab)
    u = RNG.random((batch, 7))
    a = verify_tree(drafts, parents, q, p, u)
    b = verify_tree(*(torch.from_numpy(x) for x in (drafts, parents, q, p, u)))
    np.testing.assert_array_equal(a.tokens, b.tokens.numpy())
    np.testing.assert_array_equal(a.path, b.path.numpy())
    assert a.tokens.shape == (batch, 4) and a.path.shape == (batch, 3) == (batch, tree_depth(parents))
    assert {int(n) for n in a.num_accepted} == {0, 1, 2, 3}  # every depth is reached
    for row in range(batch):
        n, nodes = int(a.num_accepted[row]), a.path[row]
        assert list(a.tokens[row, :n]) == [int(drafts[row, j]) for j in nodes[:n]]
        assert all(parents[nodes[0]] == -1 for _ in [0] if n) and \
            all(parents[nodes[j]] == nodes[j - 1] for j in range(1, n))
        assert (nodes[n:] == -1).all() and (a.tokens[row, n + 1:] == -1).all()


def test_tree_sizes_verify_the_first_nodes_only() -> None:
    parents = np.array([-1, -1, 0, 1])
    batch, vocab = 200, 4
    q = _laws(batch, 4, vocab)
    drafts = _draw(q)
    p = _laws(batch, 5, vocab)
    u = RNG.random((batch, 5))
    for size in (0, 1, 2, 3):
        cut = verify_tree(drafts, parents, q, p, u, tree_sizes=np.full(batch, size), depth=2)
        if size == 0:
            np.testing.assert_array_equal(cut.num_accepted, 0)
            continue
        small_u = np.concatenate([u[:, :size], u[:, 4:]], axis=1)
        small = verify_tree(drafts[:, :size], parents[:size], q[:, :size], p[:, :size + 1], small_u, depth=2)
        np.testing.assert_array_equal(cut.tokens, small.tokens)


def test_a_duplicate_deterministic_sibling_is_never_accepted() -> None:
    batch, vocab = 500, 3
    drafts = np.tile(np.array([[1, 1]]), (batch, 1))
    p = _laws(batch, 3, vocab, zeros=0.0)
    u = RNG.random((batch, 3))
    out = verify_tree(drafts, np.array([-1, -1]), None, p, u)
    assert not (out.path == 1).any()
    assert (out.path == 0).any()


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"parents": np.array([-1, 1])}, ValueError, "parents: expected -1 .* or an earlier node"),
    ({"parents": np.array([-1, -2])}, ValueError, "parents: expected -1"),
    ({"parents": np.array([-1])}, ValueError, "parents"),
    ({"parents": np.array([-1.0, 0.0])}, TypeError, "parents: expected an integer array"),
    ({"uniforms": np.full((2, 3), 1.0)}, ValueError, "uniforms"),
    ({"uniforms": np.zeros((2, 2))}, ValueError, "uniforms"),
    ({"depth": 1}, ValueError, "depth: expected at least the tree's depth 2, got 1"),
    ({"tree_sizes": np.array([0, 3])}, ValueError, r"tree_sizes: expected values in \[0, 2\]"),
    ({"draft_tokens": np.array([[0, 5], [1, 1]])}, ValueError, "draft_tokens"),
])
def test_bad_input_is_a_clear_error(kwargs: dict, error: type, match: str) -> None:
    args = {"draft_tokens": np.array([[0, 1], [1, 1]]), "parents": np.array([-1, 0]),
            "draft_probs": np.full((2, 2, 3), 1 / 3), "target_probs": np.full((2, 3, 3), 1 / 3),
            "uniforms": np.full((2, 3), 0.5)}
    depth = kwargs.pop("depth", None)
    sizes = kwargs.pop("tree_sizes", None)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        verify_tree(**args, depth=depth, tree_sizes=sizes)


def test_a_node_its_law_cannot_have_drawn_is_refused() -> None:
    q = np.array([[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]]])
    with pytest.raises(ValueError, match=r"draft_probs: expected q\(x\) > 0"):
        verify_tree(np.array([[0, 2]]), np.array([-1, -1]), q, np.full((1, 3, 3), 1 / 3),
                    np.full((1, 3), 0.5))
