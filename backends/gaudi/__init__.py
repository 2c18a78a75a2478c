"""The `gaudi` backend: the static engine on Intel Gaudi, in either of the bridge's modes.

- `capture = "compile"` (default): eager mode (`PT_HPU_LAZY_MODE=0`, the current
  default) with the engine's pieces under `torch.compile(backend="hpu_backend",
  dynamic=False)`, the compile path `static-cpu` runs with inductor, recompile guard
  included.
- `capture = "hpu-graphs"`: lazy mode (`PT_HPU_LAZY_MODE=1`, legacy), each whole step
  wrapped once with `wrap_in_hpu_graph`, `mark_step` at round boundaries.

The mode is read and checked (`mode.check_capture`) when the backend is created,
before any model is loaded. `habana_frameworks.torch` is imported only then.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from specsample_backends.static.backend import DTYPES, CompileCapture, StaticBackend, engine_options
from torch import Tensor, nn

from .mode import CAPTURES, LAZY_VAR, check_capture, lazy_mode

__all__ = ["CAPTURES", "LAZY_VAR", "HpuGraphCapture", "check_capture", "create", "lazy_mode"]

OPTIONS = ("buckets", "dtype", "sync_every", "ks", "prefill_chunk", "device", "capture", "pieces",
           "strict")
ENGINE_OPTIONS = ("buckets", "sync_every", "ks", "prefill_chunk")
INSTALL = ("backend 'gaudi' needs the Intel Gaudi software stack (habana-frameworks, e.g. in "
           "Intel's Gaudi PyTorch docker image; it is not on PyPI), and optionally optimum-habana "
           "(`pip install optimum-habana`)")


class HpuGraphCapture:
    """Lazy mode: each whole step wrapped once with `wrap_in_hpu_graph`; `mark_step` at boundaries.

    The steps it gets (`PrefillStep`, `RoundStep`) follow the documented HPU-graph
    rules (docs.habana.ai, "Run Inference Using HPU Graphs"): static shapes, no
    data-dependent control flow, no CPU ops or host reads, and K/V written by
    in-place ops on whole buffers, never through a view (`rules.inplace_view_updates`).

    Args:
        hpu: the `habana_frameworks.torch.hpu` module; core: `habana_frameworks.torch.core`.
    """

    pieces = False

    def __init__(self, hpu: Any, core: Any) -> None:
        self.hpu, self.core = hpu, core

    def capture(self, module: nn.Module, example: Sequence[Tensor]) -> Callable[..., Any]:
        """The module wrapped in an HPU graph (recorded on its first call, replayed after)."""
        return self.hpu.wrap_in_hpu_graph(module)  # type: ignore[no-any-return]

    def boundary(self) -> None:
        """Lazy mode: flush the accumulated graph to the device."""
        self.core.mark_step()


def _habana() -> tuple[Any, Any]:
    try:
        core = importlib.import_module("habana_frameworks.torch.core")
        hpu = importlib.import_module("habana_frameworks.torch.hpu")
    except ImportError as err:
        raise ImportError(f"{INSTALL}: {err}") from err
    return hpu, core


def _adapt() -> bool:
    """Apply optimum-habana's transformers adaptation when it is installed; True if applied."""
    try:
        utils = importlib.import_module("optimum.habana.transformers.modeling_utils")
    except ImportError:
        return False
    utils.adapt_transformers_to_gaudi()
    return True


def _flag(options: Mapping[str, object], name: str, default: bool) -> bool:
    value = options.get(name, default)
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool, got {value!r}")
    return value


def create(options: Mapping[str, object]) -> StaticBackend:
    """The static engine on an HPU.

    Options: capture ("compile", the default, or "hpu-graphs"), device (default
    "hpu"), dtype (default "bfloat16"), buckets, ks, sync_every, prefill_chunk;
    for capture "compile" also pieces (default True: per-layer graphs; False: the
    whole round as one graph) and strict (default True: a recompile after warm-up
    raises).

    Raises:
        ImportError: habana_frameworks is not installed (the message says what to install).
        ValueError: a bad option; a capture the bridge's mode does not run (see
            `check_capture`); no HPU is available.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"options: unknown {unknown}; known: {list(OPTIONS)}")
    name = options.get("dtype", "bfloat16")
    if name not in DTYPES:
        raise ValueError(f"dtype: expected one of {list(DTYPES)}, got {name!r}")
    engine = engine_options({k: v for k, v in options.items() if k in ENGINE_OPTIONS}, ENGINE_OPTIONS)
    capture_name = options.get("capture", "compile")
    if capture_name not in CAPTURES:
        raise ValueError(f"capture: expected one of {list(CAPTURES)}, got {capture_name!r}")
    pieces, strict = _flag(options, "pieces", True), _flag(options, "strict", True)
    if capture_name == "hpu-graphs" and ("pieces" in options or "strict" in options):
        raise ValueError("pieces, strict: options of capture 'compile' only (HPU graphs record "
                         "whole steps), got them with capture 'hpu-graphs'")
    hpu, core = _habana()
    check_capture(capture_name, lazy_mode())
    if not hpu.is_available():
        raise ValueError("backend 'gaudi': habana_frameworks is installed but no HPU is available "
                         "(check `hl-smi` and HABANA_VISIBLE_DEVICES)")
    capture: HpuGraphCapture | CompileCapture = (
        HpuGraphCapture(hpu, core) if capture_name == "hpu-graphs" else
        CompileCapture(backend="hpu_backend", strict=strict, pieces=pieces))
    _adapt()
    return StaticBackend(name="gaudi", device=torch.device(str(options.get("device", "hpu"))),
                         dtype=DTYPES[str(name)], capture=capture, options=engine)
