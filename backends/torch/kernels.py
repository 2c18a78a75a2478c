"""Which float32 GEMM kernel the fast path's small forwards use on this machine.

A forward of 1 to 3 rows (B*T: decoding, the verify of one or two drafts) can read each
decoder weight through MKL's GEMV-like kernel or through oneDNN's packed copy
(`_fast.DenseLinear`). Which is faster is a property of the machine, not of the model:
on some 2-core AMD EPYC hosts MKL reads the weights about 1.3x faster, on others the
packed copy is 1.5x faster for one row and 2x to 4x faster for two or three, which
decides whether a one-draft round costs 1.05 or 1.9 plain steps. So each fast-path target
on CPU in float32 measures it once per process: full forwards of 1, 2 and 3 positions
with each kernel, interleaved, the median of each; a row count reads the plain weight
only where that was faster. `SPECSAMPLE_SMALL_ROWS` fixes the choice instead:
"packed" (the packed copy at every row count), "plain" (MKL for 1 to 3 rows) or "auto"
(measure; the default). The choice changes the logits by float32 rounding only.
"""

from __future__ import annotations

import os
import statistics
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ._fast import SMALL_ROWS, DenseLinear, LlamaStack

__all__ = ["SMALL_ROWS_ENV", "apply_small_rows", "choose_small_rows", "faster_plain_rows",
           "small_rows_setting"]

SMALL_ROWS_ENV = "SPECSAMPLE_SMALL_ROWS"
_SETTINGS = ("auto", "packed", "plain")
# Per module: the row counts measured to read the plain weight faster, and the medians (ms).
_MEASURED: weakref.WeakKeyDictionary[nn.Module, tuple[frozenset[int], dict[str, float]]] = \
    weakref.WeakKeyDictionary()


def small_rows_setting() -> str:
    """$SPECSAMPLE_SMALL_ROWS ("auto" when unset), checked."""
    value = os.environ.get(SMALL_ROWS_ENV, "auto").strip().lower() or "auto"
    if value not in _SETTINGS:
        raise ValueError(f"{SMALL_ROWS_ENV}: expected one of {', '.join(_SETTINGS)}, got {value!r}")
    return value


def faster_plain_rows(times: dict[tuple[int, str], list[float]]) -> frozenset[int]:
    """The row counts whose median time with the plain weight ("plain") is below that with
    the packed copy ("packed"), from timings keyed by (rows, kernel); a tie goes to the
    packed copy, which is what every larger forward reads."""
    chosen = set()
    for rows in sorted({r for r, _ in times}):
        plain, packed = times.get((rows, "plain")), times.get((rows, "packed"))
        if not plain or not packed:
            raise ValueError(f"times: expected timings of both kernels at {rows} rows, got "
                             f"{len(plain or [])} plain and {len(packed or [])} packed")
        if statistics.median(plain) < statistics.median(packed):
            chosen.add(rows)
    return frozenset(chosen)


def apply_small_rows(stack: LlamaStack, plain_rows: frozenset[int]) -> None:
    """Make every decoder linear of `stack` read the plain weight at `plain_rows` (the output
    head keeps the packed copy at every row count)."""
    for layer in stack.layers:
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            linear = getattr(layer, name)
            if isinstance(linear, DenseLinear):
                linear.plain_rows = frozenset(plain_rows)


def choose_small_rows(module: nn.Module, stack: LlamaStack,
                      forward: Callable[[int], Any], *, repeats: int = 7
                      ) -> tuple[frozenset[int], dict[str, float]]:
    """The row counts of 1 to 3 that read the plain weight on this machine, and the medians
    (ms) behind the choice; measured once per module and process (see the module
    docstring), or fixed by $SPECSAMPLE_SMALL_ROWS. Applies the choice to `stack`.

    Args:
        module: the model's module (the key under which the measurement is kept).
        stack: its fast-path stack; nothing is measured unless its linears are packed.
        forward: width -> runs one forward of that many positions after a short context.
        repeats: timed forwards of each (width, kernel), after one untimed round.
    """
    setting = small_rows_setting()
    packed = any(isinstance(layer.q, DenseLinear) and layer.q.packed is not None for layer in stack.layers)
    if setting != "auto" or not packed:
        rows = frozenset(SMALL_ROWS) if setting == "plain" or not packed else frozenset()
        apply_small_rows(stack, rows)
        return rows, {}
    known = _MEASURED.get(module)
    if known is None:
        times: dict[tuple[int, str], list[float]] = {}
        with torch.no_grad():
            for index in range(repeats + 1):
                for width in SMALL_ROWS:
                    for kernel in ("plain", "packed"):
                        apply_small_rows(stack, frozenset({width}) if kernel == "plain" else frozenset())
                        began = time.perf_counter()
                        forward(width)
                        if index:
                            times.setdefault((width, kernel), []).append(time.perf_counter() - began)
        medians = {f"{kernel}@{width}": round(statistics.median(t) * 1000, 3)
                   for (width, kernel), t in times.items()}
        known = (faster_plain_rows(times), medians)
        _MEASURED[module] = known
    apply_small_rows(stack, known[0])
    return known
