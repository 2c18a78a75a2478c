"""Architectures beside Llama on the fast path and the static engine: Qwen2, Mistral, Gemma.

Tiny random-weight models built offline from transformers configs (norm weights and
biases perturbed so that Gemma's norm offset and Qwen2's QKV biases matter; prompts
longer than Mistral's sliding window). Logits are compared with transformers' eager
forward in float64 (max abs difference printed), greedy tokens of `static-cpu` with the
argmax of transformers' eager forward and with the torch backend, and the compiled
pieces must not recompile after warm-up. Negative controls: dropping the window or
the norm offset moves the logits far beyond the tolerance.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from specsample_backends.static import create_cpu
from specsample_backends.torch import HFModel
from specsample_backends.torch.early_exit import early_exit_draft
from torch._dynamo.utils import counters
from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from specsample.core.params import SamplingParams
from specsample.drafters.model import ModelDrafter
from specsample.engine.generate import generate
from specsample.engine.options import RunOptions

V = 61
SHAPE = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=V, max_position_embeddings=128,
             attn_implementation="eager")
MODELS = {
    "llama": (LlamaForCausalLM, LlamaConfig(**SHAPE)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**SHAPE)),
    "mistral": (MistralForCausalLM, MistralConfig(**SHAPE, sliding_window=5)),
    "gemma": (GemmaForCausalLM, GemmaConfig(**SHAPE, head_dim=8)),
}
TOLERANCE = 1e-5  # float64 weights, but RMSNorm normalises in float32 (as transformers does)


def _model(name: str) -> torch.nn.Module:
    cls, config = MODELS[name]
    torch.manual_seed(0)
    module = cls(config).eval().double()
    with torch.no_grad():
        for param in module.parameters():
            if param.ndim == 1:  # norm scales and biases: away from their 1 / 0 initial values
                param.add_(0.3 * torch.randn_like(param))
            else:
                param.mul_(4)  # logits with spread, so greedy tokens are far from ties
    return module


def _prompt() -> torch.Tensor:
    return torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))


def _max_diff(model: HFModel, module: torch.nn.Module, ids: torch.Tensor) -> float:
    logits, _ = model.forward(ids, model.new_cache(ids.shape[0], ids.shape[1] + 1))
    with torch.no_grad():
        want = module(input_ids=ids).logits
    return float((logits - want).abs().max())


@pytest.mark.parametrize("name", list(MODELS))
def test_fast_path_logits_equal_transformers_eager_in_float64(name: str) -> None:
    module = _model(name)
    model = HFModel(module)
    assert model.stack is not None, name
    diff = _max_diff(model, module, _prompt())
    print(f"{name}: max |logits - transformers eager| = {diff:.2e} (float64)")
    assert diff < TOLERANCE, (name, diff)


@pytest.mark.parametrize(("name", "change"), [("mistral", {"window": None}),
                                              ("gemma", {"norm_offset": 0.0}),
                                              ("gemma", {"embed_scale": 1.0})])
def test_negative_controls_each_architecture_setting_matters(name: str, change: dict[str, object]) -> None:
    module = _model(name)
    model = HFModel(module)
    assert model.stack is not None
    model.stack = dataclasses.replace(model.stack, **change)  # type: ignore[arg-type]
    assert _max_diff(model, module, _prompt()) > 1e-3, (name, change)


def test_unsupported_architectures_are_clear_errors() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=V)).eval()
    supported = r"\['GemmaForCausalLM', 'LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM'\]"
    with pytest.raises(ValueError, match=rf"supported architecture: expected one of {supported}, "
                                         rf"got GPT2LMHeadModel"):
        HFModel(gpt2, fast=True)
    assert HFModel(gpt2).stack is None  # the generic path still runs it
    with pytest.raises(ValueError, match=rf"static engine needs an HFModel on the fast path \(one of "
                                         rf"{supported}\), got GPT2LMHeadModel"):
        create_cpu({"buckets": [32]}).engine(HFModel(gpt2), ModelDrafter(HFModel(gpt2)))
    windowed = Qwen2ForCausalLM(Qwen2Config(**SHAPE, use_sliding_window=True, max_window_layers=1))
    with pytest.raises(ValueError, match=r"full attention in every layer, got layer_types with "
                                         r"sliding_attention \(Qwen2ForCausalLM\)"):
        HFModel(windowed, fast=True)


@pytest.mark.parametrize("name", ["qwen2", "mistral", "gemma"])
def test_static_cpu_greedy_equals_transformers_and_the_torch_backend_without_recompiles(
        name: str) -> None:
    # The engine's graphs of each architecture, traced and captured as static-cpu does, run
    # with eager kernels (aot_eager): what differs between architectures is the traced code;
    # inductor's kernels are exercised on SmolLM2 (tests/test_backend_static.py), and a cold
    # inductor compile per architecture would cost minutes of the suite.
    module = _model(name)
    target = HFModel(module)
    drafter = ModelDrafter(early_exit_draft(target, 1))
    backend = create_cpu({"dtype": "float64", "buckets": [48], "compiler": "aot_eager"})
    ids = _prompt()
    greedy = dict(max_new_tokens=10, k=3, params=SamplingParams(temperature=0))
    got = backend.generate(target, drafter, ids, RunOptions(**greedy))
    want = generate(target, drafter, ids, **greedy)
    assert torch.equal(got.sequences, want.sequences), name
    # Every greedy token is the argmax of transformers' eager forward over the whole sequence
    # (no cache). Not its cached `generate`: for this Mistral (window 5) transformers' own
    # generate departs from its full forward after a few tokens, ours does not.
    with torch.no_grad():
        full = module(input_ids=got.sequences).logits.argmax(-1)  # [B, T]
    assert torch.equal(full[:, ids.shape[1] - 1: -1], got.sequences[:, ids.shape[1]:]), name
    graphs = counters["stats"]["unique_graphs"]
    again = backend.generate(target, drafter, ids[:, :9], RunOptions(
        max_new_tokens=10, k=3, seed=4, params=SamplingParams(temperature=0.8, top_p=0.9)))
    assert counters["stats"]["unique_graphs"] == graphs and again.metrics.rounds > 0, name
    sampled = generate(target, drafter, ids[:, :9], max_new_tokens=10, k=3, seed=4,
                       params=SamplingParams(temperature=0.8, top_p=0.9))
    assert torch.equal(again.sequences, sampled.sequences), name
