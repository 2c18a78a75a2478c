"""The `gaudi` backend: the static engine on Intel Gaudi (HPU graphs, lazy mode, bf16).

`habana_frameworks.torch` is imported only when the backend is created.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from specsample_backends.static.backend import DTYPES, StaticBackend, engine_options
from torch import Tensor, nn

__all__ = ["HpuGraphCapture", "create"]

OPTIONS = ("buckets", "dtype", "sync_every", "ks", "prefill_chunk", "device")
INSTALL = ("backend 'gaudi' needs the Intel Gaudi software stack (habana-frameworks, e.g. in "
           "Intel's Gaudi PyTorch docker image; it is not on PyPI), and optionally optimum-habana "
           "(`pip install optimum-habana`)")


class HpuGraphCapture:
    """Each step module wrapped once with `wrap_in_hpu_graph`; `mark_step` at round boundaries.

    Args:
        hpu: the `habana_frameworks.torch.hpu` module; core: `habana_frameworks.torch.core`.
    """

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


def create(options: Mapping[str, object]) -> StaticBackend:
    """The static engine on an HPU.

    Options: device (default "hpu"), dtype (default "bfloat16"), buckets, ks,
    sync_every, prefill_chunk.

    Raises:
        ImportError: habana_frameworks is not installed (the message says what to install).
        ValueError: no HPU is available, or a bad option.
    """
    hpu, core = _habana()
    if not hpu.is_available():
        raise ValueError("backend 'gaudi': habana_frameworks is installed but no HPU is available "
                         "(check `hl-smi` and HABANA_VISIBLE_DEVICES)")
    name = options.get("dtype", "bfloat16")
    if name not in DTYPES:
        raise ValueError(f"dtype: expected one of {list(DTYPES)}, got {name!r}")
    engine = engine_options(options, OPTIONS)
    _adapt()
    return StaticBackend(name="gaudi", device=torch.device(str(options.get("device", "hpu"))),
                         dtype=DTYPES[str(name)], capture=HpuGraphCapture(hpu, core), options=engine)
