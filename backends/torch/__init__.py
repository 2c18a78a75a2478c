"""The torch backend: eager, any device, real Hugging Face models."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from specsample.api.backend import CoreBackend
from specsample.core.protocols import Drafter, Model
from specsample.engine.options import RunOptions
from specsample.engine.runs import Step

from . import hf, loading
from .dtypes import DTYPES, dtype_option
from .hf import generate as generate_like_hf
from .model import HFModel
from .parallel import TensorParallel, start

__all__ = ["DTYPES", "HFModel", "TorchBackend", "create", "dtype_option", "generate_like_hf", "hf"]
_OPTIONS = ("device", "dtype", "tp", "process_group", "check_replicas", "timeout_s")


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
    """Loads models and drafters as torch `Model`s on one device and dtype; runs the core loop.

    With `parallel`, the target is sharded over the ranks of a torchrun launch (tensor
    parallelism; drafts derived from it are sharded alike, separate draft models are
    replicated); `check_replicas` checks after every round that all ranks committed the
    same tokens.
    """

    name = "torch"

    def __init__(self, *, device: torch.device, dtype: torch.dtype,
                 parallel: TensorParallel | None = None, check_replicas: bool = False) -> None:
        self.device, self.dtype = device, dtype
        self.parallel, self.check_replicas = parallel, check_replicas

    def asarray(self, ids: Any) -> torch.Tensor:
        """Token ids (nested lists, NumPy, tensors) as an int64 tensor on the device."""
        return torch.as_tensor(ids, dtype=torch.int64, device=self.device)

    def load_target(self, spec: str | None = None) -> HFModel:
        """The target model: "smollm2" (the default), a model directory or a .gguf file."""
        return loading.load_target(spec or DEFAULT_TARGET, dtype=self.dtype, device=str(self.device),
                                   parallel=self.parallel)

    def load_drafter(self, name: str | None, target: HFModel) -> Drafter:
        """A drafter: "int8" (the default), "early-exit:N", "lookup" or a model spec."""
        return loading.load_drafter(name or DEFAULT_DRAFT, target)

    def tokenizer(self, spec: str | None = None) -> Any:
        """The tokenizer of a model spec (default: the default target's)."""
        return loading.load_tokenizer(spec or DEFAULT_TARGET)

    def default_k(self, target: Model, drafter: Drafter) -> tuple[int, str] | None:
        """For a model drafter without a confidence threshold, the K Thm 3.8 rates fastest on
        this machine (`loading.rated_k`); None otherwise."""
        if not isinstance(target, HFModel):
            raise TypeError(f"target: the torch backend expected an HFModel, got {type(target).__name__}")
        return loading.rated_k(target, drafter)

    def iterate(self, target: Model, drafter: Drafter, input_ids: Any, run: RunOptions) -> Iterator[Step]:
        """The core loop's rounds; with `check_replicas`, each checked across the ranks."""
        steps = super().iterate(target, drafter, input_ids, run)
        if self.parallel is not None and self.check_replicas:
            return self.parallel.checked(steps)
        return steps


def create(options: Mapping[str, object]) -> TorchBackend:
    """Build the backend from its options.

    Options:
        device: a torch device (default "cpu"); with tp > 1 on an accelerator, the
            device index defaults to torchrun's LOCAL_RANK.
        dtype: the models' dtype (default "float32").
        tp: tensor-parallel size of the target (default 1); > 1 needs a launch by
            `torchrun --nproc_per_node tp`.
        process_group: "gloo", "nccl" or "hccl" (default: by device type).
        check_replicas: check after each round that every rank committed the same
            tokens (default False; one all-gather a round).
        timeout_s: how long joining and each collective wait for the other ranks
            (default 600).
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"options: unknown {unknown} for the torch backend; known: {list(_OPTIONS)}")
    tp, check = options.get("tp", 1), options.get("check_replicas", False)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp: expected an int >= 1, got {tp!r}")
    if not isinstance(check, bool):
        raise ValueError(f"check_replicas: expected a bool, got {check!r}")
    timeout = options.get("timeout_s", 600.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout_s: expected a number of seconds > 0, got {timeout!r}")
    group = options.get("process_group")
    device, dtype = _device(options.get("device", "cpu")), dtype_option(options.get("dtype", "float32"))
    if tp == 1:
        if group is not None or check:
            raise ValueError(f"process_group, check_replicas: apply to tp > 1 only, got tp = 1 with "
                             f"process_group = {group!r}, check_replicas = {check!r}")
        return TorchBackend(device=device, dtype=dtype)
    if device.type != "cpu" and device.index is None:
        device = torch.device(device.type, int(os.environ.get("LOCAL_RANK", "0")))
        torch.get_device_module(device.type).set_device(device)
    parallel = start(tp, device, process_group=None if group is None else str(group),
                     timeout_s=float(timeout))
    return TorchBackend(device=device, dtype=dtype, parallel=parallel, check_replicas=check)
