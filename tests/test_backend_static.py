"""The static-shape engine (static-cpu): warp/verify equal the core, parity, zero recompiles, buffers.

Most checks run on a tiny random Llama in float64 (fast to compile); a slow
one runs SmolLM2. Static shapes are shown by Dynamo's counters staying
constant after warm-up, and by running warm rounds under
`set_stance("fail_on_recompile")` (the backend's default `strict`).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from specsample_backends.static import (
    CompileCapture,
    ReplayCapture,
    StaticBackend,
    create_cpu,
    engine_options,
    knobs,
    sample_tensor,
    static_inputs,
    verify_tensor,
    warp_tensor,
)
from specsample_backends.static.warp import _nucleus
from specsample_backends.torch import HFModel
from specsample_backends.torch.early_exit import early_exit_draft
from test_warp import TOP_P, _random_logits, _sorted_warp
from torch._dynamo.utils import counters
from transformers import LlamaConfig, LlamaForCausalLM

from specsample.api.registry import get_backend
from specsample.core.params import SamplingParams
from specsample.core.sample import sample
from specsample.core.verify import verify
from specsample.core.warp import warp
from specsample.drafters.model import ModelDrafter
from specsample.engine.generate import generate
from specsample.engine.options import RunOptions

V = 101
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=V, max_position_embeddings=256)
BUCKETS = [48, 96]
PARAMS = [SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_p=0.9),
          SamplingParams(temperature=1.3, top_k=7, min_p=0.05), SamplingParams(temperature=0.5),
          SamplingParams(temperature=1.0, top_k=3, top_p=0.5, min_p=0.2)]


@pytest.fixture(scope="module")
def models() -> tuple[HFModel, ModelDrafter]:
    torch.manual_seed(0)
    module = LlamaForCausalLM(LlamaConfig(**TINY)).eval().double()
    target = HFModel(module)
    return target, ModelDrafter(early_exit_draft(target, 1))


@pytest.fixture(scope="module")
def backend() -> StaticBackend:
    return create_cpu({"buckets": BUCKETS, "dtype": "float64"})


def _ragged() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return torch.randint(0, V, (3, 9), generator=gen), torch.tensor([9, 1, 5])


def _graphs() -> tuple[int, int]:
    return counters["stats"]["unique_graphs"], counters["frames"]["total"]


# -- the tensor-parameter warp and the torch verify equal the core -----------------------------


def _logits(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 6, V, generator=gen, dtype=torch.float64) * 3
    logits[0, 0, :5] = logits[0, 0].max()  # ties at the argmax and at the k-th value
    logits[1, :, ::7] = float("-inf")  # masked tokens
    logits[2] = logits[2].round()  # many ties at top-k/top-p thresholds
    return logits


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_warp_tensor_equals_core_warp_for_many_params(dtype: torch.dtype) -> None:
    grid = itertools.product([0.0, 0.3, 1.0, 2.5], [None, 1, 5, V, V + 10], [None, 0.2, 0.9, 1.0],
                             [None, 0.0, 0.1, 0.6])
    for seed, (t, k, p, m) in enumerate(grid):
        params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m)
        logits = _logits(seed % 7).to(dtype)
        got = warp_tensor(logits, knobs(params, V, dtype=dtype))
        assert torch.equal(got, warp(logits, params)), params


# Eager: every output entry equals the full-sort warp's, bit for bit.
@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), spread=st.sampled_from([0.1, 1.0, 3.0, 10.0, 60.0]),
       ties=st.sampled_from(["none", "round", "few"]), masked=st.sampled_from([0.0, 0.5, 0.99]),
       temperature=st.sampled_from([0.0, 0.3, 1.0, 2.0]), top_k=st.none() | st.integers(1, V + 3),
       top_p=st.none() | TOP_P, min_p=st.none() | st.sampled_from([0.0, 0.05, 0.5, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_warp_tensor_equals_the_full_sort_warp(seed, spread, ties, masked, temperature, top_k, top_p, min_p,
                                               dtype):  # type: ignore[no-untyped-def]
    logits = torch.from_numpy(_random_logits(seed, 3, V, spread, ties, masked)).to(dtype)
    # The knobs hold top_p in the logits' dtype: a top_p that rounds to 1 there (1 - 1e-12 in
    # float32) is off in the engine. Compare on the value the engine holds.
    if top_p is not None:
        held = float(torch.tensor(top_p, dtype=dtype))
        top_p = None if held >= 1 else held
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    assert torch.equal(warp_tensor(logits, knobs(params, V, dtype=dtype)), _sorted_warp(logits, params))


def test_compiled_warp_tensor_equals_the_full_sort_warp_on_both_branches() -> None:
    # Compiled once (aot_eager keeps the eager kernels, so equality is bit for bit); peaked rows
    # are decided by the top 256 values, flat rows and k > 256 fall back to the sort.
    vocab = 1000
    compiled = torch.compile(warp_tensor, backend="aot_eager", fullgraph=True, dynamic=False)
    settings_ = [SamplingParams(top_p=0.9), SamplingParams(temperature=0.7, top_k=40, top_p=0.95),
                 SamplingParams(top_k=300), SamplingParams(top_k=50, min_p=0.1),
                 SamplingParams(temperature=0), SamplingParams(temperature=1.3),
                 SamplingParams(top_p=1 - 1e-7)]
    proven = []
    for seed, spread in enumerate([1.0, 12.0]):
        for dtype in (torch.float32, torch.float64):
            logits = torch.from_numpy(_random_logits(seed, 4, vocab, spread, "none", 0.0)).to(dtype)
            top_p = torch.tensor(0.9, dtype=dtype)
            proven.append(bool(_nucleus(torch.softmax(logits, -1), top_p, 256)[1].all()))
            for params in settings_:
                got = compiled(logits, knobs(params, vocab, dtype=dtype))
                assert torch.equal(got, _sorted_warp(logits, params)), (spread, dtype, params)
    assert proven == [False, False, True, True]  # both branches ran


def _verify_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    b, k = 5, 4
    q = torch.softmax(torch.randn(b, k, V, generator=gen) * 2, -1).double()
    p = torch.softmax(torch.randn(b, k + 1, V, generator=gen) * 2, -1).double()
    p[0, :k] = q[0]  # p = q: no residual mass
    p[1, :, : V // 2] = 0  # disjoint-ish supports
    p[1] /= p[1].sum(-1, keepdim=True)
    x = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(b, k)
    u = torch.rand(b, k + 1, generator=gen, dtype=torch.float64)
    u[2, 0] = 0.0
    u[3, :k] = (p[3, :k].gather(-1, x[3, :, None])[..., 0] / q[3].gather(-1, x[3, :, None])[..., 0]
                ).clamp(max=0.5)  # u * q = p exactly: rejected (strict)
    return x, q, p, u


@pytest.mark.parametrize("seed", range(40))
def test_verify_tensor_equals_core_verify(seed: int) -> None:
    x, q, p, u = _verify_inputs(seed)
    tokens, n = verify_tensor(x, q, p, u)
    want = verify(x, q, p, u, check=False)
    assert torch.equal(tokens, want.tokens) and torch.equal(n, want.num_accepted)
    law = p[:, 0].float()
    assert torch.equal(sample_tensor(law, u[:, 0]), sample(law, u[:, 0], check=False))


# -- the engine ---------------------------------------------------------------------------------


def test_parity_with_eager_torch_backend_in_float64(models, backend) -> None:  # type: ignore[no-untyped-def]
    """Same seed and uniforms: the same tokens as the core loop over the eager HFModel."""
    target, drafter = models
    ids, lengths = _ragged()
    for params, seed, eos in itertools.product(PARAMS, range(2), [None, 7]):
        run = dict(max_new_tokens=20, params=params, k=3, seed=seed, prompt_lengths=lengths,
                   eos_token_id=eos)
        got = backend.generate(target, drafter, ids, RunOptions(**run))
        want = generate(target, drafter, ids, **run)
        assert torch.equal(got.lengths, want.lengths), (params, seed, eos)
        assert torch.equal(got.sequences, want.sequences), (params, seed, eos)
        assert got.metrics.accepted == want.metrics.accepted


def test_block_verifier_and_per_row_seeds_match_the_core_loop(models, backend) -> None:  # type: ignore[no-untyped-def]
    """The compiled block rule and per-row seeds give the core loop's tokens (float64)."""
    target, drafter = models
    ids, lengths = _ragged()
    for verifier, seed in [("block", 4), ("block", [3, 1, 4]), ("token", [9, 9, 2])]:
        run = dict(max_new_tokens=16, params=PARAMS[1], k=3, seed=seed, prompt_lengths=lengths,
                   verifier=verifier)
        got = backend.generate(target, drafter, ids, RunOptions(**run))
        want = generate(target, drafter, ids, **run)
        assert torch.equal(got.sequences, want.sequences), (verifier, seed)
    with pytest.raises(ValueError, match=r"verifier: the static-cpu backend compiles \['block', 'token'\]"):
        backend.generate(target, drafter, ids, RunOptions(max_new_tokens=2, verifier=generate))


