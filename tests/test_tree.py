"""Tree rounds through a real forward: the tree mask, the path commit, and the output law.

On a tiny random Llama (V = 8, float64, so no float near-tie separates two exact
forwards): a tree forward gives each node the logits of its own path run as a chain;
committing a path leaves the cache a chain forward of the committed tokens would leave;
greedy output equals plain decoding; sampled output passes a two-sample test against
plain sampling on the first two tokens, n = 20,000 rows per method, alpha = 1e-4 (the
false-failure bound); at that n the test detects TV >= 0.04 (m <= 64 outcomes pooled).
The negative control verifies with a residual that keeps rejected siblings' mass (which
the exact checker shows to be wrong for deterministic candidates): it must fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from specsample_backends.torch import HFModel, loading
from transformers import LlamaConfig, LlamaForCausalLM

from specsample.bench import measure_cost_ratio
from specsample.core.cache import Cache
from specsample.core.params import SamplingParams
from specsample.core.protocols import TreeModel
from specsample.drafters.suffix import SuffixTreeDrafter
from specsample.engine.generate import generate, generate_plain
from specsample.engine.round import path_features
from specsample.engine.tree import generate_tree
from specsample.testing import broken, homogeneity

GREEDY, HOT = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)
ROWS = 20_000
PROMPT = [1, 5, 2, 7, 1, 5, 3, 1, 5, 2]  # "1 5" recurs: the suffix drafter finds trees


def tree_llama(seed: int = 0, *, fast: bool = True) -> HFModel:
    """The tiny random Llama of the tree tests (V = 8, float64), seeded."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return HFModel(LlamaForCausalLM(config).eval().double(), fast=fast)


@pytest.fixture(scope="module")
def target() -> HFModel:
    return tree_llama()


def _chain_logits(target: HFModel, tokens: list[int]) -> torch.Tensor:
    logits, _ = target.forward(torch.tensor([tokens]), target.new_cache(1, len(tokens)))
    return logits[0, -1]


def test_hf_model_is_a_tree_model(target: HFModel) -> None:
    assert isinstance(target, TreeModel)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "generic-path"])
def test_a_tree_forward_gives_each_node_its_paths_logits(fast: bool) -> None:
    model = tree_llama(1, fast=fast)
    context = [3, 1, 4, 1, 5]
    # Feed: the last committed token (5), then nodes with parents (feed indices).
    tokens = [5, 2, 6, 7, 2, 0, 3]
    parents = [-1, 0, 0, 1, 1, 2, 4]
    cache = model.new_cache(2, 16)
    _, cache = model.forward(torch.tensor([context[:-1], [0, *context[:-2]]]), cache)
    cache = cache.__class__(lengths=torch.tensor([4, 4]), capacity=16, buffers=cache.buffers)
    logits, after = model.forward_tree(torch.tensor([tokens, tokens]), torch.tensor([parents, parents]),
                                       cache)
    assert after.lengths.tolist() == [4 + len(tokens)] * 2
    for node in range(len(tokens)):
        path = _path(tokens, parents, node)
        want = _chain_logits(model, context[:-1] + path)
        torch.testing.assert_close(logits[0, node], want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "generic-path"])
def test_a_tree_forward_gives_each_node_its_paths_features(fast: bool) -> None:
    """`forward_tree_features`: the same logits as `forward_tree`, and each node's features
    those a chain forward of its path gives (what a draft head would read)."""
    model = tree_llama(2, fast=fast)
    context, tokens, parents = [3, 1, 4, 1], [5, 2, 6, 7, 0], [-1, 0, 0, 1, 2]
    logits, features, after = model.forward_tree_features(
        torch.tensor([tokens]), torch.tensor([parents]), _prefilled(model, context))
    assert after.lengths.tolist() == [len(context) + len(tokens)]
    plain, _ = model.forward_tree(torch.tensor([tokens]), torch.tensor([parents]), _prefilled(model, context))
    torch.testing.assert_close(logits, plain, rtol=0, atol=0)
    for node in range(len(tokens)):
        path = _path(tokens, parents, node)
        chain = torch.tensor([context + path])
        _, want, _ = model.forward_features(chain, model.new_cache(1, chain.shape[1]))
        torch.testing.assert_close(features[0, node], want[0, -1], rtol=0, atol=1e-10)
    # A negative control: a node's features are not its parent's.
    assert not torch.allclose(features[0, 3], features[0, 1], atol=1e-6)


