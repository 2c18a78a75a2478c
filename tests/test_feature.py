"""The feature-level draft head: the target's features flow through the round, the output law
stays the target's, and the draft is exactly the trained function.

Exactness is shown on a tiny random Llama (V = 8, float64, so no float near-tie separates
two exact forwards): greedy output equal to plain decoding token for token, and sampled
output tested against the exact first-token law and against plain sampling (two-sample
test on the first two tokens), n = 20,000 rows per method, alpha = 1e-4 per test (the
false-failure bound); at that n the tests detect TV >= 0.04 (m = 8 outcomes; 2 tau of the
Weissman bound). Two negative controls report a uniform q: for drafts sampled from the
head's own law, and for a head tree's deterministic candidates (verified as if drawn from
it); each moves the output law far beyond that, and the same tests must fail. A head that
fuses a lower layer's output with the top feature (EAGLE-3's input) is tested the same way,
with its own lying control.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from specsample_backends.torch import HFModel
from specsample_backends.torch.head import DraftHead, HeadModel
from specsample_backends.torch.head_file import fingerprint, fingerprints, load_head, save_head
from transformers import LlamaConfig, LlamaForCausalLM

from specsample.core.cache import Cache, rollback
from specsample.core.params import SamplingParams
from specsample.core.warp import warp
from specsample.drafters.confidence import HeadConfidenceTreeDrafter
from specsample.drafters.head import HeadDrafter, HeadTreeDrafter
from specsample.drafters.hybrid import FeatureHybridDrafter
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.engine.generate import generate, generate_plain, iterate
from specsample.engine.round import start
from specsample.engine.scheduler import Prior, Scheduler
from specsample.testing import goodness_of_fit, homogeneity

GREEDY, HOT = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)
ROWS = 20_000
PROMPT = [1, 5, 2, 7, 3]


def _tiny(vocab: int = 8, seed: int = 0, layers: int = 2) -> HFModel:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return HFModel(LlamaForCausalLM(config).eval().double())


@pytest.fixture(scope="module")
def target() -> HFModel:
    return _tiny()


class _Lying(HeadDrafter):
    """Negative control: samples from the head's law but reports a uniform q."""

    def laws(self, logits, params, *, check):  # type: ignore[no-untyped-def]
        law, _ = super().laws(logits, params, check=check)
        return law, torch.full_like(law, 1.0 / law.shape[-1])


class _LyingTree(HeadTreeDrafter):
    """Negative control: reports its deterministic candidates as draws from a uniform law."""

    def propose_from(self, state, tokens, lengths, nodes, depth):  # type: ignore[no-untyped-def]
        tree, state = super().propose_from(state, tokens, lengths, nodes, depth)
        vocab = int(self.head.vocab_size)
        probs = torch.full((*tree.tokens.shape, vocab), 1.0 / vocab, dtype=torch.float64)
        return dataclasses.replace(tree, probs=probs), state


@pytest.mark.parametrize("kind", ["hybrid", "auto", "auto-fan-out"])
def test_the_hybrids_over_a_head_decode_greedily_as_plain(target: HFModel, kind: str) -> None:
    drafter = _drafter(target, kind)
    ids = torch.tensor([PROMPT, [4, 4, 6, 1, 0]])
    plain = generate_plain(target, ids, max_new_tokens=30, params=GREEDY)
    spec = generate(target, drafter, ids, max_new_tokens=30, params=GREEDY, k=3)
    assert torch.equal(spec.sequences, plain.sequences)


