"""The gaudi backend on CPU through a stand-in bridge that enforces Intel's documented rules.

The stand-in (`gaudi_stand_in`) is not evidence of HPU behaviour or speed: it makes
a step that breaks a documented rule (HPU graphs in eager mode, compile in lazy
mode, CPU ops, data-dependent control flow, dynamic shapes, in-place view updates)
fail here. The hpu-marked test runs only on a Gaudi machine.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from gaudi_stand_in import Bridge, RuleError, hpu_graph_rules, install
from specsample_backends.gaudi import HpuGraphCapture, check_capture, lazy_mode
from specsample_backends.gaudi.rules import inplace_view_updates, written_args
from specsample_backends.static import CompileCapture
from specsample_backends.static.pieces import FeatureStep, HeadOutputStep, LayerStep, layer_weights
from specsample_backends.torch import HFModel
from specsample_backends.torch.early_exit import early_exit_draft
from specsample_backends.torch.head import DraftHead, HeadModel
from torch.fx.experimental.proxy_tensor import make_fx
from transformers import LlamaConfig, LlamaForCausalLM

from specsample.api.registry import get_backend
from specsample.core.params import SamplingParams
from specsample.drafters.head import HeadDrafter
from specsample.drafters.model import ModelDrafter
from specsample.engine.generate import generate
from specsample.engine.options import RunOptions

HABANA = importlib.util.find_spec("habana_frameworks") is not None
no_habana = pytest.mark.skipif(HABANA, reason="habana_frameworks is installed here")
V = 53
TINY = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=V, max_position_embeddings=128)
OPTIONS = {"device": "cpu", "dtype": "float64", "buckets": [64]}
RUNS = [dict(max_new_tokens=12, k=2, seed=5, params=SamplingParams(temperature=0.9)),
        dict(max_new_tokens=10, k=3, seed=1, params=SamplingParams(temperature=0))]


@pytest.fixture(scope="module")
def models() -> tuple[HFModel, ModelDrafter]:
    torch.manual_seed(0)
    target = HFModel(LlamaForCausalLM(LlamaConfig(**TINY)).eval().double())
    return target, ModelDrafter(early_exit_draft(target, 1))


def _prompt() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return torch.randint(0, V, (2, 7), generator=gen), torch.tensor([7, 3])


@pytest.fixture(scope="module")
def static_cpu_tokens(models: tuple[HFModel, ModelDrafter]) -> list[torch.Tensor]:
    """What `static-cpu` emits for RUNS, the reference both capture modes must meet: in
    float64 that is the eager core loop's tokens (test_backend_static checks the equality),
    which cost no compile here."""
    target, drafter = models
    ids, lengths = _prompt()
    return [generate(target, drafter, ids, prompt_lengths=lengths, **run).sequences  # type: ignore[arg-type]
            for run in RUNS]


@no_habana
def test_without_habana_the_error_names_what_to_install() -> None:
    assert "habana_frameworks" not in sys.modules
    with pytest.raises(ImportError, match=r"Intel Gaudi software stack.*habana-frameworks.*optimum-habana"):
        get_backend("gaudi")


# -- the process's mode, and the capture that fits it ------------------------------------------


@no_habana
def test_lazy_mode_asks_the_bridge_first_then_reads_the_variable_as_the_bridge_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for value, lazy in ((None, False), ("0", False), ("1", True), ("true", True)):
        environ = {} if value is None else {"PT_HPU_LAZY_MODE": value}
        assert lazy_mode(environ) is lazy, value
    install(monkeypatch, Bridge(lazy=True))
    assert lazy_mode({"PT_HPU_LAZY_MODE": "0"}) is True  # the bridge knows its release's default
    with pytest.raises(TypeError, match="environ: expected a mapping"):
        lazy_mode("PT_HPU_LAZY_MODE=1")  # type: ignore[arg-type]


def test_check_capture_names_the_variable_and_the_fix_in_both_directions() -> None:
    with pytest.raises(ValueError, match=r"'hpu-graphs'.*lazy mode.*eager mode.*PT_HPU_LAZY_MODE=1.*"
                                         r"capture = 'compile'"):
        check_capture("hpu-graphs", lazy=False)
    with pytest.raises(ValueError, match=r"'compile'.*lazy mode \(PT_HPU_LAZY_MODE=1\).*"
                                         r"PT_HPU_LAZY_MODE=0.*capture = 'hpu-graphs'"):
        check_capture("compile", lazy=True)
    with pytest.raises(ValueError, match=r"capture: expected one of \['compile', 'hpu-graphs'\], got 'x'"):
        check_capture("x", lazy=True)
    assert check_capture("compile", lazy=False) == "compile"
    assert check_capture("hpu-graphs", lazy=True) == "hpu-graphs"


@no_habana
@pytest.mark.parametrize(("lazy", "capture"), [(False, "hpu-graphs"), (True, "compile"), (True, None)])
def test_a_capture_the_mode_does_not_run_fails_when_the_backend_is_created(
        monkeypatch: pytest.MonkeyPatch, lazy: bool, capture: str | None) -> None:
    """Before any model is loaded; the default capture is "compile" (so lazy mode needs an
    explicit "hpu-graphs")."""
    bridge = install(monkeypatch, Bridge(lazy=lazy))
    options = {**OPTIONS, **({} if capture is None else {"capture": capture})}
    with pytest.raises(ValueError, match=r"this process runs.*PT_HPU_LAZY_MODE.*Fix: start Python "
                                         r"with PT_HPU_LAZY_MODE=[01]"):
        get_backend("gaudi", options)
    assert bridge.calls == []


@no_habana
def test_options_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, Bridge(lazy=True))
    with pytest.raises(ValueError, match=r"capture: expected one of"):
        get_backend("gaudi", {"capture": "graphs"})
    with pytest.raises(ValueError, match=r"pieces, strict: options of capture 'compile' only"):
        get_backend("gaudi", {"capture": "hpu-graphs", "pieces": False})
    with pytest.raises(ValueError, match=r"pieces: expected a bool"):
        get_backend("gaudi", {"capture": "compile", "pieces": 1})
    with pytest.raises(ValueError, match=r"unknown \['bucket'\]"):
        get_backend("gaudi", {"bucket": [64]})
    eager = get_backend("gaudi", {"capture": "hpu-graphs"})
    assert isinstance(eager.capture, HpuGraphCapture) and eager.device == torch.device("hpu")


# -- the stand-in's rules bite ----------------------------------------------------------------


class _Step(torch.nn.Module):
    def __init__(self, body: Callable[[torch.Tensor, torch.Tensor], Any]) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor, buffer: torch.Tensor) -> Any:
        return self.body(x, buffer)


def _branch(x: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    return x + 1 if x.sum() > 0 else x - 1


def _loop(x: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    for _ in range(x[0].long()):
        x = x * 2
    return x


def _view_write(x: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    buffer[:, 1:3].copy_(x[:, :2])  # cache[:, pos:pos+T] = k
    return buffer


BROKEN = [(_branch, r"data-dependent control flow"),
          (_loop, r"CPU ops are not supported \(Tensor.__index__"),
          (lambda x, b: x.sum().item(), r"CPU ops are not supported \(Tensor.item"),
          (lambda x, b: x.tolist(), r"CPU ops are not supported \(Tensor.tolist"),
          (lambda x, b: x.cpu(), r"CPU ops are not supported \(Tensor.cpu"),
          (lambda x, b: x.nonzero(), r"dynamic shapes are not supported \(aten.nonzero"),
          (_view_write, r"in-place view updates is not supported \(aten.copy_"),
          (lambda x, b: b.view(-1).index_copy_(0, torch.tensor([0]), x[0, :1]),
           r"in-place view updates is not supported \(aten.index_copy_")]


@pytest.mark.parametrize(("body", "rule"), BROKEN)
def test_each_documented_hpu_graph_rule_broken_on_purpose_fails_with_the_rule(
        body: Callable[..., Any], rule: str) -> None:
    step = Bridge(lazy=True).wrap_in_hpu_graph(_Step(body))
    with pytest.raises(RuleError, match=rf"HPU Graphs rule: .*{rule}.*docs.habana.ai"):
        step(torch.ones(2, 4), torch.zeros(2, 5))


def test_the_rules_pass_whole_buffer_writes_and_the_modes_are_enforced_by_the_stand_in() -> None:
    def whole(x: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(2)[:, None]
        buffer.index_put_((rows, torch.tensor([[1, 2], [0, 3]])), x[:, :2])
        buffer.index_copy_(1, torch.tensor([4]), x[:, 3:])
        return buffer.scatter_(1, torch.tensor([[0], [1]]), x[:, :1])

    buffer = torch.zeros(2, 5)
    Bridge(lazy=True).wrap_in_hpu_graph(_Step(whole))(torch.ones(2, 4), buffer)
    assert buffer.sum() == 8
    with pytest.raises(RuleError, match=r"supported with lazy mode, eager mode is currently not"):
        Bridge(lazy=False).wrap_in_hpu_graph(_Step(whole))
    with pytest.raises(RuleError, match=r"hpu_backend rule: torch.compile runs in eager mode"):
        Bridge(lazy=True).compile_backend(torch.fx.symbolic_trace(_Step(lambda x, b: x)), [])


# -- both modes run the static engine through the stand-in ------------------------------------


@no_habana
def test_hpu_graphs_mode_wraps_each_step_once_and_emits_the_static_cpu_tokens(
        monkeypatch: pytest.MonkeyPatch, models: tuple[HFModel, ModelDrafter],
        static_cpu_tokens: list[torch.Tensor]) -> None:
    bridge = install(monkeypatch, Bridge(lazy=True))
    backend = get_backend("gaudi", {**OPTIONS, "capture": "hpu-graphs"})
    target, drafter = models
    ids, lengths = _prompt()
    rounds = []
    for run, want in zip(RUNS, static_cpu_tokens, strict=True):
        steps = list(backend.iterate(target, drafter, ids, RunOptions(prompt_lengths=lengths, **run)))
        rounds.append(len(steps))
        got = backend.generate(target, drafter, ids, RunOptions(prompt_lengths=lengths, **run))
        assert torch.equal(got.sequences, want), run
    assert bridge.calls.count("wrap:PrefillStep") == 1
    assert bridge.calls.count("wrap:RoundStep") == 2  # one per K
    assert bridge.calls.count("mark_step") == 2 * (sum(rounds) + len(rounds))  # rounds and prefills
    assert "compile" not in bridge.calls


@no_habana
def test_compile_mode_runs_the_pieces_under_hpu_backend_with_the_static_cpu_tokens(
        monkeypatch: pytest.MonkeyPatch, models: tuple[HFModel, ModelDrafter],
        static_cpu_tokens: list[torch.Tensor]) -> None:
    """No recompiles after warm-up: the second pass adds no graph, and the strict guard
    (`fail_on_recompile`) is on."""
    bridge = install(monkeypatch, Bridge(lazy=False))
    backend = get_backend("gaudi", OPTIONS)
    assert isinstance(backend.capture, CompileCapture) and backend.capture.backend == "hpu_backend"
    assert backend.capture.strict and backend.capture.pieces
    target, drafter = models
    ids, lengths = _prompt()
    for _ in range(2):
        for run, want in zip(RUNS, static_cpu_tokens, strict=True):
            got = backend.generate(target, drafter, ids, RunOptions(prompt_lengths=lengths, **run))
            assert torch.equal(got.sequences, want), run
        warm = len(bridge.graphs)
    assert warm == len(bridge.graphs) > 0 and not bridge.wrapped and "mark_step" not in bridge.calls


def _head(target: HFModel) -> HeadDrafter:
    """A draft head over every other id, from the target's last layer, perturbed."""
    torch.manual_seed(1)
    head = DraftHead(target, vocab=torch.arange(0, V, 2))
    with torch.no_grad():
        for weight in head.parameters():
            weight.add_(torch.randn_like(weight) * 0.05)
    return HeadDrafter(HeadModel(head))