def test_zero_recompilations_after_warm_up_over_200_rounds(models, backend) -> None:  # type: ignore[no-untyped-def]
    target, drafter = models
    ids, lengths = _ragged()
    warm = RunOptions(max_new_tokens=30, k=3, prompt_lengths=lengths)
    backend.generate(target, drafter, ids, warm)  # warm-up
    before = _graphs()
    rounds, accepted = 0, set()
    for seed in range(60):
        params = PARAMS[seed % len(PARAMS)]  # also changes the sampling knobs every run
        run = RunOptions(max_new_tokens=30, k=3, seed=seed, params=params, prompt_lengths=lengths)
        for step in backend.iterate(target, drafter, ids, run):
            rounds += 1
            accepted.update(step.result.verdict.num_accepted.tolist())
        if rounds >= 200 and seed >= 2 * len(PARAMS):
            break
    assert rounds >= 200 and accepted == {0, 1, 2, 3}  # acceptance varied
    assert _graphs() == before, f"compiled again after warm-up: {before} -> {_graphs()}"


def test_changing_sampling_parameters_compiles_nothing(models, backend) -> None:  # type: ignore[no-untyped-def]
    target, drafter = models
    ids, lengths = _ragged()
    backend.generate(target, drafter, ids, RunOptions(max_new_tokens=8, k=3, prompt_lengths=lengths))
    before = _graphs()
    for t, k, p, m in [(0.0, None, None, None), (0.7, 5, None, None), (1.2, None, 0.3, None),
                       (0.9, None, None, 0.4), (2.0, 2, 0.8, 0.1)]:
        params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m)
        backend.generate(target, drafter, ids, RunOptions(
            max_new_tokens=8, k=3, params=params, prompt_lengths=lengths, eos_token_id=int(t * 10)))
    assert _graphs() == before


