"""Draft trees on the static engine: the tensor tree rule and path move equal the core's, the
engine's tree rounds give the core loop's tokens, and nothing compiles after warm-up.

A tiny random Llama in float64 (V = 8, where the suffix drafter's trees branch often), with
the "aot_eager" compiler: the graphs are traced and captured as under inductor but run
eager kernels, so equality with the core loop is bit for bit and compiling takes seconds.
"""

from __future__ import annotations

import pytest
import torch
from specsample_backends.static import create_cpu
from specsample_backends.static.tree import move_path, tree_widths, verify_tree_tensor
from specsample_backends.torch import HFModel
from test_tree import tree_llama
from torch._dynamo.utils import counters

from specsample.core.params import SamplingParams
from specsample.core.verify_tree import verify_tree
from specsample.drafters.suffix import SuffixTreeDrafter
from specsample.engine.generate import generate, generate_plain
from specsample.engine.options import RunOptions

PROMPTS = torch.tensor([[1, 5, 2, 7, 1, 5, 3, 1, 5, 2], [4, 4, 6, 1, 0, 4, 4, 6, 1, 0],
                        [2, 3, 2, 3, 2, 3, 0, 0, 0, 0]])
LENGTHS = torch.tensor([10, 7, 6])
PARAMS = [SamplingParams(temperature=0), SamplingParams(temperature=1.0),
          SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=1.2, top_k=3)]


@pytest.fixture(scope="module")
def target() -> HFModel:
    return tree_llama()


def _tree_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    b, n, v = 64, 7, 11
    parents = torch.tensor([-1, -1, 0, 0, 1, 2, -1]).expand(b, n).clone()
    parents[::3] = torch.tensor([-1, 0, 1, 2, 3, 4, 5])  # some rows are chains
    tokens = torch.randint(0, v, (b, n), generator=gen)
    tokens[1, 1] = tokens[1, 0]  # a duplicate sibling: never accepted twice
    p = torch.softmax(torch.randn(b, n + 1, v, generator=gen, dtype=torch.float64) * 2, -1)
    p[2, 0] = 0.0
    p[2, 0, tokens[2, 0]] = 1.0  # a certain first node: its rejection leaves no mass
    u = torch.rand(b, n + 1, generator=gen, dtype=torch.float64)
    sizes = torch.randint(0, n + 1, (b,), generator=gen)
    return tokens, parents, p, u, sizes


@pytest.mark.parametrize("seed", range(10))
def test_the_tensor_tree_rule_equals_verify_tree(seed: int) -> None:
    tokens, parents, p, u, sizes = _tree_inputs(seed)
    for depth, rows in ((7, sizes), (8, torch.full_like(sizes, 7))):
        got = verify_tree_tensor(tokens, parents, p, u, rows, depth)
        want = verify_tree(tokens, parents, None, p, u, depth=depth, tree_sizes=rows, check=True)
        for mine, core in zip(got, (want.tokens, want.num_accepted, want.path), strict=True):
            assert torch.equal(mine, core)
    # One graph, no break; the eager kernels it captures give the same tokens.
    compiled = torch.compile(verify_tree_tensor, backend="aot_eager", fullgraph=True, dynamic=False)
    for mine, eager in zip(compiled(tokens, parents, p, u, sizes, 7),
                           verify_tree_tensor(tokens, parents, p, u, sizes, 7), strict=True):
        assert torch.equal(mine, eager)


