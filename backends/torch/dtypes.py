"""The dtypes a torch-based backend accepts by name: one table for torch, static-cpu, cuda, gaudi."""

from __future__ import annotations

import torch

__all__ = ["DTYPES", "dtype_option"]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                  "float64": torch.float64}


def dtype_option(name: object) -> torch.dtype:
    """The torch dtype named by a backend's `dtype` option; an unknown name is a clear error."""
    if not isinstance(name, str) or name not in DTYPES:
        raise ValueError(f"dtype: expected one of {list(DTYPES)}, got {name!r}")
    return DTYPES[name]