def test_cache_buffers_never_reallocated_between_rounds(models, backend) -> None:  # type: ignore[no-untyped-def]
    target, drafter = models
    ids, lengths = _ragged()
    engine = backend.engine(target, drafter)
    backend.generate(target, drafter, ids, RunOptions(max_new_tokens=8, k=3, prompt_lengths=lengths))
    slot = engine.slots[(3, BUCKETS[0])]
    pointers = slot.pointers()
    for seed in range(3):
        run = RunOptions(max_new_tokens=20, k=3, seed=seed, prompt_lengths=lengths)
        for step in backend.iterate(target, drafter, ids, run):
            assert step.state.tokens.data_ptr() != slot.tokens.data_ptr()  # a snapshot
            assert slot.pointers() == pointers
    assert list(engine.slots) == [(3, BUCKETS[0])]


def test_long_prompt_moves_to_next_bucket_and_beyond_last_is_an_error(models) -> None:  # type: ignore[no-untyped-def]
    # Bucket choice is independent of the compiler: Dynamo without inductor keeps this fast.
    backend = StaticBackend(name="static-cpu", device=torch.device("cpu"), dtype=torch.float64,
                            capture=CompileCapture(backend="eager"),
                            options=engine_options({"buckets": BUCKETS}, ["buckets"]))
    target, drafter = models
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (2, 40), generator=gen)
    lengths = torch.tensor([40, 12])
    run = dict(max_new_tokens=10, k=3, params=SamplingParams(temperature=0.8), prompt_lengths=lengths)
    got = backend.generate(target, drafter, ids, RunOptions(**run))  # 40 + 10 + 3 + 1 > 48: bucket 96
    assert list(backend.engine(target, drafter).slots) == [(2, 96)]
    assert torch.equal(got.sequences, generate(target, drafter, ids, **run).sequences)
    with pytest.raises(ValueError, match=r"largest bucket 96"):
        backend.generate(target, drafter, ids, RunOptions(max_new_tokens=60, k=3, prompt_lengths=lengths))


