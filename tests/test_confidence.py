"""Trees grown by the draft's confidence: `grow_tree` and `ConfidenceTreeDrafter`.

The growth itself on hand-made laws (the paths kept, their order, ancestors kept, NumPy and
torch alike); the drafter's trees against the same growth run on chain forwards of each
path; the engine's greedy output against plain decoding; and the output law.

Statistics: n = 200,000 rows per method, the first 2 tokens (M = 64 outcomes) of a tiny
random Llama (V = 8, float64) drafted by its own first layer; goodness_of_fit against the
target's exact law at alpha = 1e-4 (tau ~= 0.0116), so a law at TV >= 0.024 is caught with
probability >= 1 - 1e-4; at T = 1 and at T = 0.7 with top-p 0.9. The negative control (a
residual that keeps a rejected sibling's mass) must fail the same test.

Trees sized by a `RatedBudget` through the engine (its calibration moves with the rounds'
outcomes, so the tree reads the run's past): n = 20,000 rows, the same 2 tokens and test at
alpha = 1e-4 (tau ~= 0.037 at T = 1, 0.033 at T = 0.7 top-p 0.9; a law at TV >= 0.073 / 0.066
is caught with probability >= 1 - 1e-4); the broken residual (TV ~0.22 here) must fail. The exact law
through `grow_tree` and `verify_tree`, with the control that peeks at the target, is in
tests/test_proofs_exact.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_testing_tree import TREE_PROMPT, _tree_law
from test_tree import tree_llama

from specsample.core.metrics import Costs
from specsample.core.params import SamplingParams
from specsample.core.protocols import StatefulTreeDrafter, TreeDrafter
from specsample.drafters.confidence import (
    ConfidenceTreeDrafter,
    GrownState,
    RatedBudget,
    confidence_law,
    grow_tree,
    grown_tree_budget,
    is_grown_tree_name,
    node_path,
)
from specsample.engine.generate import generate, generate_plain
from specsample.engine.options import RunOptions
from specsample.engine.tree import generate_tree, run_tree_rounds
from specsample.testing import broken, goodness_of_fit, tree_samples

ROWS = 200_000


def _table_expand(table: dict[tuple[int, ...], list[float]], vocab: int):  # type: ignore[no-untyped-def]
    """An `expand` over a law per path (uniform where the table is silent), row 0 only."""
    def expand(fed: np.ndarray, parents: np.ndarray) -> np.ndarray:
        return np.array([[table.get(node_path(fed, parents, 0, i), [1 / vocab] * vocab)
                          for i in range(fed.shape[1])]])
    return expand


def test_the_most_probable_paths_are_kept_in_growth_order() -> None:
    # Root: 0 (0.5), 1 (0.3); after 0: 1 (0.9) -> 0.45, 2 (0.1); after 1: 0 (0.6) -> 0.18, ...
    # The 3 most probable paths: (0) 0.5, (0, 1) 0.45, (1) 0.3.
    table = {(0,): [0.0, 0.9, 0.1, 0.0], (1,): [0.6, 0.0, 0.0, 0.4]}
    root = np.array([[0.5, 0.3, 0.15, 0.05]])
    tree = grow_tree(root, _table_expand(table, 4), nodes=3, depth=2, branch=2)
    assert tree.tokens.tolist() == [[0, 1, 1]] and tree.parents.tolist() == [[-1, -1, 0]]
    assert tree.sizes.tolist() == [3] and tree.probs is None
    # A larger budget takes the next paths: (1, 0) 0.18, then (1, 3) 0.12 over (0, 2) 0.05.
    tree = grow_tree(root, _table_expand(table, 4), nodes=5, depth=2, branch=2)
    assert tree.tokens.tolist() == [[0, 1, 1, 0, 3]] and tree.parents.tolist() == [[-1, -1, 0, 1, 1]]
    # Depth 1: the root's `branch` most likely tokens, whatever the budget.
    tree = grow_tree(root, _table_expand(table, 4), nodes=5, depth=1, branch=3)
    assert tree.tokens.tolist() == [[0, 1, 2]] and tree.parents.tolist() == [[-1, -1, -1]]


def test_a_sure_child_keeps_its_parent_and_ties_go_to_the_lower_id() -> None:
    # After 0 the draft is sure of 2: path (0, 2) ties with (0); the parent comes first. The
    # root's tie between 0 and 1 goes to 0.
    table = {(0,): [0.0, 0.0, 1.0], (1,): [1.0, 0.0, 0.0], (0, 2): [1.0, 0.0, 0.0]}
    root = np.array([[0.4, 0.4, 0.2]])
    tree = grow_tree(root, _table_expand(table, 3), nodes=2, depth=3, branch=1)
    assert tree.tokens.tolist() == [[0, 2]] and tree.parents.tolist() == [[-1, 0]]


@pytest.mark.parametrize("seed", range(5))
def test_numpy_and_torch_grow_the_same_trees_every_node_below_a_kept_parent(seed: int) -> None:
    rng = np.random.default_rng(seed)
    vocab, batch = 6, 4
    root = rng.dirichlet(np.ones(vocab), size=batch)
    laws = rng.dirichlet(np.ones(vocab), size=(batch, 64))

    def expand_np(fed: np.ndarray, parents: np.ndarray) -> np.ndarray:
        # a law per (row, fed index, token): the parent chain shapes nothing here, but the
        # fed nodes' order does, as a model's would
        return laws[:, : fed.shape[1]] * 0 + laws[np.arange(batch)[:, None], (fed * 7 + parents + 1) % 64]

    def expand_torch(fed: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(expand_np(fed.numpy(), parents.numpy()))

    a = grow_tree(root, expand_np, nodes=7, depth=4, branch=3)
    b = grow_tree(torch.from_numpy(root), expand_torch, nodes=7, depth=4, branch=3)
    assert np.array_equal(a.tokens, b.tokens.numpy()) and np.array_equal(a.parents, b.parents.numpy())
    for row in range(batch):
        for i, parent in enumerate(a.parents[row]):
            assert -1 <= parent < i
        siblings = {}
        for i, parent in enumerate(a.parents[row]):
            assert a.tokens[row, i] not in siblings.setdefault(int(parent), set())  # distinct siblings
            siblings[int(parent)].add(int(a.tokens[row, i]))


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"nodes": 0}, ValueError, "nodes: expected an int >= 1, got 0"),
    ({"depth": 0}, ValueError, "depth: expected an int >= 1, got 0"),
    ({"branch": 0}, ValueError, "branch: expected an int >= 1, got 0"),
    ({"nodes": 2.5}, TypeError, "nodes"),
])
def test_bad_budgets_are_clear_errors(kwargs: dict, error: type, match: str) -> None:
    base = {"nodes": 4, "depth": 2, "branch": 2}
    with pytest.raises(error, match=match):
        grow_tree(np.full((1, 4), 0.25), _table_expand({}, 4), **{**base, **kwargs})
    with pytest.raises(error, match=match):
        ConfidenceTreeDrafter(tree_llama(), **{**base, **kwargs})


def test_bad_laws_and_models_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"root: expected the draft's laws \[B, V\], got shape \[4\]"):
        grow_tree(np.full(4, 0.25), _table_expand({}, 4), nodes=2, depth=2, branch=2)
    with pytest.raises(ValueError, match=r"expand: expected laws of shape \[1, 2, 4\], got \[1, 2, 3\]"):
        grow_tree(np.full((1, 4), 0.25), lambda fed, parents: np.full((1, fed.shape[1], 3), 1 / 3),
                  nodes=2, depth=2, branch=2)
    with pytest.raises(TypeError, match=r"model: expected a TreeModel .* got list"):
        ConfidenceTreeDrafter([], nodes=2)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def pair() -> tuple[object, object]:
    target = tree_llama()
    return target, target.derive(num_layers=1)


def test_the_drafter_is_a_stateful_tree_drafter(pair) -> None:  # type: ignore[no-untyped-def]
    drafter = ConfidenceTreeDrafter(pair[1], nodes=6, depth=3)
    assert isinstance(drafter, TreeDrafter) and isinstance(drafter, StatefulTreeDrafter)
    assert drafter.describe() == {"nodes": 6, "depth": 3, "branch": 2}
    with pytest.raises(TypeError, match="budget: expected None or a RatedBudget, got dict"):
        ConfidenceTreeDrafter(pair[1], budget={"c": 0.1})  # type: ignore[arg-type]


def test_the_drafters_tree_is_the_growth_on_chain_forwards_of_each_path(pair) -> None:  # type: ignore[no-untyped-def]
    # The drafter grows with one tree forward per level from its cache; the same growth on
    # laws from a fresh chain forward of context + path must give the same tree, row by row
    # (ragged contexts), and after rounds that moved the cache on.
    _, draft = pair
    drafter = ConfidenceTreeDrafter(draft, nodes=7, depth=3, branch=3)
    contexts = [TREE_PROMPT, TREE_PROMPT[:6], [3, 3, 1]]
    ids = torch.zeros((3, 10), dtype=torch.int64)
    for i, c in enumerate(contexts):
        ids[i, : len(c)] = torch.tensor(c)
    lengths = torch.tensor([len(c) for c in contexts])

    def chain_law(tokens: list[int]) -> torch.Tensor:
        logits, _ = draft.forward(torch.tensor([tokens]), draft.new_cache(1, len(tokens)))
        return confidence_law(logits[0, -1])

    tree = drafter.propose_tree(ids, lengths, 7, 3)
    for row, context in enumerate(contexts):
        def expand(fed: torch.Tensor, parents: torch.Tensor, context: list[int] = context) -> torch.Tensor:
            return torch.stack([chain_law(context + list(node_path(fed, parents, 0, i)))
                                for i in range(fed.shape[1])])[None]

        want = grow_tree(chain_law(context)[None], expand, nodes=7, depth=3, branch=3)
        assert torch.equal(tree.tokens[row], want.tokens[0])
        assert torch.equal(tree.parents[row], want.parents[0])


def test_greedy_output_is_plain_decoding_and_rounds_take_several_tokens(pair) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    drafter = ConfidenceTreeDrafter(draft, nodes=6, depth=3)
    ids = torch.tensor([TREE_PROMPT] * 3)
    greedy = SamplingParams(temperature=0.0)
    spec = generate(target, drafter, ids, max_new_tokens=24, params=greedy, seed=0)
    plain = generate_plain(target, ids, max_new_tokens=24, params=greedy, seed=0)
    assert torch.equal(spec.sequences, plain.sequences)
    assert spec.metrics.mean_tokens_per_round > 1.5  # the first layer agrees with the target often


def test_the_samplers_rows_are_the_engines_rows(pair) -> None:  # type: ignore[no-untyped-def]
    # Row b of the tree sampler reads the uniforms row b of `generate` reads and the same
    # tree: the samples agree token for token.
    target, draft = pair
    drafter = ConfidenceTreeDrafter(draft, nodes=6, depth=3)
    params = SamplingParams(temperature=1.0)
    spec, _, _ = tree_samples(target, drafter, torch.tensor([TREE_PROMPT]), n=300, k=1, params=params, seed=4)
    engine = generate(target, drafter, torch.tensor([TREE_PROMPT] * 300), max_new_tokens=3,
                      params=params, seed=4)
    assert engine.metrics.accepted > 0
    assert np.array_equal(spec, engine.sequences[:, len(TREE_PROMPT):].numpy())


@pytest.mark.parametrize(("params", "rule"), [
    (SamplingParams(temperature=1.0), None),
    (SamplingParams(temperature=0.7, top_p=0.9), None),
    (SamplingParams(temperature=1.0), "tree-without-residual"),
], ids=["T=1", "T=0.7 top-p 0.9", "T=1 broken residual"])
def test_grown_trees_follow_the_target_law_and_a_broken_rule_does_not(pair, params, rule) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    drafter = ConfidenceTreeDrafter(draft, nodes=6, depth=3)
    verifier = broken.TREE_VERIFIERS[rule] if rule else None
    spec, plain, counts = tree_samples(target, drafter, torch.tensor([TREE_PROMPT]), n=ROWS, k=1,
                                       params=params, seed=11, length=2, batch=8192,
                                       **({"verifier": verifier} if verifier else {}))
    law = _tree_law(target, params)
    result = goodness_of_fit(spec[:, 0] * 8 + spec[:, 1], law)
    assert result.passed == (rule is None), str(result)
    assert goodness_of_fit(plain[:, 0] * 8 + plain[:, 1], law).passed
    assert counts["laws"] < 200  # per prefix, not per row


def test_names_spell_the_budget() -> None:
    assert grown_tree_budget("grown-tree") == {"nodes": 8, "depth": 4}
    assert grown_tree_budget("grown-tree:6") == {"nodes": 6, "depth": 4}
    assert grown_tree_budget("grown-tree:12x3") == {"nodes": 12, "depth": 3}
    assert is_grown_tree_name("grown-tree:4") and not is_grown_tree_name("suffix-tree")
    for bad in ("grown-tree:0", "grown-tree:4x0", "grown-tree:ax2", "grown-tree:1x2x3", "grown"):
        with pytest.raises(ValueError, match="expected 'grown-tree', 'grown-tree:N' or 'grown-tree:NxD'"):
            grown_tree_budget(bad)


# --- trees sized by a RatedBudget --------------------------------------------------------------

def _flat(cost: float):  # type: ignore[no-untyped-def]
    """A verify of p positions costing 1 + cost (p - 1) plain steps, at any batch."""
    return lambda batch, positions: 1 + cost * (positions - 1)


def _budget(c: float, cost: float, **kwargs: float) -> RatedBudget:
    """A RatedBudget of growth levels costing c and a verify costing `_flat(cost)`."""
    return RatedBudget(costs=Costs(c=c, width=_flat(cost)), **kwargs)


def _rated_by_hand(scores: list[float], levels: int, c: float, width, kappa: float) -> int:  # type: ignore[no-untyped-def]
    """Thm 3.8's pick, written out: the w maximising (1 + kappa * top-w mass) / (levels c + width(w + 1))."""
    ordered = sorted(scores, reverse=True)
    rates = [(1 + kappa * sum(ordered[:w])) / (levels * c + width(1, w + 1)) for w in range(len(ordered) + 1)]
    return rates.index(max(rates))


