"""Backends by name: built-ins imported lazily, third parties through entry points."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from specsample.api.backend import Backend

__all__ = ["BUILTIN", "Backend", "available", "get_backend"]

GROUP = "specsample.backends"

# name -> "module:factory"; a factory takes the options mapping and returns a Backend.
BUILTIN: dict[str, str] = {
    "reference": "specsample_backends.reference:create",
    "torch": "specsample_backends.torch:create",
    "static-cpu": "specsample_backends.static:create_cpu",
    "cuda": "specsample_backends.cuda:create",
    "gaudi": "specsample_backends.gaudi:create",
}


def _plugins() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def available() -> list[str]:
    """Every backend name that can be asked for (built-in and installed plugins)."""
    return sorted(set(BUILTIN) | set(_plugins()))


def get_backend(name: str, options: Mapping[str, object] | None = None) -> Backend:
    """Import and create the backend called `name` with its `options`.

    Raises:
        ValueError: the name is unknown (the message lists the available ones).
        ImportError: the backend's dependencies are missing (the message says what to install).
    """
    if not isinstance(name, str):
        raise TypeError(f"backend: expected a name (str), got {type(name).__name__}")
    options = dict(options or {})
    plugins = _plugins()
    if name in BUILTIN:
        module_name, _, attr = BUILTIN[name].partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
    elif name in plugins:
        factory = plugins[name].load()
    else:
        raise ValueError(f"backend: unknown name {name!r}; available: {', '.join(available())}")
    backend: Backend = factory(options)
    return backend
