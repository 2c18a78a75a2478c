"""SuffixTreeDrafter: trees of the continuations after every earlier occurrence of the suffix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specsample.drafters.suffix import SuffixTreeDrafter


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


@pytest.mark.parametrize(("kwargs", "match"), [({"remember": -1}, "remember: expected")])
def test_a_negative_memory_is_a_clear_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SuffixTreeDrafter(**kwargs)


def test_names_give_the_budget_and_the_memory() -> None:
    from specsample.drafters.suffix import REMEMBER, is_suffix_tree_name, suffix_tree

    assert (suffix_tree("suffix-tree:4x2").nodes, suffix_tree("suffix-tree:4x2").remember) == (4, 0)
    remembering = suffix_tree("suffix-tree:4x2+memory")
    assert (remembering.nodes, remembering.depth, remembering.remember) == (4, 2, REMEMBER)
    assert suffix_tree("suffix-tree+memory").remember == REMEMBER
    for bad in ("suffix-tree+mem", "suffix-tree:4+memory+memory", "suffix-treex"):
        assert not is_suffix_tree_name(bad) or bad.startswith("suffix-tree:")
        with pytest.raises(ValueError, match=r"optionally ending in '\+memory'"):
            suffix_tree(bad)
    assert is_suffix_tree_name("suffix-tree:4x2+memory") and not is_suffix_tree_name("suffix-tree-ft/")


def _start(drafter: SuffixTreeDrafter, rows: list[list[int]]) -> None:
    """A call's start, then one proposal per row (what the call leaves in the memory)."""
    width = max(len(r) for r in rows)
    tokens = np.array([r + [0] * (width - len(r)) for r in rows])
    lengths = np.array([len(r) for r in rows])
    drafter.start(tokens, lengths, width)
    drafter.propose_tree(tokens, lengths, drafter.nodes, drafter.depth)


def test_memory_matches_earlier_calls_and_is_fixed_within_a_call() -> None:
    drafter = SuffixTreeDrafter(nodes=4, depth=3, remember=2)
    _start(drafter, [[5, 6, 7, 8, 9, 1], [2, 2, 3]])  # the first call: nothing remembered yet
    assert drafter.memory == []
    _start(drafter, [[4, 4, 4, 4]])  # the second call remembers the first call's rows
    assert [m.tolist() for m in drafter.memory] == [[5, 6, 7, 8, 9, 1], [2, 2, 3]]
    # A context ending in "6 7" drafts what followed it in the earlier sequence, which the
    # context alone cannot; the proposal itself changes nothing until the next call starts.
    out = drafter.propose_tree(np.array([[0, 6, 7]]), np.array([3]), 4, 3)
    assert out.tokens[0, :int(out.sizes[0])].tolist() == [8, 9, 1]
    assert [m.tolist() for m in drafter.memory] == [[5, 6, 7, 8, 9, 1], [2, 2, 3]]
    assert int(SuffixTreeDrafter().propose_tree(np.array([[0, 6, 7]]), np.array([3]), 4, 3).sizes[0]) == 0
    _start(drafter, [[1, 2]])  # keeps the latest `remember` sequences (latest call first)
    assert [m.tolist() for m in drafter.memory] == [[0, 6, 7], [5, 6, 7, 8, 9, 1]]
    _start(drafter, [[0, 6, 7]])
    assert [m.tolist() for m in drafter.memory] == [[1, 2], [0, 6, 7]]
    _start(drafter, [[3]])  # a repeated sequence moves up rather than being dropped
    assert [m.tolist() for m in drafter.memory] == [[0, 6, 7], [1, 2]]
    drafter.trees(np.array([[5, 5]]), np.array([2]), 4, 3)  # builds trees, remembers nothing
    _start(drafter, [[4]])
    assert [m.tolist() for m in drafter.memory] == [[3], [0, 6, 7]]


def test_a_repeated_request_drafts_the_earlier_output_and_stays_exact() -> None:
    # Greedy on a tiny float64 Llama: a prompt whose text does not repeat gets no tree on
    # the first call; the same prompt again drafts the first call's continuation, so it
    # takes far fewer rounds, and both equal plain greedy decoding.
    from specsample_backends.torch import HFModel
    from transformers import LlamaConfig, LlamaForCausalLM

    from specsample.core.params import SamplingParams
    from specsample.engine.generate import generate, generate_plain

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    target = HFModel(LlamaForCausalLM(config).eval().double())
    prompt = torch.tensor([[3, 17, 42, 8, 29, 51]])
    greedy = SamplingParams(temperature=0.0)
    plain = generate_plain(target, prompt, max_new_tokens=24, params=greedy)
    drafter = SuffixTreeDrafter(nodes=4, depth=4, remember=8)
    first = generate(target, drafter, prompt, max_new_tokens=24, params=greedy)
    second = generate(target, drafter, prompt, max_new_tokens=24, params=greedy)
    assert torch.equal(first.sequences, plain.sequences) and torch.equal(second.sequences, plain.sequences)
    assert second.metrics.rounds < first.metrics.rounds / 2, (first.metrics.rounds, second.metrics.rounds)
