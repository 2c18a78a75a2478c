"""The static-shape engine with graph capture; `static-cpu` runs it under torch.compile on CPU."""

from __future__ import annotations

from .backend import CompileCapture, ReplayCapture, StaticBackend, create_cpu, engine_options, static_inputs
from .engine import BUCKETS, Capture, Engine, EngineOptions
from .verify import commit, sample_tensor, verify_block_tensor, verify_tensor
from .warp import knobs, warp_tensor

__all__ = ["BUCKETS", "Capture", "CompileCapture", "Engine", "EngineOptions", "ReplayCapture",
           "StaticBackend", "commit", "create_cpu", "engine_options", "knobs", "sample_tensor",
           "static_inputs", "verify_block_tensor", "verify_tensor", "warp_tensor"]
