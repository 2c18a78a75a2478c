"""The gaudi backend: a clear error without habana, and a wiring test with a recording stand-in.

The stand-in records calls to a fake `habana_frameworks.torch` injected into
sys.modules; it checks how the engine drives the HPU API (graphs wrapped once
per step, mark_step once per round), not how an HPU behaves. The hpu-marked
test runs only on a Gaudi machine.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch
from specsample_backends.torch import HFModel
from specsample_backends.torch.early_exit import early_exit_draft
from transformers import LlamaConfig, LlamaForCausalLM

from specsample.drafters import ModelDrafter
from specsample.generate import generate
from specsample.params import SamplingParams
from specsample.registry import get_backend

HABANA = importlib.util.find_spec("habana_frameworks") is not None


@pytest.mark.skipif(HABANA, reason="habana_frameworks is installed here")
def test_without_habana_the_error_names_what_to_install() -> None:
    assert "habana_frameworks" not in sys.modules
    with pytest.raises(ImportError, match=r"Intel Gaudi software stack.*habana-frameworks.*optimum-habana"):
        get_backend("gaudi")


def _stand_in(calls: list[str]) -> dict[str, types.ModuleType]:
    """A fake habana_frameworks.torch whose wrap_in_hpu_graph runs the module eagerly on CPU."""
    hpu = types.ModuleType("habana_frameworks.torch.hpu")
    core = types.ModuleType("habana_frameworks.torch.core")

    def wrap_in_hpu_graph(module: torch.nn.Module) -> torch.nn.Module:
        calls.append(f"wrap:{type(module).__name__}")
        return module

    hpu.wrap_in_hpu_graph = wrap_in_hpu_graph  # type: ignore[attr-defined]
    hpu.is_available = lambda: True  # type: ignore[attr-defined]
    core.mark_step = lambda: calls.append("mark_step")  # type: ignore[attr-defined]
    root, pt = types.ModuleType("habana_frameworks"), types.ModuleType("habana_frameworks.torch")
    root.torch, pt.hpu, pt.core = pt, hpu, core  # type: ignore[attr-defined]
    return {"habana_frameworks": root, "habana_frameworks.torch": pt,
            "habana_frameworks.torch.hpu": hpu, "habana_frameworks.torch.core": core}


@pytest.mark.skipif(HABANA, reason="habana_frameworks is installed here")
def test_wiring_with_a_recording_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wiring test, not evidence of HPU behaviour: wrapped once per step, mark_step per round."""
    calls: list[str] = []
    for name, module in _stand_in(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "optimum.habana.transformers.modeling_utils", None)
    backend = get_backend("gaudi", {"device": "cpu", "dtype": "float64", "buckets": [64]})
    assert backend.name == "gaudi" and calls == []
    torch.manual_seed(0)
    target = HFModel(LlamaForCausalLM(LlamaConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=53)).eval().double())
    drafter = ModelDrafter(early_exit_draft(target, 1))
    ids = torch.randint(0, 53, (2, 7))
    rounds = []
    for run in range(2):
        steps = list(backend.iterate(target, drafter, ids, max_new_tokens=12, k=2, seed=run,
                                     params=SamplingParams(temperature=0.9)))
        rounds.append(len(steps))
    assert calls.count("wrap:PrefillStep") == 1 and calls.count("wrap:RoundStep") == 1
    assert calls.count("mark_step") == sum(rounds) + len(rounds)  # each round, and each prefill
    got = backend.generate(target, drafter, ids, max_new_tokens=12, k=2, seed=5,
                           params=SamplingParams(temperature=0.9))
    want = generate(target, drafter, ids, max_new_tokens=12, k=2, seed=5,
                    params=SamplingParams(temperature=0.9))
    assert torch.equal(got.sequences, want.sequences)


@pytest.mark.hpu
@pytest.mark.skipif(not HABANA, reason="needs an Intel Gaudi device (habana_frameworks not installed)")
def test_on_hpu_greedy_tokens_equal_eager() -> None:
    backend = get_backend("gaudi", {"buckets": [128], "dtype": "float32"})
    target = backend.load_target("smollm2")
    drafter = backend.load_drafter("early-exit:8", target)
    ids = backend.asarray([[1, 9690, 42, 2683, 314, 253, 1345, 30]])
    run = dict(max_new_tokens=16, k=4, params=SamplingParams(temperature=0))
    got = backend.generate(target, drafter, ids, **run)
    assert got.new_tokens(0) == generate(target, drafter, ids, **run).new_tokens(0)
