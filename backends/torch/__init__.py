"""The torch backend: eager, any device, real Hugging Face models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from specsample.backend import CoreBackend
from specsample.protocols import Drafter

from . import hf, loading
from .dtypes import DTYPES, dtype_option
from .hf import generate as generate_like_hf
from .model import HFModel

__all__ = ["DTYPES", "HFModel", "TorchBackend", "create", "dtype_option", "generate_like_hf", "hf"]
_OPTIONS = ("device", "dtype")


def _available() -> list[str]:
    kinds = ["cpu"]
    for kind in ("cuda", "xpu", "mps", "hpu"):
        module = getattr(torch, kind, None)
        if module is not None and getattr(module, "is_available", lambda: False)():
            kinds.append(kind)
    return kinds


def _device(value: object) -> torch.device:
    try:
        device = torch.device(str(value))
    except RuntimeError as err:
        raise ValueError(f"device: expected a torch device such as 'cpu' or 'cuda:0', got "
                         f"{value!r}") from err
    if device.type not in _available():
        raise ValueError(f"device: {str(value)!r} is not available here; available: "
                         f"{', '.join(_available())}")
    return device


DEFAULT_TARGET = "smollm2"
# auto: prompt lookup where the context repeats, the int8 self-draft where Thm 3.8 predicts
# it beats plain steps on this machine, plain steps elsewhere.
DEFAULT_DRAFT = "auto"


class TorchBackend(CoreBackend):
    """Loads models and drafters as torch `Model`s on one device and dtype; runs the core loop."""

    name = "torch"

    def __init__(self, *, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, dtype

    def asarray(self, ids: Any) -> torch.Tensor:
        """Token ids (nested lists, NumPy, tensors) as an int64 tensor on the device."""
        return torch.as_tensor(ids, dtype=torch.int64, device=self.device)

    def load_target(self, spec: str | None = None) -> HFModel:
        """The target model: "smollm2" (the default), a model directory or a .gguf file."""
        return loading.load_target(spec or DEFAULT_TARGET, dtype=self.dtype, device=str(self.device))

    def load_drafter(self, name: str | None, target: HFModel) -> Drafter:
        """A drafter: "int8" (the default), "early-exit:N", "lookup" or a model spec."""
        return loading.load_drafter(name or DEFAULT_DRAFT, target)

    def tokenizer(self, spec: str | None = None) -> Any:
        """The tokenizer of a model spec (default: the default target's)."""
        return loading.load_tokenizer(spec or DEFAULT_TARGET)


def create(options: Mapping[str, object]) -> TorchBackend:
    """Build the backend from options `device` (default "cpu") and `dtype` (default "float32")."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"options: unknown {unknown} for the torch backend; known: {list(_OPTIONS)}")
    return TorchBackend(device=_device(options.get("device", "cpu")),
                        dtype=dtype_option(options.get("dtype", "float32")))