def test_compile_mode_runs_a_draft_head_with_the_core_tokens_and_hpu_graphs_refuse_it(
        monkeypatch: pytest.MonkeyPatch, models: tuple[HFModel, ModelDrafter]) -> None:
    """A feature-level draft head's pieces under hpu_backend: the core loop's tokens, and no
    graph added by a second pass. HPU graphs capture whole rounds, which cannot hold a head:
    a clear error when the engine is built."""
    bridge = install(monkeypatch, Bridge(lazy=False))
    backend = get_backend("gaudi", OPTIONS)
    target, _ = models
    drafter = _head(target)
    ids, lengths = _prompt()
    for _ in range(2):
        for run in RUNS:
            got = backend.generate(target, drafter, ids, RunOptions(prompt_lengths=lengths, **run))
            want = generate(target, drafter, ids, prompt_lengths=lengths, **run)  # type: ignore[arg-type]
            assert torch.equal(got.sequences, want.sequences), run
        warm = len(bridge.graphs)
    assert warm == len(bridge.graphs) > 0
    install(monkeypatch, Bridge(lazy=True))
    graphs = get_backend("gaudi", {**OPTIONS, "capture": "hpu-graphs"})
    with pytest.raises(ValueError, match="compiled pieces"):
        graphs.engine(target, drafter)


