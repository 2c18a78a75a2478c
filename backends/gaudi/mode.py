"""Which execution mode the Intel Gaudi PyTorch bridge runs in, and which capture fits it.

From Intel's documentation (docs.habana.ai):

- "Runtime Environment Variables": `PT_HPU_LAZY_MODE` selects the mode, 0 = eager
  mode with torch.compile, 1 = lazy mode. Its default is 0 on current releases
  (1 in release 1.19 and earlier); the bridge reads it once, when it is imported.
- "PyTorch Gaudi Theory of Operations": eager mode with `torch.compile`
  (backend "hpu_backend") is the default execution path; lazy mode is a legacy
  fallback, no longer developed.
- "HPU Graphs for Training": running HPU Graphs is supported with lazy mode;
  eager mode is currently not supported.

So `capture = "compile"` needs eager mode and `capture = "hpu-graphs"` needs
lazy mode; a mismatch is an error before any model is loaded.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

__all__ = ["CAPTURES", "LAZY_VAR", "check_capture", "lazy_mode"]

LAZY_VAR = "PT_HPU_LAZY_MODE"
CAPTURES = ("compile", "hpu-graphs")


def lazy_mode(environ: Mapping[str, str] | None = None) -> bool:
    """True when the bridge runs in lazy mode, False in eager mode (+ torch.compile).

    The bridge's own answer (`habana_frameworks.torch.utils.internal.is_lazy()`,
    which knows its release's default) when it has one; otherwise the variable as
    the bridge reads it: anything but "0" is lazy, unset is the current default 0.

    Args:
        environ: the environment (default `os.environ`); used only without the bridge's answer.
    """
    if environ is not None and not isinstance(environ, Mapping):
        raise TypeError(f"environ: expected a mapping of str to str, got {type(environ).__name__}")
    try:
        internal = importlib.import_module("habana_frameworks.torch.utils.internal")
    except ImportError:
        internal = None
    is_lazy = getattr(internal, "is_lazy", None)
    if callable(is_lazy):
        return bool(is_lazy())
    return (os.environ if environ is None else environ).get(LAZY_VAR, "0") != "0"


def check_capture(capture: object, lazy: bool) -> str:
    """`capture` checked against the process's mode; returns it.

    Raises:
        ValueError: an unknown capture, or one the mode does not run (the message
            names PT_HPU_LAZY_MODE and the fix).
    """
    if capture not in CAPTURES:
        raise ValueError(f"capture: expected one of {list(CAPTURES)}, got {capture!r}")
    if capture == "hpu-graphs" and not lazy:
        raise ValueError(
            f"capture 'hpu-graphs': HPU graphs run only in lazy mode (Intel Gaudi docs, 'HPU Graphs "
            f"for Training'), and this process runs the Gaudi bridge in eager mode ({LAZY_VAR} is 0 "
            f"or unset, the current default). Fix: start Python with {LAZY_VAR}=1 (the bridge reads "
            f"it when habana_frameworks is imported), or use capture = 'compile'")
    if capture == "compile" and lazy:
        raise ValueError(
            f"capture 'compile': torch.compile(backend='hpu_backend') runs in eager mode (Intel "
            f"Gaudi docs, 'PyTorch Gaudi Theory of Operations'), and this process runs the Gaudi "
            f"bridge in lazy mode ({LAZY_VAR}=1). Fix: start Python with {LAZY_VAR}=0 (the "
            f"default on current releases), or use capture = 'hpu-graphs'")
    return str(capture)
