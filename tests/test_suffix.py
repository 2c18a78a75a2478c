"""SuffixTreeDrafter: trees of the continuations after every earlier occurrence of the suffix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specsample.suffix import SuffixTreeDrafter


def _tree(context: list[int], nodes: int = 8, depth: int = 3, **kwargs: int) -> list[tuple[int, int]]:
    out = SuffixTreeDrafter(**kwargs).propose_tree(np.array([context]), np.array([len(context)]),
                                                   nodes, depth)
    size = int(out.sizes[0])
    return [(int(t), int(p)) for t, p in zip(out.tokens[0, :size], out.parents[0, :size], strict=True)]


def test_every_continuation_of_the_suffix_is_a_branch_most_frequent_first() -> None:
    # "9 1 2" occurs three times before the end: followed by 3 3, 4 5, 3 6.
    context = [9, 1, 2, 3, 3, 9, 1, 2, 4, 5, 9, 1, 2, 3, 6, 9, 1, 2]
    tree = _tree(context, nodes=8, depth=2)
    assert tree[0] == (3, -1)  # 2 of 3 matches continue with 3
    assert (4, -1) in tree
    children_of_3 = {t for t, p in tree if p == 0}
    assert children_of_3 == {3, 6}
    assert len(tree) == 5  # 3, 4, and 3 -> {3, 6}, 4 -> 5
    assert all(p < i for i, (_, p) in enumerate(tree))


def test_the_budget_keeps_the_likeliest_nodes_parents_first() -> None:
    context = [9, 1, 2, 3, 3, 9, 1, 2, 4, 5, 9, 1, 2, 3, 6, 9, 1, 2]
    tree = _tree(context, nodes=2, depth=3)
    # Best first: 3 (2/3 of the matches); then 4, "3 6" and "3 3" tie at 1/3, and the
    # latest match ("3 6") wins the tie.
    assert tree == [(3, -1), (6, 0)]


def test_no_match_is_an_empty_tree_and_rows_are_independent() -> None:
    drafter = SuffixTreeDrafter()
    tokens = torch.tensor([[5, 6, 7, 8, 0, 0], [1, 2, 1, 2, 1, 0]])
    out = drafter.propose_tree(tokens, torch.tensor([4, 5]), 4, 3)
    assert out.sizes.tolist()[0] == 0
    assert out.sizes.tolist()[1] > 0 and out.tokens.dtype == torch.int64
    alone = drafter.propose_tree(tokens[1:], torch.tensor([5]), 4, 3)
    assert torch.equal(alone.tokens[0], out.tokens[1]) and torch.equal(alone.parents[0], out.parents[1])


def test_a_continuation_into_the_end_repeats_with_the_match_period() -> None:
    # The latest "7" ended one step before the end: the copy repeats 8 7 8 ...
    assert _tree([7, 8, 7], nodes=3, depth=3, ngram_max=1) == [(8, -1), (7, 0), (8, 1)]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"ngram_min": 0}, "ngram_min: expected"), ({"ngram_max": 1, "ngram_min": 2}, "ngram_min: expected <="),
    ({"max_matches": 0}, "max_matches: expected"),
])
def test_bad_settings_are_clear_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SuffixTreeDrafter(**kwargs)


def test_bad_budgets_and_lengths_are_clear_errors() -> None:
    drafter = SuffixTreeDrafter()
    with pytest.raises(ValueError, match="nodes: expected"):
        drafter.propose_tree(np.array([[1, 2]]), np.array([2]), 0, 3)
    with pytest.raises(ValueError, match="depth: expected"):
        drafter.propose_tree(np.array([[1, 2]]), np.array([2]), 4, 0)
    with pytest.raises(ValueError, match=r"lengths: expected values in \[1, 2\]"):
        drafter.propose_tree(np.array([[1, 2]]), np.array([3]), 4, 2)


def test_a_one_token_match_earns_one_node_only() -> None:
    # Only the last token, 7, occurred before: a weak guess gets a one-node tree.
    assert _tree([5, 9, 7, 3, 7], nodes=8, depth=3) == [(3, -1)]
    assert len(_tree([5, 9, 7, 3, 7], nodes=8, depth=3, confident=1)) == 3