def test_a_confidence_threshold_gives_the_core_loop_tokens_without_new_graphs(models) -> None:  # type: ignore[no-untyped-def]
    """Every row drafts K in the graph and verifies its drafts up to the first one below the
    threshold (a knob): the core loop's tokens (which stops drafting early), per-row lengths
    in the metrics, and no graph compiled for another threshold."""
    target, drafter = models
    backend = create_cpu({"buckets": BUCKETS, "dtype": "float64", "compiler": "aot_eager"})
    ids, lengths = _ragged()
    run = dict(max_new_tokens=16, params=PARAMS[1], k=3, seed=[3, 1, 4], prompt_lengths=lengths)
    for threshold in (0.3, 0.6):
        sure = ModelDrafter(drafter.model, threshold=threshold)
        got = backend.generate(target, sure, ids, RunOptions(**run))
        want = generate(target, sure, ids, **run)
        assert torch.equal(got.sequences, want.sequences), threshold
        assert got.metrics.drafted == want.metrics.drafted < 3 * got.metrics.row_rounds, threshold
        assert got.metrics.accepted == want.metrics.accepted
        if threshold == 0.3:
            graphs = counters["stats"]["unique_graphs"]
    assert counters["stats"]["unique_graphs"] == graphs


def test_options_and_drafters_are_checked(models) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="unknown"):
        create_cpu({"bucket": [64]})
    with pytest.raises(ValueError, match="buckets"):
        create_cpu({"buckets": [128, 64]})
    with pytest.raises(ValueError, match="sync_every"):
        create_cpu({"sync_every": 0})
    with pytest.raises(ValueError, match=r"compiler: expected one of \['inductor', 'aot_eager'\], got 'tvm'"):
        create_cpu({"compiler": "tvm"})
    whole_round = get_backend("static-cpu", {"buckets": BUCKETS, "pieces": False})
    target, _ = models
    from specsample_backends.torch.quantized import int8_draft

    with pytest.raises(ValueError, match="int8"):
        whole_round.engine(target, ModelDrafter(int8_draft(target.derive())))


def test_int8_draft_runs_in_pieces_with_the_eager_tokens() -> None:
    """Compiled pieces call the eager path's own linears (fbgemm int8, oneDNN-packed float32)
    through one opaque op: the greedy tokens of the torch backend. (Sampled tokens may differ:
    fbgemm quantizes activations with a scale from their range, so a last-bit difference in
    a fused norm moves the draft's q, hence a drafted token under the same uniform.)"""
    from specsample_backends.torch.quantized import int8_draft

    torch.manual_seed(1)
    target = HFModel(LlamaForCausalLM(LlamaConfig(**TINY)).eval())  # float32: packed linears
    drafter = ModelDrafter(int8_draft(target))
    # aot_eager: the opaque op is traced and captured exactly as under inductor (which
    # calls it as an extern kernel), without a second cold float32 compile of the pieces.
    backend = create_cpu({"buckets": BUCKETS, "compiler": "aot_eager"})
    ids, lengths = _ragged()
    run = dict(max_new_tokens=12, k=3, seed=5, params=PARAMS[0], prompt_lengths=lengths)
    want = generate(target, drafter, ids, **run)  # type: ignore[arg-type]
    got = backend.generate(target, drafter, ids, RunOptions(**run))
    assert torch.equal(got.sequences, want.sequences)