def test_the_head_pieces_write_whole_buffers_never_a_view(models: tuple[HFModel, ModelDrafter]) -> None:
    target, _ = models
    stack = target.stack
    assert stack is not None
    batch, width, capacity, dim = 2, 3, 16, int(stack.embed.shape[1])
    positions = torch.tensor([[3, 4, 5], [0, 1, 2]])
    x = torch.randn(batch, width, dim, dtype=torch.float64)
    head = _head(target).head
    out, ids = head.projection
    from specsample_backends.torch import opaque

    cases = [(FeatureStep(stack), (x, stack.norm.detach(), positions)),
             (HeadOutputStep(head.stack, int(ids.shape[0])),
              (x[:, :1].clone(), positions[:, :1].clone(), torch.tensor([3, 0]), opaque.key_of(out), ids))]
    for step, args in cases:
        def run(features: torch.Tensor, *rest: torch.Tensor, step: Any = step) -> Any:
            if isinstance(step, FeatureStep):
                return step(rest[0], rest[1], rest[2], features)
            return step(rest[0], rest[1], features, *rest[2:])

        features = torch.zeros(batch, capacity, dim, dtype=torch.float64)
        with hpu_graph_rules():  # also follows the HPU-graph rules when run eagerly
            run(features, *args)
        assert features.abs().sum() > 0
        graph = make_fx(run)(torch.zeros(batch, capacity, dim, dtype=torch.float64), *args)
        writes = [str(n.target) for n in graph.graph.nodes if written_args(n.target)]
        assert writes == ["aten.index_put_.default"] and inplace_view_updates(graph) == [], type(step)


