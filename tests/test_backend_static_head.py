"""A feature-level draft head on the static engine: the core loop's tokens, nothing compiled
after warm-up, buffers that never move, and the shipped head on SmolLM2.

A tiny random Llama in float64 with heads derived from its last layer (perturbed, so that
they draft often but not always right), over the whole vocabulary and over every other id.
Most checks use the "aot_eager" compiler: the graphs are traced and captured as under
inductor but run eager kernels, so equality with the core loop is bit for bit and compiling
takes seconds; one check compiles with inductor.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from specsample_backends.static import create_cpu, pieces
from specsample_backends.torch import HFModel
from specsample_backends.torch.head import DraftHead, HeadModel
from test_backend_static import BUCKETS, PARAMS, TINY, V, _graphs, _ragged
from transformers import LlamaConfig, LlamaForCausalLM

from specsample.core.params import SamplingParams
from specsample.drafters.head import HeadDrafter
from specsample.engine.generate import generate
from specsample.engine.options import RunOptions


@pytest.fixture(scope="module")
def target() -> HFModel:
    torch.manual_seed(0)
    return HFModel(LlamaForCausalLM(LlamaConfig(**TINY)).eval().double())


def _head(target: HFModel, subset: torch.Tensor | None) -> HeadModel:
    torch.manual_seed(1)
    head = DraftHead(target, vocab=subset)
    with torch.no_grad():
        for weight in head.parameters():
            weight.add_(torch.randn_like(weight) * 0.05)
    return HeadModel(head)


@pytest.fixture(scope="module")
def heads(target: HFModel) -> dict[str, HeadModel]:
    return {"all ids": _head(target, None), "every other id": _head(target, torch.arange(0, V, 2))}


def _same_as_core(backend, target, drafter, run):  # type: ignore[no-untyped-def]
    got = backend.generate(target, drafter, _ragged()[0], RunOptions(**run))
    want = generate(target, drafter, _ragged()[0], **run)
    assert torch.equal(got.lengths, want.lengths)
    assert torch.equal(got.sequences, want.sequences)
    assert got.metrics.accepted == want.metrics.accepted
    assert got.metrics.drafted == want.metrics.drafted
    return got


def test_a_head_gives_the_core_loops_tokens(target, heads) -> None:  # type: ignore[no-untyped-def]
    """Same seeds and uniforms: the core loop's tokens, over both heads, K = 1 and 3, the
    sampling settings, an end-of-sequence id and a confidence threshold (a knob)."""
    backend = create_cpu({"buckets": BUCKETS, "dtype": "float64", "compiler": "aot_eager"})
    lengths = _ragged()[1]
    accepted = 0
    for (name, head), params, k, seed in itertools.product(heads.items(), PARAMS, (1, 3), range(2)):
        run = dict(max_new_tokens=20, params=params, k=k, seed=seed, prompt_lengths=lengths,
                   eos_token_id=7 if seed else None)
        accepted += _same_as_core(backend, target, HeadDrafter(head), run).metrics.accepted
        if k == 3 and seed == 0:
            sure = HeadDrafter(head, threshold=0.3)
            got = _same_as_core(backend, target, sure, run)
            assert got.metrics.drafted < 3 * got.metrics.row_rounds, (name, params)
    assert accepted > 0


@dataclasses.dataclass(frozen=True)
class Alternating:
    """A K policy that alternates K = 4 and 1: a round after a wider one must recompute the
    head's K/V over the wider round's drafts too."""

    ks: tuple[int, ...] = (4, 1)

    @property
    def k_max(self) -> int:
        return max(self.ks)

    def next_k(self, metrics) -> int:  # type: ignore[no-untyped-def]
        return self.ks[metrics.rounds % len(self.ks)]


def test_a_head_gives_the_core_loops_tokens_when_k_changes_between_rounds(target, heads) -> None:  # type: ignore[no-untyped-def]
    backend = create_cpu({"buckets": BUCKETS, "dtype": "float64", "compiler": "aot_eager"})
    for seed in range(3):
        run = dict(max_new_tokens=20, params=PARAMS[1], k=Alternating(), seed=seed,
                   prompt_lengths=_ragged()[1])
        got = _same_as_core(backend, target, HeadDrafter(heads["all ids"]), run)
        assert got.metrics.k_counts[1] > 0 and got.metrics.k_counts[4] > 0


def test_the_parity_bites_a_head_that_never_reads_the_targets_features(target, heads,
                                                                     monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Negative control: the engine writing zeros for the target's features drafts otherwise,
    # and the comparison with the core loop sees it.
    def zeros(self, x, norm, positions, features):  # type: ignore[no-untyped-def]
        features.index_put_((pieces._rows(x), positions), torch.zeros_like(x))
        return x

    monkeypatch.setattr(pieces.FeatureStep, "forward", zeros)
    backend = create_cpu({"buckets": BUCKETS, "dtype": "float64", "compiler": "aot_eager"})
    drafter = HeadDrafter(heads["all ids"])
    differs = []
    for seed in range(3):
        run = dict(max_new_tokens=20, params=PARAMS[1], k=3, seed=seed, prompt_lengths=_ragged()[1])
        got = backend.generate(target, drafter, _ragged()[0], RunOptions(**run))
        want = generate(target, drafter, _ragged()[0], **run)
        differs.append(not torch.equal(got.sequences, want.sequences)
                       or got.metrics.accepted != want.metrics.accepted)
    assert any(differs)


def test_a_head_compiles_nothing_after_warm_up_and_keeps_its_buffers(target, heads) -> None:  # type: ignore[no-untyped-def]
    backend = create_cpu({"buckets": BUCKETS, "dtype": "float64", "compiler": "aot_eager"})
    drafter = HeadDrafter(heads["every other id"])
    ids, lengths = _ragged()
    backend.generate(target, drafter, ids, RunOptions(max_new_tokens=8, k=3, prompt_lengths=lengths))
    slot = backend.engine(target, drafter).slots[(3, BUCKETS[0])]
    before, pointers = _graphs(), slot.pointers()
    assert slot.features is not None and slot.features.data_ptr() in pointers
    rounds, accepted = 0, set()
    for seed in range(40):
        run = RunOptions(max_new_tokens=30, k=3, seed=seed, params=PARAMS[seed % len(PARAMS)],
                         prompt_lengths=lengths)
        for step in backend.iterate(target, drafter, ids, run):
            rounds += 1
            accepted.update(step.result.verdict.num_accepted.tolist())
            assert slot.pointers() == pointers
        if rounds >= 100:
            break
    assert rounds >= 100 and accepted == {0, 1, 2, 3}
    assert _graphs() == before, f"compiled again after warm-up: {before} -> {_graphs()}"


def test_inductor_gives_the_core_loops_tokens(target, heads) -> None:  # type: ignore[no-untyped-def]
    backend = create_cpu({"buckets": BUCKETS[:1], "dtype": "float64"})
    for name, params in (("every other id", PARAMS[0]), ("every other id", PARAMS[1]),
                         ("all ids", PARAMS[2])):
        run = dict(max_new_tokens=16, params=params, k=3, seed=4, prompt_lengths=_ragged()[1])
        _same_as_core(backend, target, HeadDrafter(heads[name]), run)


def test_a_whole_round_graph_refuses_a_head(target, heads) -> None:  # type: ignore[no-untyped-def]
    whole = create_cpu({"buckets": BUCKETS, "dtype": "float64", "pieces": False})
    with pytest.raises(ValueError, match="compiled pieces"):
        whole.engine(target, HeadDrafter(heads["all ids"]))


def test_a_head_that_fuses_tapped_layers_is_refused_by_name() -> None:
    """The engine's graphs carry the target's top feature alone: a head that fuses a lower
    layer's output with it (recipe v3) is an error naming its taps, not a wrong draft."""
    torch.manual_seed(0)
    target = HFModel(LlamaForCausalLM(LlamaConfig(**TINY)).eval().double())  # tapped below: its own
    fused = HeadModel(DraftHead(target, taps=(1,)))
    backend = create_cpu({"buckets": BUCKETS, "dtype": "float64", "compiler": "aot_eager"})
    with pytest.raises(ValueError, match=r"drafter: the static engine's graphs carry the target's top "
                                         r"feature alone, got a head that fuses layers \[1\]"):
        backend.generate(target, HeadDrafter(fused), _ragged()[0], RunOptions(max_new_tokens=4))