def test_sync_every_reads_less_often_and_changes_no_token(models, backend) -> None:  # type: ignore[no-untyped-def]
    target, drafter = models
    ids, lengths = _ragged()
    slow = StaticBackend(name="static-cpu", device=backend.device, dtype=backend.dtype,
                         capture=backend.capture, options=engine_options({"sync_every": 4,
                                                                          "buckets": BUCKETS},
                                                                         ["sync_every", "buckets"]))
    slow._engines = {}
    run = dict(max_new_tokens=20, k=3, seed=1, params=PARAMS[1], prompt_lengths=lengths)
    want = backend.generate(target, drafter, ids, RunOptions(**run))
    got = slow.generate(target, drafter, ids, RunOptions(**run))
    assert torch.equal(got.sequences, want.sequences)


def test_static_inputs_give_aliased_examples_buffers_of_their_own() -> None:
    a, b = torch.zeros(2, 3), torch.ones(4)
    buffers = static_inputs((a, b, a, a[0]))
    assert buffers[0] is a and buffers[1] is b  # distinct inputs are the buffers themselves
    assert buffers[2] is not a and buffers[3] is not a and torch.equal(buffers[2], a)
    assert len({t.untyped_storage().data_ptr() for t in buffers}) == 4
    with pytest.raises(TypeError, match=r"example: expected tensors, got list"):
        static_inputs(([1, 2],))  # type: ignore[arg-type]


def _replayed(target, drafter, ids, run):  # type: ignore[no-untyped-def]
    backend = StaticBackend(name="replay-cpu", device=torch.device("cpu"), dtype=torch.float64,
                            capture=ReplayCapture(),
                            options=engine_options({"buckets": BUCKETS}, ["buckets"]))
    return backend.generate(target, drafter, ids, RunOptions(**run)).sequences


def test_replay_capture_gives_the_core_loop_tokens(models, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The cuda backend's capture contract on CPU (`ReplayCapture`: whole-round steps recorded
    once over fixed input buffers, each call copying its inputs in; the same output tensors
    every call): the core loop's tokens. The prefill's example passes one tensor for both of
    its inputs (ids, positions); with buffers shared as given (the negative control), a
    chunk's ids are overwritten by its positions and the tokens differ."""
    from specsample_backends.static import backend as static_backend

    target, drafter = models
    ids, lengths = _ragged()
    for params in PARAMS[:2]:
        run = dict(max_new_tokens=12, k=3, seed=2, params=params, prompt_lengths=lengths)
        want = generate(target, drafter, ids, **run).sequences
        assert torch.equal(_replayed(target, drafter, ids, run), want)
    monkeypatch.setattr(static_backend, "static_inputs", tuple)
    assert not torch.equal(_replayed(target, drafter, ids, run), want)


@pytest.mark.slow
def test_smollm2_greedy_parity_and_no_recompiles() -> None:
    """The real model (30 layers): one layer graph serves every layer, so the cold compile
    takes a minute or two; greedy tokens equal the eager backend's; no recompiles after warm-up
    (also across sampling settings and a second prompt length)."""
    from specsample_backends.torch import loading

    target = loading.load_target("smollm2")
    drafter = ModelDrafter(early_exit_draft(target, 8))
    backend = create_cpu({"buckets": [128]})
    ids = torch.tensor([[1, 9690, 42, 2683, 314, 253, 1345, 30]])
    run = dict(max_new_tokens=24, k=4, params=SamplingParams(temperature=0))
    got = backend.generate(target, drafter, ids, RunOptions(**run))  # warm-up: compiles
    before = _graphs()
    again = backend.generate(target, drafter, ids[:, :5], RunOptions(**{**run, "params": SamplingParams(
        temperature=0.8, top_p=0.9)}))
    assert _graphs() == before and again.metrics.rounds > 0
    assert got.new_tokens(0) == generate(target, drafter, ids, **run).new_tokens(0)
    # Sampled with the same uniforms: the same tokens as the eager loop (float32; a uniform
    # within rounding of a CDF boundary could flip one, which this fixed case does not meet).
    eager = generate(target, drafter, ids[:, :5], **{**run, "params": SamplingParams(
        temperature=0.8, top_p=0.9)})
    assert again.new_tokens(0) == eager.new_tokens(0)