def _path(tokens: list[int], parents: list[int], node: int) -> list[int]:
    """The tokens from the tree's root down to `node`."""
    path, at = [], node
    while at >= 0:
        path.insert(0, tokens[at])
        at = parents[at]
    return path


def _prefilled(model: HFModel, context: list[int]) -> Cache:
    _, cache = model.forward(torch.tensor([context]), model.new_cache(1, 16))
    return cache


def test_path_features_follow_each_rows_accepted_path() -> None:
    features = torch.arange(2 * 4 * 3, dtype=torch.float64).reshape(2, 4, 3)  # [B, 1 + W, F]
    path = torch.tensor([[1, 2], [-1, -1]])  # row 0 accepted nodes 1 then 2; row 1 none
    got = path_features(features, path)
    assert torch.equal(got[0], features[0, [0, 2, 3]])  # the last committed token, then the nodes
    assert torch.equal(got[1], features[1, [0, 0, 0]])  # past the path: column 0, never read
    assert torch.equal(path_features(features[:, :1], path[:, :0]), features[:, :1])  # a plain step


def test_committing_a_path_leaves_the_chain_cache(target: HFModel) -> None:
    context = [3, 1, 4, 1, 5]
    tokens = [5, 2, 6, 7, 2, 0]
    parents = [-1, 0, 0, 1, 2, 4]  # accepted path: feed nodes 2 (6), 4 (2), 5 (0)
    cache = target.new_cache(1, 16)
    _, cache = target.forward(torch.tensor([context[:-1]]), cache)
    _, cache = target.forward_tree(torch.tensor([tokens]), torch.tensor([parents]), cache)
    # Tree nodes (verify_tree's indices) 1, 3, 4 are feed indices 2, 4, 5.
    cache = target.commit_path(cache, torch.tensor([5]), torch.tensor([[1, 3, 4, -1]]))
    cache = cache.__class__(lengths=torch.tensor([8]), capacity=16, buffers=cache.buffers)
    logits, _ = target.forward(torch.tensor([[3]]), cache)
    want = _chain_logits(target, [*context, 6, 2, 0, 3])
    torch.testing.assert_close(logits[0, 0], want, rtol=0, atol=1e-10)


def test_commit_path_moves_only_what_is_out_of_place(target: HFModel) -> None:
    """A path already in place (a chain, a first sibling's hit, a miss) moves nothing; in a
    batch where another row's path moves, every row ends as a chain forward would leave it."""
    context = [3, 1, 4, 1, 5]
    tokens, parents = [5, 2, 6], [-1, 0, 0]  # the last token, then two sibling candidates
    ids = torch.tensor([context[:-1]] * 2)

    def tree_cache() -> Cache:
        _, cache = target.forward(ids, target.new_cache(2, 16))
        _, cache = target.forward_tree(torch.tensor([tokens] * 2), torch.tensor([parents] * 2), cache)
        return cache

    first = torch.tensor([5, 5])  # feed index 1 (node 0) sits at slot 5
    cache = tree_cache()
    before = [(k.clone(), v.clone()) for k, v in cache.buffers]
    kept = target.commit_path(cache, first, torch.tensor([[0], [-1]]))  # a hit on node 0; a miss
    assert all(torch.equal(k, k0) and torch.equal(v, v0)
               for (k, v), (k0, v0) in zip(kept.buffers, before, strict=True))
    # Row 0 keeps node 0 (token 2) in place, row 1 accepts node 1 (token 6): it moves.
    moved = target.commit_path(tree_cache(), first, torch.tensor([[0], [1]]))
    for row, token in ((0, 2), (1, 6)):
        one = [(k[row:row + 1], v[row:row + 1]) for k, v in moved.buffers]
        cache = Cache(lengths=torch.tensor([6]), capacity=16, buffers=tuple(one))
        logits, _ = target.forward(torch.tensor([[3]]), cache)
        want = _chain_logits(target, [*context, token, 3])
        torch.testing.assert_close(logits[0, 0], want, rtol=0, atol=1e-10)


