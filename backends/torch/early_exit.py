"""An early-exit self-draft: the target's first N layers, final norm and head."""

from __future__ import annotations

from .model import HFModel

__all__ = ["early_exit_draft"]


def early_exit_draft(target: HFModel, num_layers: int) -> HFModel:
    """A draft model that stops after decoder layer `num_layers` (weights shared, own cache).

    Args:
        target: a Llama-architecture target on the fast path.
        num_layers: N in [1, number of target layers].
    """
    if isinstance(num_layers, bool) or not isinstance(num_layers, int):
        raise TypeError(f"num_layers: expected an int, got {type(num_layers).__name__}")
    return target.derive(num_layers=num_layers)
