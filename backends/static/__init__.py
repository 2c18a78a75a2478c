"""The static-shape engine with graph capture; `static-cpu` runs it under torch.compile on CPU."""

from __future__ import annotations

from .backend import CompileCapture, StaticBackend, create_cpu, engine_options
from .engine import BUCKETS, Capture, Engine, EngineOptions
from .verify import commit, sample_tensor, verify_block_tensor, verify_tensor
from .warp import knobs, warp_tensor

__all__ = ["BUCKETS", "Capture", "CompileCapture", "Engine", "EngineOptions", "StaticBackend", "commit",
           "create_cpu", "engine_options", "knobs", "sample_tensor", "verify_block_tensor", "verify_tensor",
           "warp_tensor"]
