"""The `cuda` backend: the static engine with its steps captured as CUDA graphs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from specsample_backends.static.backend import StaticBackend, engine_options
from specsample_backends.torch.dtypes import dtype_option
from torch import Tensor, nn

__all__ = ["CudaGraphCapture", "create"]

OPTIONS = ("buckets", "dtype", "sync_every", "ks", "prefill_chunk", "device")


class CudaGraphCapture:
    """Capture a step module once with `torch.cuda.CUDAGraph`; a call copies inputs and replays.

    The inputs must keep their shapes (static); the engine passes the same
    buffers each round, so only a prefill chunk is copied in.
    """

    def capture(self, module: nn.Module, example: Sequence[Tensor]) -> Callable[..., Any]:
        """Warm up on a side stream (state restored), capture, and return the replayer."""
        saved = [t.clone() for t in module.mutable()]  # type: ignore[operator]
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # unannotated in torch
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # cuBLAS handles, allocator pools: outside the capture
                module(*example)
        torch.cuda.current_stream().wait_stream(side)
        for dst, src in zip(module.mutable(), saved, strict=True):  # type: ignore[operator]
            dst.copy_(src)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = module(*example)

        def replay(*args: Tensor) -> Any:
            for dst, src in zip(example, args, strict=True):
                if dst is not src:
                    dst.copy_(src)
            graph.replay()
            return out

        return replay

    def boundary(self) -> None:
        """Nothing to do between rounds."""


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
    return StaticBackend(name="cuda", device=device, dtype=dtype, capture=CudaGraphCapture(),
                         options=engine_options(options, OPTIONS))
