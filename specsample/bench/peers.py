"""transformers' own generation as peers: plain `generate` and assisted generation, same draft."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import time
from collections.abc import Mapping
from typing import Any

from specsample.api.draft_names import split_name
from specsample.core.params import SamplingParams
from specsample.core.protocols import Drafter, Model
from specsample.drafters.hybrid import HybridDrafter

__all__ = ["HFVariant", "hf_generate", "hf_module", "hf_sampling", "hf_variants", "int8_assistant",
           "quiet_transformers"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class HFVariant:
    """One way to call transformers' `generate`.

    `holder.generation_config` is replaced by `config` for the run and restored
    after it (transformers reads an assistant's settings from there, and its
    "heuristic" schedule writes back into it).
    """

    name: str
    k: int | str
    kwargs: Mapping[str, Any]
    holder: Any = None
    config: Any = None


def hf_module(model: Any) -> Any:
    """The transformers module behind a backend model (its `module` with `generate`), or None."""
    module = getattr(model, "module", None)
    return module if hasattr(module, "generate") else None


def int8_assistant(module: Any) -> Any:
    """A dynamically quantized (int8 linears, fbgemm) copy of an HF module: an assistant_model.

    The torch backend's int8 self-draft is a fast-path stack, not an HF module,
    so the peer gets the same quantization of a copy (tied weights are untied).
    """
    import torch

    # Imported by name, as the registry imports backends: the core never imports them statically.
    quantize = importlib.import_module("specsample_backends.torch.quantized").quantize
    if next(module.parameters()).device.type != "cpu":
        raise ValueError("draft: the int8 assistant for transformers runs on CPU only")
    clone = copy.deepcopy(module)
    if next(clone.parameters()).dtype != torch.float32:
        clone = clone.to(torch.float32)
    quantized: Any = quantize(clone)
    return quantized


def _assistant_variants(holder: Any, kwargs: Mapping[str, Any], k: int | None) -> list[HFVariant]:
    base = copy.deepcopy(holder.generation_config)
    variants = [HFVariant(name="hf_default", k="hf-default", kwargs=kwargs, holder=holder, config=base)]
    if k is not None:
        fixed = copy.deepcopy(base)
        fixed.num_assistant_tokens, fixed.num_assistant_tokens_schedule = k, "constant"
        variants.append(HFVariant(name=f"hf_k{k}", k=k, kwargs=kwargs, holder=holder, config=fixed))
    return variants


def hf_variants(draft: str, target: Model, drafter: Drafter, k: int | None) -> list[HFVariant]:
    """transformers' assisted generation with the same draft (empty when it has no equivalent).

    Args:
        draft: the drafter's name ("int8", "early-exit:N", "lookup", "head[:FILE]" or a model
            spec).
        target: the backend's target (an HF module behind it, or no peer).
        drafter: the backend's drafter (a separate draft model's module is the assistant).
        k: the constant K, for a variant with K fixed (None: transformers' schedule only).
    """
    if not isinstance(draft, str):
        raise TypeError(f"draft: expected a drafter name (str), got {type(draft).__name__}")
    module = hf_module(target)
    if module is None:
        return []
    # A confidence threshold is dropped: transformers' assistant has its own.
    kind, draft, _ = split_name(draft, default_model="int8")
    if kind is not None:  # no peer copies and drafts per row: its prompt lookup and its assistant
        model = drafter.model if isinstance(drafter, HybridDrafter) else drafter
        both = [*hf_variants("lookup", target, drafter, k), *hf_variants(draft, target, model, k)]
        return list({v.name: v for v in both}.values())  # a head's own peers hold lookup too
    if draft == "lookup":
        return [HFVariant(name=f"hf_lookup{n}", k=n, kwargs={"prompt_lookup_num_tokens": n})
                for n in dict.fromkeys([4, 10] + ([k] if k is not None else []))]
    if draft == "head" or draft.startswith("head:"):
        # transformers cannot draft from the target's features: its best settings here are
        # its prompt lookup and its assistant with the int8 self-draft.
        return [*hf_variants("lookup", target, drafter, k), *hf_variants("int8", target, drafter, k)]
    if draft == "int8":
        assistant = int8_assistant(module)
        return _assistant_variants(assistant, {"assistant_model": assistant}, k)
    if draft.startswith("early-exit:"):  # LayerSkip: the target drafts with its first N layers
        return _assistant_variants(module, {"assistant_early_exit": int(draft.split(":")[1])}, k)
    assistant = hf_module(getattr(drafter, "model", None))
    return [] if assistant is None else _assistant_variants(assistant, {"assistant_model": assistant}, k)


def hf_sampling(params: SamplingParams) -> dict[str, Any]:
    """`generate` keyword arguments for `params` (top-k off unless set: transformers adds 50)."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params: expected SamplingParams, got {type(params).__name__}")
    if params.temperature == 0:
        return {"do_sample": False}
    extra = {} if params.min_p is None else {"min_p": params.min_p}
    return {"do_sample": True, "temperature": params.temperature,
            "top_k": params.top_k or 0, "top_p": 1.0 if params.top_p is None else params.top_p, **extra}


def hf_generate(module: Any, ids: list[int], variant: HFVariant | None, params: SamplingParams, *,
                max_new_tokens: int, seed: int, pad: int) -> tuple[int, float]:
    """(new tokens, seconds) of one transformers `generate` call, exactly `max_new_tokens` long."""
    import torch

    inputs = torch.tensor([ids], device=module.device)
    kwargs = dict(variant.kwargs) if variant is not None else {}
    saved = None
    if variant is not None and variant.holder is not None:
        saved = variant.holder.generation_config
        variant.holder.generation_config = copy.deepcopy(variant.config)
    torch.manual_seed(seed)
    try:
        began = time.perf_counter()
        with torch.inference_mode():
            out = module.generate(inputs, attention_mask=torch.ones_like(inputs),
                                  max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                  pad_token_id=pad, **hf_sampling(params), **kwargs)
        seconds = time.perf_counter() - began
    finally:
        if variant is not None and variant.holder is not None:
            variant.holder.generation_config = saved
    return int(out.shape[1]) - len(ids), seconds


def quiet_transformers() -> None:
    """Silence transformers' warnings (a benchmark's output stays readable)."""
    try:
        from transformers.utils import logging
    except ImportError:  # pragma: no cover: a backend without transformers
        return
    quiet: Any = logging.set_verbosity_error  # untyped
    quiet()