def test_the_hybrid_reads_ragged_prompts_at_its_first_draft_as_a_prefilled_head(target: HFModel) -> None:
    """The hybrid over a head leaves the head's prefill to its first draft (a catch-up from
    position 0 over ragged rows); its drafts and q must be those of a head prefilled at the
    start."""
    head = HeadModel(DraftHead(target, vocab=torch.tensor([0, 1, 3, 4, 6])))
    ids = torch.tensor([[*PROMPT, 0, 0, 0, 0], [4, 4, 6, 1, 0, 2, 5, 3, 6]])
    lengths = torch.tensor([5, 9])
    hybrid, prefilled = FeatureHybridDrafter(HeadDrafter(head)), HeadDrafter(head)
    u = torch.rand(2, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for params in (GREEDY, HOT):  # fresh states: a proposal consumes the caches
        ours = start(target, hybrid, ids, lengths, capacity=24, stop_lengths=lengths + 8).draft_state
        theirs = start(target, prefilled, ids, lengths, capacity=24, stop_lengths=lengths + 8).draft_state
        assert ours.seen.tolist() == [0, 0]  # nothing fed yet
        mine = hybrid.propose(ours, ids, lengths, 3, params, u)
        want = prefilled.propose(theirs, ids, lengths, 3, params, u)
        assert mine.lengths is not None and mine.lengths.tolist() == [3, 3]  # both rows draft from the head
        assert torch.equal(mine.tokens, want.tokens)
        torch.testing.assert_close(mine.probs, want.probs)


@pytest.mark.parametrize("vocab", [None, torch.tensor([0, 2, 3, 5, 7])], ids=["all", "subset"])
@pytest.mark.parametrize("threshold", [None, 0.5])
def test_greedy_equals_plain_decoding(target: HFModel, vocab: torch.Tensor | None,
                                      threshold: float | None) -> None:
    drafter = HeadDrafter(HeadModel(DraftHead(target, vocab=vocab)), threshold=threshold)
    ids = torch.tensor([PROMPT, [4, 4, 6, 1, 0]])
    plain = generate_plain(target, ids, max_new_tokens=24, params=GREEDY)
    for k in (1, 3):
        spec = generate(target, drafter, ids, max_new_tokens=24, params=GREEDY, k=k)
        assert torch.equal(spec.sequences, plain.sequences)
        assert spec.metrics.alpha > 0  # the head's drafts are used, not all rejected


@pytest.mark.parametrize("vocab", [None, torch.tensor([0, 2, 3, 5, 7])], ids=["all", "subset"])
@pytest.mark.parametrize("nodes", [1, 3])
def test_a_head_tree_decodes_greedily_as_plain(target: HFModel, vocab: torch.Tensor | None,
                                               nodes: int) -> None:
    drafter = HeadTreeDrafter(HeadModel(DraftHead(target, vocab=vocab)), nodes=nodes)
    ids = torch.tensor([[*PROMPT, 0, 0], [4, 4, 6, 1, 0, 2, 5]])  # ragged
    lengths = torch.tensor([5, 7])
    plain = generate_plain(target, ids, max_new_tokens=24, params=GREEDY, prompt_lengths=lengths)
    spec = generate(target, drafter, ids, max_new_tokens=24, params=GREEDY, prompt_lengths=lengths)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.metrics.accepted > 0  # some candidate is the target's token
    assert spec.metrics.drafted == nodes * spec.metrics.row_rounds


def _shaken(target: HFModel, vocab: torch.Tensor | None = None, taps: tuple[int, ...] = (),
            layers: int = 1) -> HeadModel:
    """A head whose every weight is moved off its start (which copies the previous feature), so
    that a wrong feature, position or mask changes its output (with `taps`, its fuse too: a
    wrong tapped layer changes it as well; with `layers` > 1, every layer's K/V counts)."""
    torch.manual_seed(3)
    head = DraftHead(target, vocab=vocab, taps=taps, layers=layers)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return HeadModel(head)


def _grown_tree(target: HFModel, head: HeadModel) -> tuple[torch.Tensor, torch.Tensor, Cache, torch.Tensor]:
    """A tree grown as a drafter grows it after the prompt (a node reads its parent's feature
    from an earlier forward): the root's children 2 and 6, then the tree fed again with 4 below
    2. Returns the two forwards' logits, the cache after the second and the prompt's length."""
    drafter = HeadDrafter(head)
    ids, lengths = torch.tensor([PROMPT]), torch.tensor([len(PROMPT)])
    state = start(target, drafter, ids, lengths, capacity=16, stop_lengths=lengths + 4).draft_state
    buffer = torch.cat([ids, torch.zeros((1, 11), dtype=torch.int64)], 1)
    _, cache = drafter._feed(state, buffer, lengths)
    first, grown = head.forward_tree(torch.tensor([[2, 6]]), torch.tensor([[-1, -1]]), cache)
    second, grown = head.forward_tree(torch.tensor([[2, 6, 4]]), torch.tensor([[-1, -1, 0]]),
                                      rollback(grown, lengths))
    return first, second, grown, lengths


@pytest.mark.parametrize("layers", [1, 2])
def test_a_head_tree_forward_gives_each_node_its_paths_logits(target: HFModel, layers: int) -> None:
    # Grown as a drafter grows it: the root's children, then the tree fed again with a child
    # below the first; each node's logits equal a chain forward of its path, feature by feature.
    head = _shaken(target, layers=layers)
    first, second, grown, lengths = _grown_tree(target, head)
    cache = rollback(grown, lengths)
    for tokens, want in (([2], second[0, 0]), ([6], second[0, 1]), ([2, 4], second[0, 2])):
        for token in tokens:  # one at a time, as a chain drafts: each reads its predecessor's feature
            chain, cache = head.forward(torch.tensor([[token]]), cache)
        cache = rollback(cache, lengths)
        assert torch.allclose(chain[0, -1], want, atol=1e-12), tokens
    assert torch.allclose(first[0], second[0, :2], atol=1e-12)
    with pytest.raises(ValueError, match="parents: expected -1 or an earlier token's index"):
        head.forward_tree(torch.tensor([[2, 6]]), torch.tensor([[-1, 1]]), cache)
    with pytest.raises(TypeError, match="parents: expected an int64 tensor shaped like tokens"):
        head.forward_tree(torch.tensor([[2, 6]]), torch.tensor([-1, -1]), cache)


@pytest.mark.parametrize("vocab", [None, torch.tensor([0, 2, 3, 5, 7])], ids=["all", "subset"])
def test_a_grown_head_tree_decodes_greedily_as_plain(target: HFModel, vocab: torch.Tensor | None) -> None:
    drafter = HeadConfidenceTreeDrafter(_shaken(target, vocab), nodes=5, depth=3, branch=2)
    ids = torch.tensor([[*PROMPT, 0, 0], [4, 4, 6, 1, 0, 2, 5]])  # ragged
    lengths = torch.tensor([5, 7])
    plain = generate_plain(target, ids, max_new_tokens=24, params=GREEDY, prompt_lengths=lengths)
    spec = generate(target, drafter, ids, max_new_tokens=24, params=GREEDY, prompt_lengths=lengths)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.metrics.accepted > 0


def test_bad_grown_head_trees_are_clear_errors(target: HFModel) -> None:
    with pytest.raises(TypeError, match="head: expected a FeatureHead"):
        HeadConfidenceTreeDrafter(target, nodes=4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nodes: expected an int >= 1, got 0"):
        HeadConfidenceTreeDrafter(_shaken(target), nodes=0)
    drafter = HeadConfidenceTreeDrafter(_shaken(target), nodes=4)
    for call in (lambda: drafter.start(torch.tensor([PROMPT]), torch.tensor([5]), 16),
                 lambda: drafter.propose_tree(torch.tensor([PROMPT]), torch.tensor([5]), 4, 2)):
        with pytest.raises(TypeError, match="the head reads the target's features"):
            call()


def test_a_one_node_head_tree_drafts_what_the_chain_head_drafts(target: HFModel) -> None:
    """At T = 0 a chain head's one draft is its most likely token, as is a one-node tree's only
    candidate: with the round handing the tree drafter the accepted path's features, both
    draft alike in every round, so they accept the same drafts in the same rounds."""
    head = HeadModel(DraftHead(target, vocab=torch.tensor([0, 1, 3, 4, 6])))
    ids = torch.tensor([PROMPT, [4, 4, 6, 1, 0]])
    tree = generate(target, HeadTreeDrafter(head, nodes=1), ids, max_new_tokens=30, params=GREEDY)
    chain = generate(target, HeadDrafter(head), ids, max_new_tokens=30, params=GREEDY, k=1)
    assert torch.equal(tree.sequences, chain.sequences)
    assert tree.metrics.histogram == chain.metrics.histogram and tree.metrics.accepted > 0


class _NoTreeFeatures:
    """A target that scores trees but cannot return their features."""

    def __init__(self, model: HFModel) -> None:
        self.model, self.vocab_size = model, model.vocab_size
        self.new_cache, self.forward = model.new_cache, model.forward
        self.forward_features, self.forward_tree, self.commit_path = (
            model.forward_features, model.forward_tree, model.commit_path)


def test_a_fanning_out_hybrid_mixes_siblings_and_copied_chains_in_one_round(target: HFModel) -> None:
    """A row that copies proposes prompt lookup's chain, a row that uses the head its 3 likeliest
    next tokens as siblings (the tree `Proposal.parents` says so), in one round; the head's
    evidence is one trial per round."""
    head = HeadModel(DraftHead(target, vocab=torch.tensor([0, 1, 3, 4, 6])))
    hybrid = FeatureHybridDrafter(HeadDrafter(head),
                                  scheduler=Scheduler(cost_ratio=0.1, prior=Prior(0.5, 8.0), fan_out=3))
    ids = torch.tensor([[1, 2, 3, 4, 2, 3, 0, 0, 0, 0, 0, 0], [5, 7, 1, 6, 0, 2, 0, 0, 0, 0, 0, 0]])
    lengths = torch.tensor([6, 6])  # row 0 ends in a bigram it has seen: it copies [4, 2, 3]
    state = start(target, hybrid, ids, lengths, capacity=16, stop_lengths=lengths + 6).draft_state
    proposal = hybrid.propose(state, ids, lengths, 3, GREEDY, torch.zeros(2, 3, dtype=torch.float64))
    assert proposal.parents is not None and proposal.probs is None
    assert proposal.parents.tolist() == [[-1, 0, 1], [-1, -1, -1]]
    assert proposal.tokens[0].tolist() == [4, 2, 3]
    alone = HeadTreeDrafter(head, nodes=3)  # the same head, prefilled, on its own
    fresh = start(target, alone, ids, lengths, capacity=16, stop_lengths=lengths + 6).draft_state
    tree, _ = alone.propose_from(fresh, ids, lengths, 3, 1)
    assert proposal.tokens[1].tolist() == tree.tokens[1].tolist()
    assert len(set(tree.tokens[1].tolist())) == 3 and set(tree.tokens[1].tolist()) <= {0, 1, 3, 4, 6}
    assert proposal.lengths is not None and proposal.lengths.tolist() == [3, 3]
    assert proposal.state.drafted.tolist() == [0, 1]


def test_a_fanning_out_hybrids_rounds_file_its_hit_rate(target: HFModel) -> None:
    """Through `generate`: the rounds' evidence on the head's fan-out (what `auto` rates a
    round's width by, `Metrics.alpha_at`) is the hybrid's own per-row record, one trial per
    row and round, hits over trials."""
    head = HeadModel(DraftHead(target, vocab=torch.tensor([0, 1, 3, 4, 6])))
    hybrid = FeatureHybridDrafter(HeadDrafter(head),
                                  scheduler=Scheduler(cost_ratio=0.0, prior=Prior(0.9, 8.0), fan_out=2))
    ids = torch.tensor([[5, 7, 1, 6, 0, 2], [4, 1, 6, 3, 0, 1]])
    steps = list(iterate(target, hybrid, ids, max_new_tokens=12, k=2, params=GREEDY, seed=0))
    metrics, state = steps[-1].metrics, steps[-1].state.draft_state
    trials, hits = int(metrics.trials_at[2]), int(metrics.accepted_at[2])
    assert trials == int(state.trials.sum()) and hits == int(state.accepted.sum())
    assert trials >= 2 and 0 < hits < trials, (hits, trials)


def test_a_narrowed_rounds_copies_and_siblings_are_what_it_proposes(target: HFModel) -> None:
    """A round the scheduler narrows below the K it planned at files each row as what it
    proposes at the narrower width: a row whose match is short at K = 8 but whole at 2
    copies at 2, and is filed as a copy, not as a sibling of the head's fan-out. Checked
    round by round against the hybrid's own record of the rows that drafted from the head
    (255 rounds over 12 seeds; the plan at K = 8 alone misfiles 12 of them)."""
    head = HeadModel(DraftHead(target, vocab=torch.tensor([0, 1, 3, 4, 6])))
    ids = torch.tensor([[5, 7, 1, 6, 5, 7, 2, 5, 7, 1], [4, 1, 6, 3, 4, 1, 6, 2, 4, 1]])
    narrowed = 0
    for seed in range(12):
        gate = Scheduler(cost_ratio=0.0, prior=Prior(0.9, 8.0), fan_out=2,
                         width_cost=lambda batch, width: 1 + 0.05 * (width - 1))
        hybrid = FeatureHybridDrafter(HeadDrafter(head), scheduler=gate)
        filed, record = 0, torch.zeros(2, dtype=torch.int64)
        for step in iterate(target, hybrid, ids, max_new_tokens=24, k=8,
                            params=SamplingParams(temperature=1.0), seed=seed):
            trials = step.state.draft_state.trials
            now = sum(step.metrics.trials_at)
            assert now - filed == int(((trials - record) * step.result.active).sum()), (seed, step.index)
            filed, record = now, trials.clone()
            narrowed += 0 < step.k < 8
    assert narrowed >= 100, narrowed


def test_auto_fans_a_head_out_as_its_card_and_the_verify_cost_rate_fastest(target: HFModel) -> None:
    """`auto` over a head whose card gives fan-out hit rates takes the fan-out m that
    `fastest_fan_out` rates fastest from c and the verify's cost, and starts its rows from
    hits[m - 1]; without hit rates it takes `HEAD_FAN_OUT` and the head's alpha."""
    from specsample.api.draft_names import compose_drafter
    from specsample.drafters.model import DraftRating
    from specsample.engine.scheduler import HEAD_FAN_OUT

    head = HeadModel(DraftHead(target, vocab=torch.tensor([0, 1, 3, 4, 6])))
    drafter = HeadDrafter(head, rating=DraftRating(prior_alpha=0.3))

    def auto(step: float) -> tuple[int, Prior]:
        chosen = compose_drafter("auto:head", lambda name: drafter, default_model="head", cost=lambda d: 0.1,
                                 width_cost=lambda batch, width: 1 + step * (width - 1))
        assert isinstance(chosen, FeatureHybridDrafter) and isinstance(chosen.scheduler, Scheduler)
        assert chosen.fan_out == chosen.scheduler.fan_out
        return chosen.fan_out, chosen.scheduler.prior

    assert auto(0.0) == (HEAD_FAN_OUT, Prior(0.3, 8.0))
    drafter = HeadDrafter(head, rating=DraftRating(prior_alpha=0.3, fan_out_hits=(0.36, 0.50, 0.60, 0.65)))
    # 1.65 / 1.1 at m = 4; 1.5 / 1.3 at m = 2 (1.6 / 1.4 at 3)
    assert auto(0.0) == (4, Prior(0.65, 8.0))
    assert auto(0.1) == (2, Prior(0.50, 8.0))


def test_head_tree_names_are_checked(target: HFModel) -> None:
    from specsample_backends.torch import loading

    with pytest.raises(ValueError, match="expected 'head-tree' or 'head-tree:N' with N an int"):
        loading.load_drafter("head-tree:x", target)
    with pytest.raises(ValueError, match="a head drafts only for the target it was trained on"):
        loading.load_drafter("head-tree:2", target)  # the shipped head is SmolLM2's


def test_bad_head_trees_are_clear_errors(target: HFModel) -> None:
    head = HeadModel(DraftHead(target, vocab=torch.tensor([0, 2, 3])))
    with pytest.raises(ValueError, match="nodes: expected at most the head's 3 proposable ids, got 4"):
        HeadTreeDrafter(head, nodes=4)
    with pytest.raises(ValueError, match="nodes"):
        HeadTreeDrafter(head, nodes=0)
    with pytest.raises(TypeError, match="head: expected a FeatureHead"):
        HeadTreeDrafter(target)  # type: ignore[arg-type]
    drafter = HeadTreeDrafter(head, nodes=2)
    ids, lengths = torch.tensor([PROMPT]), torch.tensor([5])
    for call in (lambda: drafter.start(ids, lengths, 8), lambda: drafter.advance(None, lengths),
                 lambda: drafter.propose_tree(ids, lengths, 2, 1)):
        with pytest.raises(TypeError, match="run it through the core round"):
            call()
    with pytest.raises(TypeError, match="target: a HeadTreeDrafter reads the target's features: expected a "
                                        "TreeModel with forward_tree_features"):
        generate(_NoTreeFeatures(target), drafter, ids, max_new_tokens=4, params=GREEDY)  # type: ignore[arg-type]


def test_a_committed_tree_path_moves_every_layers_keys(target: HFModel) -> None:
    """A two-layer head after a tree forward and the commit of one path drafts on as a head that
    fed that path as a chain: each layer's K/V (and the features) moved into place."""
    head = _shaken(target, layers=2)
    _, _, tree, lengths = _grown_tree(target, head)
    tree = head.commit_path(rollback(tree, lengths + 2), lengths, torch.tensor([[0, 2]]))  # 2 then 4
    after, tree = head.forward(torch.tensor([[5]]), tree)
    chain = rollback(tree, lengths)
    for token in (2, 4, 5):
        want, chain = head.forward(torch.tensor([[token]]), chain)
    torch.testing.assert_close(after[0, -1], want[0, -1], atol=1e-12, rtol=0)


@pytest.mark.parametrize("vocab", [None, torch.tensor([0, 2, 3, 5, 7])], ids=["all", "subset"])
def test_a_two_layer_head_decodes_greedily_as_plain_and_reloads_with_its_layers(
        tmp_path, target: HFModel, vocab: torch.Tensor | None) -> None:  # type: ignore[no-untyped-def]
    head = _shaken(target, vocab, layers=2)
    assert head.head.layers == 2 and len(head.stack.layers) == 2
    ids = torch.tensor([[*PROMPT, 0, 0], [4, 4, 6, 1, 0, 2, 5]])  # ragged
    lengths = torch.tensor([5, 7])
    plain = generate_plain(target, ids, max_new_tokens=24, params=GREEDY, prompt_lengths=lengths)
    for drafter in (HeadDrafter(head), HeadConfidenceTreeDrafter(head, nodes=4, depth=3, branch=2)):
        spec = generate(target, drafter, ids, max_new_tokens=24, params=GREEDY, prompt_lengths=lengths, k=3)
        assert torch.equal(spec.sequences, plain.sequences)
    save_head(head.head, tmp_path / "two.safetensors", fingerprints(target))
    loaded = load_head(tmp_path / "two.safetensors", target)
    assert loaded.layers == 2
    for mine, theirs in zip(loaded.state_dict().values(), head.head.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)


def _first_tokens(target: HFModel, drafter: Any, length: int) -> np.ndarray:
    ids = torch.tensor([PROMPT] * ROWS)
    if drafter is None:
        out = generate_plain(target, ids, max_new_tokens=length, params=HOT, seed=11)
    else:
        out = generate(target, drafter, ids, max_new_tokens=length, params=HOT, k=3, seed=12)
    return out.sequences[:, len(PROMPT):len(PROMPT) + length].numpy()


def _drafter(target: HFModel, kind: str) -> Any:
    if kind.startswith("fused"):  # a shaken head fusing layer 0 with the top feature
        fused = _shaken(target, torch.tensor([0, 1, 3, 4, 6]), taps=(0,))
        return _Lying(fused) if kind.endswith("negative-control") else HeadDrafter(fused)
    if kind == "two-layers":  # a shaken head of two layers, as a grown tree
        return HeadConfidenceTreeDrafter(_shaken(target, layers=2), nodes=4, depth=3, branch=2)
    head = HeadModel(DraftHead(target, vocab=torch.tensor([0, 1, 3, 4, 6])))
    if kind == "negative-control":
        return _Lying(head)
    if kind == "tree":  # the head's three most likely tokens as siblings
        return HeadTreeDrafter(head, nodes=3)
    if kind == "tree-negative-control":
        return _LyingTree(head, nodes=3)
    if kind == "grown":  # trees of 4 nodes over 3 levels grown by the head's confidence
        return HeadConfidenceTreeDrafter(head, nodes=4, depth=3, branch=2)
    if kind == "hybrid":  # prompt lookup where the context repeats (often, at V = 8), the head elsewhere
        return FeatureHybridDrafter(HeadDrafter(head))
    if kind == "auto":  # ... and the head only where Thm 3.8 predicts a gain at c = 0.3
        return FeatureHybridDrafter(HeadDrafter(head, threshold=0.5),
                                    scheduler=Scheduler(cost_ratio=0.3, prior=Prior(0.5, 8.0)))
    if kind == "auto-fan-out":  # ... the head's 3 likeliest tokens as siblings, copies as chains
        return FeatureHybridDrafter(HeadDrafter(head),
                                    scheduler=Scheduler(cost_ratio=0.1, prior=Prior(0.5, 8.0), fan_out=3))
    return HeadDrafter(head)


@pytest.mark.parametrize("kind", ["head", "hybrid", "auto", "tree", "grown", "auto-fan-out", "fused",
                                  "two-layers", "negative-control", "tree-negative-control",
                                  "fused-negative-control"])
def test_sampled_output_follows_the_target_law(target: HFModel, kind: str) -> None:
    lying = kind.endswith("negative-control")
    if kind.startswith("fused"):  # a fused head taps its target: its own copy, not the shared one
        target = _tiny()
    drafter = _drafter(target, kind)
    spec, plain = _first_tokens(target, drafter, 2), _first_tokens(target, None, 2)
    logits, _ = target.forward(torch.tensor([PROMPT]), target.new_cache(1, len(PROMPT)))
    exact = warp(logits[0, -1], HOT).numpy()
    fit = goodness_of_fit(spec[:, 0], exact)
    both = homogeneity(spec[:, 0] * 8 + spec[:, 1], plain[:, 0] * 8 + plain[:, 1])
    if lying:
        assert not (fit.passed and both.passed), (str(fit), str(both))
    else:
        assert fit.passed, str(fit)
        assert both.passed, str(both)


@pytest.mark.parametrize(("taps", "layers"), [((), 1), ((0,), 1), ((), 2)],
                         ids=["top", "fused", "two-layers"])
def test_training_features_are_the_drafting_function(target: HFModel, taps: tuple[int, ...],
                                                      layers: int) -> None:
    # Teacher forcing with the target's features gives the logits the drafter computes.
    target = _tiny() if taps else target  # a fused head taps its target
    head = DraftHead(target, taps=taps, layers=layers)
    with torch.no_grad():
        head.fc.weight.normal_(0, 0.2)  # not the identity start: a generic head
        if head.fuse is not None:
            head.fuse.weight.normal_(0, 0.2)
        for extra in head.more:  # its residual branches off zero: the layer counts
            for name in ("o", "down"):
                extra.linears[name].weight.normal_(0, 0.2)
    x = torch.tensor([[3, 4, 5, 6, 7, 1, 2]])
    _, features, _ = target.forward_features(x, target.new_cache(1, 8))
    previous = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
    with torch.no_grad():
        trained = head.logits(head.features(x, previous))
    model = HeadModel(head)
    cache = model.with_features(model.new_cache(1, 8), features, torch.tensor([0]), torch.tensor([7]))
    drafted, _ = model.forward(x, cache)
    torch.testing.assert_close(drafted, trained, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("taps", "layers"), [((), 1), ((0,), 1), ((), 2)],
                         ids=["top", "fused", "two-layers"])
def test_unrolled_training_steps_are_what_drafting_computes(target: HFModel, taps: tuple[int, ...],
                                                            layers: int) -> None:
    # Training-time test: step j at position t must be the feature a draft j + 1 deep computes
    # there, i.e. the head fed the target's features up to t - j and its own after that, one
    # draft step at a time; a wrong mask or a wrong previous feature breaks the equality.
    target = _tiny() if taps else target  # a fused head taps its target
    model = _shaken(target, taps=taps, layers=layers)
    head = model.head
    x = torch.tensor([[*PROMPT, 3, 6, 1]])
    width = int(x.shape[1])
    _, features, _ = target.forward_features(x, target.new_cache(1, width))
    previous = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
    with torch.no_grad():
        steps = head.unrolled(x, previous, 3)
    torch.testing.assert_close(steps[0], head.features(x, previous).detach(), atol=1e-10, rtol=0)
    for j in range(3):
        for t in range(j, width):
            cache = model.with_features(model.new_cache(1, width + 1), features[:, :t - j],
                                        torch.tensor([0]), torch.tensor([t - j]))
            _, cache = model.forward(x[:, :t - j + 1], cache)
            for i in range(t - j + 1, t + 1):
                _, cache = model.forward(x[:, i:i + 1], cache)
            drafted = cache.buffers[1][0, t]
            torch.testing.assert_close(drafted, steps[j][0, t], atol=1e-10, rtol=0, msg=f"step {j} at {t}")
    with pytest.raises(ValueError, match="steps: expected an int >= 1, got 0"):
        head.unrolled(x, previous, 0)


def test_forward_features_feed_the_output_head(target: HFModel) -> None:
    x = torch.tensor([[3, 4, 5], [1, 1, 2]])
    for model in (target, HFModel(target.module, fast=False)):
        logits, _ = model.forward(x, model.new_cache(2, 4))
        again, features, _ = model.forward_features(x, model.new_cache(2, 4))
        assert torch.equal(logits, again)
        with torch.no_grad():
            torch.testing.assert_close(target.module.lm_head(features.clone()), logits)


def test_a_head_for_another_target_is_refused(tmp_path, target: HFModel) -> None:  # type: ignore[no-untyped-def]
    head = DraftHead(target, vocab=torch.tensor([1, 2, 3]))
    save_head(head, tmp_path / "h.safetensors", {"target_fingerprint": fingerprint(target)})
    loaded = load_head(tmp_path / "h.safetensors", target)
    assert torch.equal(loaded.vocab, head.vocab)
    perturbed = _tiny()
    with torch.no_grad():
        perturbed.module.model.layers[0].mlp.down_proj.weight[0, 0] += 1e-3
    with pytest.raises(ValueError, match=r"was trained for target .* a head drafts only for the target"):
        load_head(tmp_path / "h.safetensors", perturbed)
    whole = (tmp_path / "h.safetensors").read_bytes()
    (tmp_path / "h.safetensors").write_bytes(b"x" + whole[1:])
    with pytest.raises(ValueError, match="are not the ones its card describes"):
        load_head(tmp_path / "h.safetensors", target)
    (tmp_path / "h.safetensors").write_bytes(whole[: len(whole) // 2])  # an interrupted copy
    with pytest.raises(ValueError, match=rf"are not the ones its card describes \(a truncated, corrupted or "
                                         rf"replaced file of {len(whole) // 2} bytes\)"):
        load_head(tmp_path / "h.safetensors", target)


def test_bad_heads_and_uses_are_clear_errors(target: HFModel) -> None:
    with pytest.raises(ValueError, match="vocab: expected a non-empty 1-D set of distinct token ids"):
        DraftHead(target, vocab=torch.tensor([], dtype=torch.int64))
    with pytest.raises(ValueError, match=r"vocab: expected .* in \[0, 8\)"):
        DraftHead(target, vocab=torch.tensor([1, 9]))
    with pytest.raises(ValueError, match="distinct"):
        DraftHead(target, vocab=torch.tensor([1, 1]))
    for layers in (0, 1.0, True):
        with pytest.raises(ValueError, match=rf"layers: expected an int >= 1 \(the head's decoder layers\), "
                                             rf"got {layers!r}"):
            DraftHead(target, layers=layers)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="head: expected a FeatureHead"):
        HeadDrafter(target)  # type: ignore[arg-type]
    drafter = HeadDrafter(HeadModel(DraftHead(target)))
    with pytest.raises(TypeError, match="run it through the core round"):
        drafter.start(torch.tensor([PROMPT]), torch.tensor([5]), 8)

    class Plain:  # a Model without forward_features
        vocab_size = target.vocab_size
        new_cache, forward = target.new_cache, target.forward

    with pytest.raises(TypeError, match="target: a HeadDrafter reads the target's features"):
        start(Plain(), drafter, torch.tensor([PROMPT]), torch.tensor([5]), capacity=12,  # type: ignore[arg-type]
              stop_lengths=torch.tensor([9]))
    # Drafters that do not read features never ask for them.
    assert generate(Plain(), PromptLookupDrafter(), torch.tensor([PROMPT]), max_new_tokens=3,  # type: ignore[arg-type]
                    params=GREEDY).sequences.shape == (1, 8)


def test_head_files_load_by_name_with_a_threshold(tmp_path, target: HFModel) -> None:  # type: ignore[no-untyped-def]
    from specsample_backends.torch import loading

    save_head(DraftHead(target), tmp_path / "h.safetensors", {"target_fingerprint": fingerprint(target)})
    drafter = loading.load_drafter(f"head:{tmp_path / 'h.safetensors'}@0.4", target)
    assert isinstance(drafter, HeadDrafter) and drafter.threshold == 0.4
    hybrid = loading.load_drafter(f"hybrid:head:{tmp_path / 'h.safetensors'}", target)
    assert isinstance(hybrid, FeatureHybridDrafter)
    auto = loading.load_drafter(f"auto:head:{tmp_path / 'h.safetensors'}", target)  # c measured with features
    assert isinstance(auto, FeatureHybridDrafter) and auto.scheduler is not None


class _Unsupported(HeadModel):
    """The same head, without stating its support: the drafter warps all V logits."""

    @property
    def support(self) -> None:
        return None


@pytest.mark.parametrize("params", [HOT, SamplingParams(temperature=0.7, top_p=0.8), GREEDY],
                         ids=["t1", "top-p", "greedy"])
def test_a_subset_head_drafts_over_its_support_as_over_all_ids(target: HFModel,
                                                               params: SamplingParams) -> None:
    # Warping and sampling the 5 supported ids gives the tokens of the full warp (whose other
    # logits are -inf) and the same q, 0 off the support.
    vocab = torch.tensor([0, 1, 3, 4, 6])
    head = DraftHead(target, vocab=vocab)
    subset, full = HeadDrafter(HeadModel(head)), HeadDrafter(_Unsupported(head))
    assert torch.equal(subset.support, vocab) and full.support is None
    ids = torch.tensor([PROMPT, [4, 4, 6, 1, 0]] * 4)
    a, b = (generate(target, d, ids, max_new_tokens=12, params=params, k=3, seed=5) for d in (subset, full))
    assert torch.equal(a.sequences, b.sequences)
    assert a.metrics.accepted == b.metrics.accepted > 0


def test_the_tree_sampler_refuses_a_head(target: HFModel) -> None:
    # It computes laws per prefix without the target's features: a head's q would be wrong.
    from specsample.testing import tree_samples

    drafter = HeadDrafter(HeadModel(DraftHead(target)))
    with pytest.raises(TypeError, match="sample through the engine"):
        tree_samples(target, drafter, torch.tensor([PROMPT]), n=10, k=2, params=HOT, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["head", "head:v1", "head-tree", "grown-tree:6x3", "grown-tree"])
def test_the_shipped_head_drafts_for_smollm2_and_decodes_greedily_as_plain(name: str) -> None:
    from specsample_backends.torch import loading
    from specsample_backends.torch.head_file import SHIPPED

    from specsample.api.runner import encode_text

    assert SHIPPED.is_file() and SHIPPED.with_suffix(".json").is_file()
    smol = loading.load_target("smollm2")
    drafter = loading.load_drafter(name, smol)  # checks the card's fingerprint against smol
    tokenizer = loading.load_tokenizer("smollm2")
    for text in ("Write a haiku about the sea.", "What is 17 times 23?"):
        ids = torch.tensor([encode_text(tokenizer, text)])
        spec = generate(smol, drafter, ids, max_new_tokens=24, params=GREEDY, k=4)
        plain = generate_plain(smol, ids, max_new_tokens=24, params=GREEDY)
        a, b = spec.new_tokens(0), plain.new_tokens(0)
        if a != b:  # allowed only at a float32 near-tie of the target's two best logits
            at = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
            prefix = torch.cat([ids[0], torch.tensor(b[:at])])[None, :]
            logits, _ = smol.forward(prefix, smol.new_cache(1, prefix.shape[1]))
            assert abs(float(logits[0, -1, a[at]] - logits[0, -1, b[at]])) < 1e-3, (text, at)
        assert spec.metrics.accepted > 0


def test_each_shipped_version_is_a_file_with_its_card_and_other_names_are_paths() -> None:
    from specsample_backends.torch.head_file import SHIPPED, SHIPPED_VERSIONS, head_file

    assert set(SHIPPED_VERSIONS) == {"v1", "v2"} and SHIPPED in SHIPPED_VERSIONS.values()
    for version, path in SHIPPED_VERSIONS.items():
        assert head_file(version) == path and path.is_file() and path.with_suffix(".json").is_file()
    assert head_file("v1") != SHIPPED
    assert head_file("heads/mine.safetensors") == Path("heads/mine.safetensors")
    with pytest.raises(ValueError, match=r"head: expected a shipped version \(v1, v2\) or a head "
                                         r"file's path, got ''"):
        head_file("")


@pytest.mark.slow
def test_the_shipped_head_loads_for_a_bfloat16_target_and_an_old_card_says_why_not(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A bfloat16 load of SmolLM2 has lost the float32 bits the exact fingerprint reads: the card's
    bfloat16 fingerprint identifies it, and the head drafts for it.
    A card without that field is refused with the reason, never matched against the wrong digest."""
    import json
    import shutil

    from specsample_backends.torch import loading
    from specsample_backends.torch.head_file import SHIPPED

    half = loading.load_target("smollm2", dtype=torch.bfloat16)
    drafter = loading.load_drafter("head:" + str(SHIPPED), half)
    ids = torch.tensor([[1, 9690, 42, 2683, 314, 253, 1345, 30]])
    spec = generate(half, drafter, ids, max_new_tokens=16, params=GREEDY, k=2)
    assert spec.metrics.accepted > 0  # it drafts what the target takes
    old = tmp_path / "old.safetensors"
    shutil.copy(SHIPPED, old)
    card = json.loads(SHIPPED.with_suffix(".json").read_text())
    del card["target_fingerprint_bfloat16"]
    old.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match=r"has no target_fingerprint_bfloat16.*float32"):
        loading.load_drafter("head:" + str(old), half)


def test_the_bfloat16_fingerprint_is_the_same_target_at_bfloat16_precision(target: HFModel) -> None:
    import copy

    half = HFModel(copy.deepcopy(target.module).to(torch.bfloat16))
    assert fingerprint(half, bfloat16=True) == fingerprint(target, bfloat16=True) != fingerprint(target)
    assert fingerprints(target) == {"target_fingerprint": fingerprint(target),
                                    "target_fingerprint_bfloat16": fingerprint(target, bfloat16=True)}
    with pytest.raises(ValueError, match=r"target: expected a float32 or float64 target.*got bfloat16"):
        fingerprints(half)
    other = HFModel(copy.deepcopy(target.module))
    assert float(target.module.model.norm.weight[0].detach()) == 1.0  # RMSNorm's initial scale
    with torch.no_grad():  # below bfloat16's resolution at 1.0: the exact digest sees it, the other not
        other.module.model.norm.weight[0] += 1e-6
    assert fingerprint(other) != fingerprint(target)
    assert fingerprint(other, bfloat16=True) == fingerprint(target, bfloat16=True)
    with torch.no_grad():
        other.module.model.norm.weight[0] += 0.1
    assert fingerprint(other, bfloat16=True) != fingerprint(target, bfloat16=True)


def test_the_fingerprint_ignores_where_the_target_was_loaded_from(target: HFModel) -> None:
    # The shipped card must match on any machine: the config's path, its transformers
    # version and the GGUF bookkeeping are not the target; a weight is.
    import copy

    other = HFModel(copy.deepcopy(target.module))
    other.module.config._name_or_path = "/elsewhere/model"
    other.module.config.architectures = None
    assert fingerprint(other) == fingerprint(target)
    with torch.no_grad():
        other.module.model.norm.weight[0] += 1e-6
    assert fingerprint(other) != fingerprint(target)


def test_a_head_outside_the_core_round_says_what_the_round_calls(target: HFModel) -> None:
    head = HeadModel(DraftHead(target, vocab=torch.tensor([0, 1, 3, 4, 6])))
    ids, lengths = torch.tensor([[1, 2, 3]]), torch.tensor([3])
    for drafter in (HeadDrafter(head), HeadTreeDrafter(head, nodes=2)):
        name = type(drafter).__name__
        with pytest.raises(TypeError, match=f"{name}.start: the head reads the target's features; .* "
                                            f"calls start_features"):
            drafter.start(ids, lengths, 8)
        with pytest.raises(TypeError, match=f"{name}.advance: .* calls advance_features"):
            drafter.advance(None, lengths)  # type: ignore[arg-type]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "generic"])
def test_tapped_features_carry_the_layers_outputs_after_the_top_feature(fast: bool) -> None:
    """A tapped target's features are its untapped ones, then each tapped layer's output (the
    residual stream after it) as transformers' hidden states give it; the logits do not move."""
    model = _tiny(layers=3)
    model = model if fast else HFModel(model.module, fast=False)
    x = torch.tensor([[3, 4, 5, 1], [1, 1, 2, 6]])
    logits, plain, _ = model.forward_features(x, model.new_cache(2, 4))
    model.tap((1, 0))
    again, wide, _ = model.forward_features(x, model.new_cache(2, 4))
    assert torch.equal(again, logits) and wide.shape == (2, 4, 3 * 32)
    assert torch.equal(wide[..., :32], plain)
    with torch.no_grad():
        states = model.module(input_ids=x, output_hidden_states=True).hidden_states
    torch.testing.assert_close(wide[..., 32:64], states[2], atol=1e-10, rtol=0)
    torch.testing.assert_close(wide[..., 64:], states[1], atol=1e-10, rtol=0)
    _, tree, _ = model.forward_tree_features(x[:, :3], torch.tensor([[-1, 0, 0]] * 2), model.new_cache(2, 4))
    assert tree.shape == (2, 3, 96)


def test_bad_taps_are_clear_errors() -> None:
    model = _tiny(layers=3)
    for wrong in ((2,), (-1,), (0, 0), [0], (True,)):
        with pytest.raises(ValueError, match=r"layers: expected a tuple of distinct layer indices in "
                                             r"\[0, 2\)"):
            model.tap(wrong)  # type: ignore[arg-type]
    model.tap((0,))
    model.tap(())  # asks for none: leaves layer 0 for the head that tapped it
    assert model.taps == (0,)
    with pytest.raises(ValueError, match=r"taps: layers: this target's features already carry layers \(0,\) "
                                         r"for another head, got \(1,\)"):
        DraftHead(model, taps=(1,))
    head = DraftHead(_tiny(layers=3), taps=(1,))
    with pytest.raises(ValueError, match=r"features: this head fuses the target's layers \[1\] with its top "
                                         r"feature, expected \[\.\.\., 64\]"):
        head.fused(torch.zeros(1, 2, 32))
    with pytest.raises(ValueError, match=r"features: expected the target's features, D = 32 wide"):
        DraftHead(_tiny(layers=3)).fused(torch.zeros(1, 2, 40))


def test_a_fused_head_starts_as_the_head_that_reads_the_top_feature_alone() -> None:
    """Its fuse starts as "f alone": untrained, it drafts what a head without taps drafts
    (same tokens, same acceptances), and it takes the top feature of a wider tapped one."""
    plain, fused = _tiny(), _tiny()
    ids = torch.tensor([PROMPT, [4, 4, 6, 1, 0]])
    runs = [generate(model, HeadDrafter(HeadModel(DraftHead(model, taps=taps))), ids, max_new_tokens=16,
                     params=HOT, k=3, seed=5) for model, taps in ((plain, ()), (fused, (0,)))]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].metrics.histogram == runs[1].metrics.histogram and runs[0].metrics.accepted > 0
    assert fused.taps == (0,) and plain.taps == ()
    # A head without taps on a tapped target (another head tapped it) reads the top feature.
    again = generate(fused, HeadDrafter(HeadModel(DraftHead(fused))), ids, max_new_tokens=16, params=HOT,
                     k=3, seed=5)
    assert torch.equal(again.sequences, runs[0].sequences)


@pytest.mark.parametrize("vocab", [None, torch.tensor([0, 2, 3, 5, 7])], ids=["all", "subset"])
def test_a_fused_head_decodes_greedily_as_plain_and_reloads_with_its_taps(tmp_path, vocab: torch.Tensor | None
                                                                         ) -> None:  # type: ignore[no-untyped-def]
    target = _tiny(layers=3)
    head = _shaken(target, vocab, taps=(1, 0))
    ids = torch.tensor([[*PROMPT, 0, 0], [4, 4, 6, 1, 0, 2, 5]])  # ragged
    lengths = torch.tensor([5, 7])
    plain = generate_plain(target, ids, max_new_tokens=24, params=GREEDY, prompt_lengths=lengths)
    for drafter in (HeadDrafter(head), HeadConfidenceTreeDrafter(head, nodes=4, depth=3, branch=2),
                    FeatureHybridDrafter(HeadDrafter(head))):
        spec = generate(target, drafter, ids, max_new_tokens=24, params=GREEDY, prompt_lengths=lengths, k=3)
        assert torch.equal(spec.sequences, plain.sequences)
    save_head(head.head, tmp_path / "f.safetensors", fingerprints(target))
    other = _tiny(layers=3)
    loaded = load_head(tmp_path / "f.safetensors", other)
    assert loaded.taps.tolist() == [1, 0] and other.taps == (1, 0)
    assert loaded.fuse is not None and head.head.fuse is not None
    assert torch.equal(loaded.fuse.weight, head.head.fuse.weight)
