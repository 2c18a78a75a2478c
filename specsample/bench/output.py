"""Where a benchmark ran, and its records as JSON."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["compiled_graphs", "machine", "write_json"]


def machine() -> dict[str, object]:
    """Python, CPU, cores, and torch's version and threads when torch is installed."""
    info: dict[str, object] = {"python": platform.python_version(), "cpu": platform.processor(),
                               "cores": os.cpu_count()}
    try:
        import torch
    except ImportError:
        return info
    info["torch"] = torch.__version__
    info["torch_threads"] = torch.get_num_threads()
    return info


def write_json(path: str | os.PathLike[str], payload: Mapping[str, object]) -> Path:
    """Write `payload` as indented JSON at `path` (parent folders created); returns the path."""
    if not isinstance(payload, Mapping):
        raise TypeError(f"payload: expected a mapping, got {type(payload).__name__}")
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(dict(payload), indent=2))
    return file


def compiled_graphs() -> int | None:
    """Graphs torch.compile has produced in this process (None when torch.compile never loaded)."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