def test_greedy_equals_plain_decoding(target: HFModel) -> None:
    ids = torch.tensor([PROMPT, [4, 4, 6, 1, 0, 4, 4, 6, 1, 0]])
    lengths = torch.tensor([10, 7])
    plain = generate_plain(target, ids, max_new_tokens=40, params=GREEDY, prompt_lengths=lengths)
    for nodes, depth in ((1, 1), (6, 3), (12, 5)):
        spec = generate_tree(target, SuffixTreeDrafter(nodes=nodes, depth=depth), ids, max_new_tokens=40,
                             params=GREEDY, prompt_lengths=lengths)
        assert torch.equal(spec.sequences, plain.sequences), (nodes, depth)
        assert spec.metrics.accepted > 0


def _first_tokens(target: HFModel, tree: bool, verifier=None) -> np.ndarray:  # type: ignore[no-untyped-def]
    ids = torch.tensor([PROMPT] * ROWS)
    if not tree:
        out = generate_plain(target, ids, max_new_tokens=2, params=HOT, seed=11)
    else:
        extra = {} if verifier is None else {"verifier": verifier}
        out = generate_tree(target, SuffixTreeDrafter(nodes=6, depth=3), ids, max_new_tokens=2, params=HOT,
                            seed=12, **extra)
    return out.sequences[:, len(PROMPT):len(PROMPT) + 2].numpy()


@pytest.mark.parametrize("rule", ["verify_tree", "negative-control"])
def test_sampled_output_follows_the_target_law(target: HFModel, rule: str) -> None:
    lying = rule == "negative-control"
    spec = _first_tokens(target, True, broken.tree_without_residual if lying else None)
    plain = _first_tokens(target, False)
    both = homogeneity(spec[:, 0] * 8 + spec[:, 1], plain[:, 0] * 8 + plain[:, 1])
    assert both.passed != lying, str(both)


def test_generate_runs_tree_rounds_for_a_tree_drafter(target: HFModel) -> None:
    ids = torch.tensor([PROMPT])
    drafter = loading.load_drafter("suffix-tree:6x3", target)
    assert isinstance(drafter, SuffixTreeDrafter) and (drafter.nodes, drafter.depth) == (6, 3)
    direct = generate_tree(target, drafter, ids, max_new_tokens=12, params=HOT, seed=3)
    for verifier in ("token", "block"):  # a tree has one rule whatever the chain rule is
        via = generate(target, drafter, ids, max_new_tokens=12, params=HOT, seed=3, verifier=verifier)
        assert torch.equal(via.sequences, direct.sequences)
    assert via.metrics.rounds < 12  # trees were accepted: fewer rounds than tokens
    with pytest.raises(ValueError, match="verifier: a tree drafter is verified by the tree rule"):
        generate(target, drafter, ids, max_new_tokens=4, verifier=broken.VERIFIERS["always-accept"])
    assert measure_cost_ratio(target, drafter, ids, HOT) > 0


def test_a_target_without_tree_forward_is_a_clear_error() -> None:
    from specsample_backends.reference import random_ngram

    model = random_ngram(8, order=2, seed=0)
    with pytest.raises(TypeError, match="target: expected a TreeModel"):
        generate(model, SuffixTreeDrafter(), np.array([PROMPT]), max_new_tokens=4)