def test_a_rated_budget_keeps_the_node_count_thm_3_8_rates_best() -> None:
    table = {(0,): [0.1, 0.6, 0.2, 0.1], (1,): [0.05, 0.05, 0.7, 0.2]}
    root = np.array([[0.5, 0.3, 0.15, 0.05]])
    # The grown candidates' path probabilities: 0.5, 0.3 (level 1); 0.5 x 0.6, 0.5 x 0.2,
    # 0.3 x 0.7, 0.3 x 0.2 (level 2).
    scores = [0.5, 0.3, 0.3, 0.1, 0.21, 0.06]
    cases = ((0.0, 1.0, 6), (0.25, 1.0, None), (0.6, 1.0, None), (5.0, 1.0, 0), (0.25, 0.3, None))
    for cost, kappa, want in cases:
        budget = _budget(0.0, cost, kappa=kappa)
        tree = grow_tree(root, _table_expand(table, 4), nodes=6, depth=2, branch=2, budget=budget)
        expected = _rated_by_hand(scores, 2, 0.0, _flat(cost), kappa) if want is None else want
        assert int(tree.sizes[0]) == expected, (cost, kappa)
        assert tree.tokens.shape[1] == max(expected, 1)
    with pytest.raises(TypeError, match="costs: expected Costs with the verify's cost per width"):
        RatedBudget(costs=Costs(c=0.1))
    with pytest.raises(ValueError, match="kappa: expected a finite number > 0, got 0"):
        _budget(0.1, 0.1, kappa=0)
    # The picks differ with the costs: a free verify keeps all, a dear one none, between some.
    picks = {_rated_by_hand(scores, 2, 0.0, _flat(cost), 1.0) for cost in (0.0, 0.25, 0.6, 5.0)}
    assert len(picks) >= 3, picks