# -- the captured steps' K/V writes -------------------------------------------------------------


@no_habana
def test_the_steps_in_hpu_graphs_write_whole_buffers_never_a_view(
        monkeypatch: pytest.MonkeyPatch, models: tuple[HFModel, ModelDrafter]) -> None:
    """The aten graphs of PrefillStep and RoundStep (make_fx, mutations kept) write K/V and
    state in place, and no write goes through a view; the inspector finds a view write
    (negative control)."""
    bridge = install(monkeypatch, Bridge(lazy=True))
    backend = get_backend("gaudi", {**OPTIONS, "capture": "hpu-graphs"})
    target, drafter = models
    ids, lengths = _prompt()
    backend.generate(target, drafter, ids, RunOptions(prompt_lengths=lengths, **RUNS[0]))
    slot = next(iter(backend.engine(target, drafter).slots.values()))
    examples = {"PrefillStep": (ids.clone(), torch.arange(7).expand(2, 7).clone()),
                "RoundStep": (slot.uniforms[2], slot.knob, slot.eos)}
    for step in bridge.wrapped:
        graph = make_fx(step)(*examples[type(step).__name__])
        writes = {str(n.target) for n in graph.graph.nodes if written_args(n.target)}
        assert "aten.scatter_.src" in writes, (type(step).__name__, writes)
        assert inplace_view_updates(graph) == [], type(step).__name__
    viewed = make_fx(_view_write)(torch.ones(2, 4), torch.zeros(2, 5))
    assert inplace_view_updates(viewed) == ["aten.copy_.default(slice_1 <- aten.slice.Tensor)"]


