"""The `cuda` backend: the static engine with its steps captured as CUDA graphs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from specsample_backends.static.backend import ReplayCapture, StaticBackend, engine_options, state_kept
from specsample_backends.torch.dtypes import dtype_option
from torch import Tensor, nn

__all__ = ["create", "record_graph"]

OPTIONS = ("buckets", "dtype", "sync_every", "ks", "prefill_chunk", "device")


def record_graph(module: nn.Module, buffers: tuple[Tensor, ...]) -> Callable[[], Any]:
    """Record `module` over `buffers` as a `torch.cuda.CUDAGraph` (after a warm-up on a side
    stream, state restored) and return its replayer: the `record` of the cuda backend's
    `ReplayCapture`, which copies each call's inputs into the buffers (aliased example inputs
    get buffers of their own; the engine passes the same buffers each round, so only a
    prefill chunk is copied in)."""
    def warm_up() -> None:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # unannotated in torch
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # cuBLAS handles, allocator pools: outside the capture
                module(*buffers)
        torch.cuda.current_stream().wait_stream(side)

    state_kept(module, warm_up)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = module(*buffers)

    def replay() -> Any:
        graph.replay()
        return out

    return replay


def _devices() -> str:
    kinds = ["cpu"] + [k for k in ("xpu", "mps", "hpu")
                       if getattr(getattr(torch, k, None), "is_available", lambda: False)()]
    return ", ".join(kinds)


def create(options: Mapping[str, object]) -> StaticBackend:
    """The static engine on a CUDA GPU with CUDA graphs.

    Options: device (default "cuda"), dtype (default "bfloat16"), buckets, ks,
    sync_every, prefill_chunk.

    Raises:
        ValueError: CUDA is not available (the message lists what is).
    """
    if not torch.cuda.is_available():
        raise ValueError(f"backend 'cuda': no CUDA device is available to torch {torch.__version__} "
                         f"(CUDA build: {torch.version.cuda or 'none'}); devices here: {_devices()}. "
                         f"Use backend 'static-cpu' or 'torch', or install a CUDA build of torch")
    device = torch.device(str(options.get("device", "cuda")))
    if device.type != "cuda":
        raise ValueError(f"device: expected a CUDA device such as 'cuda:0', got {device}")
    dtype = dtype_option(options.get("dtype", "bfloat16"))
    return StaticBackend(name="cuda", device=device, dtype=dtype, capture=ReplayCapture(record=record_graph),
                         options=engine_options(options, OPTIONS))