def test_a_head_of_two_layers_is_refused_by_name(target) -> None:  # type: ignore[no-untyped-def]
    """The engine's head graphs run one layer: a deeper head is an error, not a wrong draft."""
    deeper = HeadModel(DraftHead(target, layers=2))
    backend = create_cpu({"buckets": BUCKETS, "dtype": "float64", "compiler": "aot_eager"})
    with pytest.raises(ValueError, match=r"drafter: the static engine's graphs run a one-layer head, got "
                                         r"a head of 2 layers"):
        backend.generate(target, HeadDrafter(deeper), _ragged()[0], RunOptions(max_new_tokens=4))


@pytest.mark.slow
def test_the_shipped_head_runs_on_smollm2_with_the_eager_greedy_tokens() -> None:
    """The real model and the shipped head (8,192 ids): `load_drafter("head")` on static-cpu,
    greedy tokens equal the torch backend's, nothing compiled after the first run."""
    from specsample_backends.torch.head_file import SHIPPED, load_head

    backend = create_cpu({"buckets": [128], "compiler": "aot_eager"})
    target = backend.load_target()
    drafter = backend.load_drafter("head", target)
    assert isinstance(drafter, HeadDrafter)
    eager = HeadDrafter(HeadModel(load_head(SHIPPED, target)))  # the chain (a by-name "head" may fan out)
    ids = torch.tensor([[1, 9690, 42, 2683, 314, 253, 1345, 30]])
    run = dict(max_new_tokens=24, k=4, params=SamplingParams(temperature=0))
    got = backend.generate(target, drafter, ids, RunOptions(**run))
    want = generate(target, eager, ids, **run)  # type: ignore[arg-type]
    assert torch.equal(got.sequences, want.sequences)
    assert got.metrics.accepted == want.metrics.accepted > 0
    before = _graphs()
    backend.generate(target, drafter, ids, RunOptions(**{**run, "params": SamplingParams(temperature=0.7)}))
    assert _graphs() == before