def test_the_compiled_layer_piece_writes_whole_buffers_never_a_view(
        models: tuple[HFModel, ModelDrafter]) -> None:
    target, _ = models
    stack = target.stack
    assert stack is not None
    batch, width, capacity = 2, 3, 16
    kv = [torch.zeros(batch, stack.kv_heads, capacity, stack.head_dim, dtype=torch.float64)
          for _ in range(2)]
    x = torch.randn(batch, width, 32, dtype=torch.float64)
    cos = torch.ones(batch, 1, width, stack.head_dim, dtype=torch.float64)
    positions = torch.tensor([[[3, 4, 5]], [[0, 1, 2]]])
    mask = torch.ones(batch, 1, 2 * width, capacity, dtype=torch.bool)
    with hpu_graph_rules():  # also follows the HPU-graph rules when run eagerly
        LayerStep(stack)(x, cos, 0 * cos, positions, mask, *kv, *layer_weights(stack.layers[0]))
    graph = make_fx(LayerStep(stack))(x, cos, 0 * cos, positions, mask, *kv,
                                      *layer_weights(stack.layers[0]))
    writes = [str(n.target) for n in graph.graph.nodes if written_args(n.target)]
    assert writes == ["aten.index_put_.default"] * 2 and inplace_view_updates(graph) == []
    assert kv[0][0, :, 3:6].abs().sum() > 0 and kv[0][0, :, :3].abs().sum() == 0


@pytest.mark.hpu
@pytest.mark.skipif(not HABANA, reason="needs an Intel Gaudi device (habana_frameworks not installed)")
def test_on_hpu_greedy_tokens_equal_eager() -> None:
    capture = "hpu-graphs" if lazy_mode() else "compile"
    backend = get_backend("gaudi", {"buckets": [128], "dtype": "float32", "capture": capture})
    target = backend.load_target("smollm2")
    drafter = backend.load_drafter("early-exit:8", target)
    ids = backend.asarray([[1, 9690, 42, 2683, 314, 253, 1345, 30]])
    run = dict(max_new_tokens=16, k=4, params=SamplingParams(temperature=0))
    got = backend.generate(target, drafter, ids, RunOptions(**run))
    assert got.new_tokens(0) == generate(target, drafter, ids, **run).new_tokens(0)


# -- the device check, end to end through the stand-in ------------------------------------------


def test_the_checks_law_test_passes_the_exact_law_and_fails_a_wrong_one(
        models: tuple[HFModel, ModelDrafter]) -> None:
    """n = 2000 first tokens on 8 outcomes, alpha = 1e-3: a sampler of the exact law fails with
    probability <= 2e-3 (TV bound + G-test level); always the likeliest token is at TV > 0.8,
    far above the detectable TV (about 0.13), so it fails except with probability <= 1e-3."""
    from specsample_backends.gaudi.check import law

    from specsample.core.warp import warp

    target, _ = models
    ids = [3, 14, 15, 9]
    exact = warp(target.forward(torch.tensor([ids]), target.new_cache(1, 5))[0][0, -1],
                 SamplingParams(temperature=1.0)).numpy()
    rng = np.random.default_rng(0)
    right = law(lambda rows, seed: rng.choice(V, size=rows, p=exact / exact.sum()), target, ids,
                n=2000, rows=500, alpha=1e-3)
    wrong = law(lambda rows, seed: np.full(rows, int(exact.argmax())), target, ids, n=2000, rows=500,
                alpha=1e-3)
    assert right.passed and not wrong.passed and wrong.tv > 0.8 > 0.2 > wrong.detectable_tv