def test_move_path_moves_each_accepted_nodes_entries_into_place() -> None:
    gen = torch.Generator().manual_seed(2)
    keys, values = (torch.randn(3, 2, 24, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    first, path = torch.tensor([4, 9, 22]), torch.tensor([[1, 3, -1], [0, 2, 5], [0, -1, -1]])
    want_keys, want_values = keys.clone(), values.clone()
    for b in range(3):  # one entry at a time, from an untouched copy
        for j, node in enumerate(path[b].tolist()):
            if node >= 0:
                want_keys[b, :, first[b] + j] = keys[b, :, first[b] + node]
                want_values[b, :, first[b] + j] = values[b, :, first[b] + node]
    move_path(keys, values, first, path)
    assert torch.equal(keys, want_keys) and torch.equal(values, want_values)


@pytest.mark.parametrize("pieces", [True, False], ids=["pieces", "whole-round"])
def test_tree_rounds_give_the_core_loops_tokens(target: HFModel, pieces: bool) -> None:
    backend = create_cpu({"buckets": [48, 96], "dtype": "float64", "compiler": "aot_eager",
                          "pieces": pieces})
    drafter = backend.load_drafter("suffix-tree:6x3", target)
    assert isinstance(drafter, SuffixTreeDrafter)
    accepted = 0
    for params, seed, eos in [(PARAMS[0], 0, None), (PARAMS[1], 3, 7), (PARAMS[2], [5, 6, 7], None),
                              (PARAMS[3], 1, None)]:
        run = dict(max_new_tokens=30, params=params, seed=seed, prompt_lengths=LENGTHS, eos_token_id=eos)
        got = backend.generate(target, drafter, PROMPTS, RunOptions(**run))  # type: ignore[arg-type]
        want = generate(target, drafter, PROMPTS, **run)  # type: ignore[arg-type]
        assert torch.equal(got.sequences, want.sequences) and torch.equal(got.lengths, want.lengths)
        assert (got.metrics.accepted, got.metrics.rounds) == (want.metrics.accepted, want.metrics.rounds)
        accepted += got.metrics.accepted
    assert accepted > 0
    plain = generate_plain(target, PROMPTS, max_new_tokens=30, params=PARAMS[0], prompt_lengths=LENGTHS)
    greedy = backend.generate(target, drafter, PROMPTS, RunOptions(max_new_tokens=30, params=PARAMS[0],
                                                                 prompt_lengths=LENGTHS))
    assert torch.equal(greedy.sequences, plain.sequences)


def test_tree_widths_are_powers_of_two_then_the_budget() -> None:
    assert [tree_widths(n) for n in (1, 2, 6, 8)] == [(1,), (1, 2), (1, 2, 4, 6), (1, 2, 4, 8)]
    with pytest.raises(ValueError, match="nodes: expected"):
        tree_widths(0)


def test_a_round_runs_the_narrowest_width_that_holds_its_trees(target: HFModel) -> None:
    # Every width of the ladder is built (and warmed up) at the first run; then each round
    # runs the smallest width that holds its widest active tree (recorded by wrapping the
    # captured rounds), and the tokens stay the core loop's.
    backend = create_cpu({"buckets": [48, 96], "dtype": "float64", "compiler": "aot_eager"})
    drafter = SuffixTreeDrafter(nodes=6, depth=3)
    run = dict(max_new_tokens=20, params=PARAMS[1], prompt_lengths=LENGTHS, seed=2)
    backend.generate(target, drafter, PROMPTS, RunOptions(**run))  # type: ignore[arg-type]
    slot = next(iter(backend.engine(target, drafter).slots.values()))  # type: ignore[arg-type]
    assert sorted(slot.trees) == [(1, 3), (2, 3), (4, 3), (6, 3)]
    used: list[int] = []
    for (width, depth), (round_, buffers) in list(slot.trees.items()):
        def recorded(*args, _round=round_, _width=width):  # type: ignore[no-untyped-def]
            used.append(_width)
            return _round(*args)
        slot.trees[(width, depth)] = (recorded, buffers)
    steps = list(backend.iterate(target, drafter, PROMPTS, RunOptions(**run)))  # type: ignore[arg-type]
    widest = [max(step.result.drafted.tolist()) for step in steps]
    assert used == [next(w for w in tree_widths(6) if w >= s) for s in widest]
    assert len(set(used)) >= 2, used
    want = generate(target, drafter, PROMPTS, **run)  # type: ignore[arg-type]
    assert torch.equal(backend.generate(target, drafter, PROMPTS, RunOptions(**run)).sequences,  # type: ignore[arg-type]
                       want.sequences)


def test_warming_up_a_width_changes_nothing_a_later_round_reads(target: HFModel) -> None:
    backend = create_cpu({"buckets": [48, 96], "dtype": "float64", "compiler": "aot_eager"})
    drafter = SuffixTreeDrafter(nodes=6, depth=3)
    backend.generate(target, drafter, PROMPTS, RunOptions(max_new_tokens=8, prompt_lengths=LENGTHS))
    engine = backend.engine(target, drafter)  # type: ignore[arg-type]
    slot = next(iter(engine.slots.values()))
    slot.done.copy_(torch.tensor([False, True, False]))  # rows that would commit, were they live
    before = [t.clone() for t in (slot.tokens, slot.lengths, slot.done)]
    valid = [[(k[b, :, :n - 1].clone(), v[b, :, :n - 1].clone()) for k, v in slot.target_kv]
             for b, n in enumerate(slot.lengths.tolist())]
    with torch.no_grad():  # as the backend runs the engine
        engine._tree_round(slot, 3, 3)  # a width this slot has not built: built and warmed up now
    assert (3, 3) in slot.trees
    assert all(torch.equal(a, b) for a, b in zip((slot.tokens, slot.lengths, slot.done), before, strict=True))
    for b, n in enumerate(slot.lengths.tolist()):
        for (k, v), (k0, v0) in zip(slot.target_kv, valid[b], strict=True):
            assert torch.equal(k[b, :, :n - 1], k0) and torch.equal(v[b, :, :n - 1], v0)


def _graphs() -> tuple[int, int]:
    return counters["stats"]["unique_graphs"], counters["frames"]["total"]


def test_one_graph_set_per_tree_budget_and_nothing_after_warm_up(target: HFModel) -> None:
    # strict (the default): a recompile after a piece's first call raises; the counters show it too.
    backend = create_cpu({"buckets": [48, 96], "dtype": "float64", "compiler": "aot_eager"})
    small, large = SuffixTreeDrafter(nodes=4, depth=2), SuffixTreeDrafter(nodes=6, depth=3)
    for drafter in (small, large):  # warm-up: each budget's graphs
        backend.generate(target, drafter, PROMPTS, RunOptions(max_new_tokens=12, prompt_lengths=LENGTHS))
    before, rounds, sizes = _graphs(), 0, set()
    for seed in range(12):
        drafter = (small, large)[seed % 2]
        run = RunOptions(max_new_tokens=20, params=PARAMS[seed % len(PARAMS)], seed=seed,
                         prompt_lengths=LENGTHS)
        for step in backend.iterate(target, drafter, PROMPTS, run):
            rounds += 1
            sizes.update(step.result.drafted.tolist())
    assert rounds > 100 and len(sizes) >= 4  # trees of many sizes ran in the same graphs
    assert _graphs() == before, f"compiled again after warm-up: {before} -> {_graphs()}"
    with pytest.raises(ValueError, match="verifier: the static-cpu backend compiles"):
        backend.generate(target, small, PROMPTS, RunOptions(max_new_tokens=2, verifier=verify_tree))  # type: ignore[arg-type]


class _Lying(SuffixTreeDrafter):
    """Proposes a chain of `nodes` nodes whatever its depth, or a tree drawn from a law."""

    def __init__(self, kind: str) -> None:
        super().__init__(nodes=4, depth=2)
        self.kind = kind

    def propose_tree(self, tokens, lengths, nodes, depth):  # type: ignore[no-untyped-def]
        from specsample.core.protocols import TreeProposal

        batch = int(tokens.shape[0])
        chain = torch.arange(-1, nodes - 1).expand(batch, nodes).clone()
        probs = torch.full((batch, nodes, 8), 1 / 8, dtype=torch.float64) if self.kind == "sampled" else None
        return TreeProposal(tokens=torch.zeros(batch, nodes, dtype=torch.int64), parents=chain,
                            sizes=torch.full((batch,), nodes), probs=probs)


@pytest.mark.parametrize(("kind", "error", "match"), [
    ("deep", ValueError, "drafter: expected trees at most 2 deep"),
    ("sampled", TypeError, "drafter: the static engine verifies deterministic trees")])
def test_a_tree_the_graphs_cannot_hold_is_a_clear_error(target: HFModel, kind: str, error: type,
                                                       match: str) -> None:
    backend = create_cpu({"buckets": [48, 96], "dtype": "float64", "compiler": "aot_eager"})
    with pytest.raises(error, match=match):
        backend.generate(target, _Lying(kind), PROMPTS, RunOptions(max_new_tokens=4, prompt_lengths=LENGTHS))


def test_a_drafter_with_state_is_a_clear_error(target: HFModel) -> None:
    # The graphs take each round's tree from a drafter without state; a grown tree drafts from
    # its draft model's cache, which the static engine does not hold.
    from specsample.drafters.confidence import ConfidenceTreeDrafter

    backend = create_cpu({"buckets": [48, 96], "dtype": "float64", "compiler": "aot_eager"})
    drafter = ConfidenceTreeDrafter(tree_llama(1), nodes=4, depth=2)
    match = r"drafter: the static-cpu backend's graphs take trees from a drafter without state .* " \
            r"ConfidenceTreeDrafter .* run it on the torch backend"
    with pytest.raises(TypeError, match=match):
        backend.generate(target, drafter, PROMPTS, RunOptions(max_new_tokens=4, prompt_lengths=LENGTHS))