def test_a_rated_budget_stops_growing_where_a_level_cannot_pay() -> None:
    calls = []

    def expand(fed: np.ndarray, parents: np.ndarray) -> np.ndarray:
        calls.append(fed.shape[1])
        return np.full((1, fed.shape[1], 4), 0.25)

    root = np.array([[0.4, 0.3, 0.2, 0.1]])
    grow_tree(root, expand, nodes=8, depth=4, branch=2, budget=_budget(0.0, 0.0))
    assert len(calls) == 3  # free levels and a free verify: every level is grown
    calls.clear()
    tree = grow_tree(root, expand, nodes=8, depth=4, branch=2, budget=_budget(5.0, 0.1))
    assert not calls and int(tree.sizes[0]) == 2  # a level costs 5 plain steps: the root's two
    # children only, as the rating keeps them (1.7 / 6.2 > 1.4 / 6.1 > 1 / 6)


def test_the_calibration_follows_the_runs_outcomes(pair) -> None:  # type: ignore[no-untyped-def]
    budget = _budget(0.05, 0.08, kappa=1.0, weight=2.0)
    assert budget.calibration(0.0, 0.0) == 1.0
    assert budget.calibration(3.0, 8.0) == pytest.approx((3 + 2) / (8 + 2))
    target, draft = pair
    drafter = ConfidenceTreeDrafter(draft, nodes=6, depth=3, budget=budget)
    assert drafter.describe() == {"nodes": 6, "depth": 3, "branch": 2, "rated": True, "c": 0.05}
    run = RunOptions(max_new_tokens=12, params=SamplingParams(temperature=1.0), seed=1)
    accepted = 0
    for step in run_tree_rounds(target, drafter, torch.tensor([TREE_PROMPT] * 16), run):
        state = step.state.draft_state
        assert isinstance(state, GrownState)
        # The drafts a row committed (a round's last token is not one; a row cut at its stop
        # commits fewer than it accepted).
        accepted += int((step.result.emitted[step.result.active] - 1).clip(min=0).sum())
        assert state.accepted == accepted
    assert state.predicted > 0 and budget.calibration(state.accepted, state.predicted) != 1.0