@no_habana
@pytest.mark.slow
@pytest.mark.parametrize(("lazy", "capture"), [(False, "compile"), (True, "hpu-graphs")])
def test_device_check_runs_end_to_end_and_prints_its_table(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str],
        lazy: bool, capture: str) -> None:
    """A tiny random Llama with SmolLM2's tokenizer, saved as a model directory; the check's
    defaults shrunk (n=200 first tokens: the law test's false-failure bound is alpha=1e-3).
    The capture follows the stand-in bridge's mode."""
    from specsample_backends.gaudi import check
    from specsample_backends.torch import loading

    tokenizer = loading.load_tokenizer("smollm2")
    tokenizer.save_pretrained(tmp_path)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**{**TINY, "vocab_size": len(tokenizer)})).save_pretrained(tmp_path)
    bridge = install(monkeypatch, Bridge(lazy=lazy))
    status = check.main(["--target", str(tmp_path), "--drafter", "early-exit:1", "--device", "cpu",
                         "--new", "6", "--n", "200", "--rows", "100", "--repeats", "1"])
    out = capsys.readouterr().out
    table = out[out.index(f"gaudi check: capture {capture} (PT_HPU_LAZY_MODE={int(lazy)})"):].splitlines()
    assert [line[: check.WIDTH].strip() for line in table[1:]] == [
        "parity: greedy = CPU float32", "law: first token, n=200", "recompiles after warm-up",
        f"tokens/s this engine ({capture})", "tokens/s transformers assisted",
        "tokens/s transformers plain generate", "RESULT: PASS"], out
    assert "0 other" in table[1] and "PASS TV" in table[2] and table[3].endswith(
        "0 Dynamo graphs, n/a device compilations")
    assert all(float(line[check.WIDTH:]) > 0 for line in table[4:7]), table
    assert status == 0 and bool(bridge.graphs) != lazy and bool(bridge.wrapped) == lazy


# -- the front door -----------------------------------------------------------------------------


@no_habana
@pytest.mark.slow
def test_the_front_door_runs_the_gaudi_engine_from_a_config(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """`specsample.load(config)` with backend "gaudi" (HPU graphs, through the stand-in) runs
    the static engine and gives the torch backend's greedy text for the same config."""
    from specsample_backends.torch import loading

    import specsample
    from specsample import Config

    loading.load_tokenizer("smollm2").save_pretrained(tmp_path)
    torch.manual_seed(0)
    vocab = len(loading.load_tokenizer("smollm2"))
    LlamaForCausalLM(LlamaConfig(**{**TINY, "vocab_size": vocab})).save_pretrained(tmp_path)
    bridge = install(monkeypatch, Bridge(lazy=True))
    common = dict(target=str(tmp_path), draft="early-exit:1", temperature=0.0, k=2)
    gaudi = specsample.load(Config(backend="gaudi", **common, options={  # type: ignore[arg-type]
        **OPTIONS, "capture": "hpu-graphs"}))
    eager = specsample.load(Config(backend="torch", **common,  # type: ignore[arg-type]
                                   options={"dtype": "float64"}))
    got = gaudi.generate(["Once upon a time"], max_new_tokens=8)
    want = eager.generate(["Once upon a time"], max_new_tokens=8)
    assert got.new_tokens(0) == want.new_tokens(0) and got.texts == want.texts
    assert bridge.calls.count("wrap:RoundStep") == 1 and "mark_step" in bridge.calls
