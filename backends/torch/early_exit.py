"""An early-exit self-draft: the target's first N layers, final norm and head."""

from __future__ import annotations

import copy

from torch import nn

from ._fast import hf_config, submodule
from .model import HFModel

__all__ = ["early_exit_draft", "early_exit_module"]


def early_exit_draft(target: HFModel, num_layers: int) -> HFModel:
    """A draft model that stops after decoder layer `num_layers` (weights shared, own cache).

    Args:
        target: a target on the fast path (an architecture in `_fast.ARCHITECTURES`).
        num_layers: N in [1, number of target layers].
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int):
        raise TypeError(f"num_layers: expected an int, got {type(num_layers).__name__}")
    return target.derive(num_layers=num_layers)


def early_exit_module(module: nn.Module, num_layers: int) -> nn.Module:
    """A transformers causal LM of the first `num_layers` decoder layers of `module` (weights
    shared): the early-exit draft as an `assistant_model` for transformers' and
    optimum-habana's assisted generation.

    Args:
        module: a `*ForCausalLM` with `.model.layers`.
        num_layers: N in [1, number of layers].
    """
    layers = getattr(getattr(module, "model", None), "layers", None)
    if layers is None:
        raise TypeError(f"module: expected a transformers *ForCausalLM with .model.layers, got "
                        f"{type(module).__name__}")
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or \
            not 1 <= num_layers <= len(layers):
        raise ValueError(f"num_layers: expected an int in [1, {len(layers)}], got {num_layers!r}")
    draft = copy.copy(module)
    base = copy.copy(submodule(module, "model"))
    base.layers = layers[:num_layers]
    draft.model = base
    config = copy.deepcopy(hf_config(module))
    config.num_hidden_layers = num_layers
    draft.config = config  # type: ignore[assignment]  # torch types Module attributes as Tensor/Module
    return draft