def test_rated_greedy_output_is_plain_decoding(pair) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    ids = torch.tensor([TREE_PROMPT] * 3)
    greedy = SamplingParams(temperature=0.0)
    plain = generate_plain(target, ids, max_new_tokens=24, params=greedy, seed=0)
    for cost in (0.08, 50.0):  # some trees; none (plain steps only)
        budget = _budget(0.05, cost)
        drafter = ConfidenceTreeDrafter(draft, nodes=6, depth=3, budget=budget)
        spec = generate(target, drafter, ids, max_new_tokens=24, params=greedy, seed=0)
        assert torch.equal(spec.sequences, plain.sequences)
        assert (spec.metrics.mean_tokens_per_round > 1.5) == (cost < 1)


@pytest.mark.parametrize(("params", "rule"), [
    (SamplingParams(temperature=1.0), None),
    (SamplingParams(temperature=0.7, top_p=0.9), None),
    (SamplingParams(temperature=1.0), "tree-without-residual"),
], ids=["T=1", "T=0.7 top-p 0.9", "T=1 broken residual"])
def test_rated_trees_follow_the_target_law_through_the_engine(pair, params, rule) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    drafter = ConfidenceTreeDrafter(draft, nodes=6, depth=3, budget=_budget(0.05, 0.08))
    verifier = {"verifier": broken.TREE_VERIFIERS[rule]} if rule else {}
    out = generate_tree(target, drafter, torch.tensor([TREE_PROMPT] * 20_000), max_new_tokens=2,
                        params=params, seed=5, **verifier)
    assert out.metrics.accepted > 0  # trees were drafted and taken
    spec = out.sequences[:, len(TREE_PROMPT):].numpy()
    result = goodness_of_fit(spec[:, 0] * 8 + spec[:, 1], _tree_law(target, params))
    assert result.passed == (rule is None), str(result)
