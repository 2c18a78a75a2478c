"""A stand-in for `habana_frameworks.torch` that enforces the bridge's documented rules on CPU.

Not evidence of HPU behaviour or speed; it makes a violation of a documented rule fail
here, on CPU, instead of first on a Gaudi. The rules (docs.habana.ai):

- "HPU Graphs for Training": running HPU Graphs is supported with lazy mode; eager
  mode is not (`wrap_in_hpu_graph` in eager mode raises).
- "Run Inference Using HPU Graphs": no CPU ops, no data-dependent control flow, static
  shapes only, no in-place view updates (each raises inside a wrapped module).
- "PyTorch Gaudi Theory of Operations": torch.compile with "hpu_backend" is the eager
  path (compiling in lazy mode raises). The stand-in's "hpu_backend" records each
  Dynamo graph and runs it with aot_eager.

The mode is the stand-in's `lazy` flag, answered through
`habana_frameworks.torch.utils.internal.is_lazy()` as the real bridge does.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from specsample_backends.gaudi.rules import written_args
from torch import fx, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

DOCS = "docs.habana.ai, 'Run Inference Using HPU Graphs'"
HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__, torch.Tensor.__float__,
              torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu}
DYNAMIC = {torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default,
           torch.ops.aten.unique_consecutive.default, torch.ops.aten._unique2.default}


class RuleError(RuntimeError):
    """A documented Gaudi bridge rule broken inside a captured step."""


class _HostRules(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.__bool__:
            raise RuleError(f"HPU Graphs rule: data-dependent control flow is not supported (a Python "
                            f"if/while on a device tensor inside a captured step; {DOCS})")
        if func in HOST_READS:
            raise RuleError(f"HPU Graphs rule: models that contain CPU ops are not supported "
                            f"(Tensor.{func.__name__} reads a device value on the host inside a "
                            f"captured step; {DOCS})")
        return func(*args, **(kwargs or {}))


class _DeviceRules(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in DYNAMIC:
            raise RuleError(f"HPU Graphs rule: dynamic shapes are not supported ({func} has a "
                            f"data-dependent output shape; {DOCS})")
        for i in written_args(func):
            target = args[i] if i < len(args) else None
            if isinstance(target, torch.Tensor) and target._is_view():
                raise RuleError(f"HPU Graphs rule: capturing HPU Graphs on models containing "
                                f"in-place view updates is not supported ({func} writes a view; "
                                f"{DOCS})")
        return func(*args, **kwargs)


@contextmanager
def hpu_graph_rules() -> Iterator[None]:
    """Inside: every documented HPU-graph rule broken raises `RuleError`."""
    with _HostRules(), _DeviceRules():
        yield


@dataclasses.dataclass
class Bridge:
    """The stand-in's state: its mode and what the engine did with it."""

    lazy: bool
    calls: list[str] = dataclasses.field(default_factory=list)
    wrapped: list[nn.Module] = dataclasses.field(default_factory=list)
    graphs: list[fx.GraphModule] = dataclasses.field(default_factory=list)

    def wrap_in_hpu_graph(self, module: nn.Module) -> Callable[..., Any]:
        if not self.lazy:
            raise RuleError("HPU Graphs rule: running HPU Graphs is supported with lazy mode, eager "
                            "mode is currently not supported (docs.habana.ai, 'HPU Graphs for "
                            "Training'); this process has PT_HPU_LAZY_MODE=0")
        self.calls.append(f"wrap:{type(module).__name__}")
        self.wrapped.append(module)

        def replay(*args: Any) -> Any:
            with hpu_graph_rules():
                return module(*args)

        return replay

    def mark_step(self) -> None:
        self.calls.append("mark_step")

    def compile_backend(self, gm: fx.GraphModule, example: list[torch.Tensor]) -> Callable[..., Any]:
        if self.lazy:
            raise RuleError("hpu_backend rule: torch.compile runs in eager mode (docs.habana.ai, "
                            "'PyTorch Gaudi Theory of Operations'); this process has "
                            "PT_HPU_LAZY_MODE=1")
        self.calls.append("compile")
        self.graphs.append(gm)
        compiled: Callable[..., Any] = torch._dynamo.lookup_backend("aot_eager")(gm, example)
        return compiled


_ACTIVE: list[Bridge] = []


def _hpu_backend(gm: fx.GraphModule, example: list[torch.Tensor]) -> Callable[..., Any]:
    return _ACTIVE[0].compile_backend(gm, example)


def modules(bridge: Bridge) -> dict[str, types.ModuleType]:
    """The fake `habana_frameworks` package tree for sys.modules, answering for `bridge`."""
    if "hpu_backend" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(_hpu_backend, name="hpu_backend")
    _ACTIVE[:] = [bridge]
    names = ("habana_frameworks", "habana_frameworks.torch", "habana_frameworks.torch.hpu",
             "habana_frameworks.torch.core", "habana_frameworks.torch.utils",
             "habana_frameworks.torch.utils.internal")
    tree = {name: types.ModuleType(name) for name in names}
    hpu, core = tree["habana_frameworks.torch.hpu"], tree["habana_frameworks.torch.core"]
    hpu.wrap_in_hpu_graph = bridge.wrap_in_hpu_graph  # type: ignore[attr-defined]
    hpu.is_available = lambda: True  # type: ignore[attr-defined]
    core.mark_step = bridge.mark_step  # type: ignore[attr-defined]
    tree["habana_frameworks.torch.utils.internal"].is_lazy = lambda: bridge.lazy  # type: ignore[attr-defined]
    for name in names[1:]:
        parent, leaf = name.rsplit(".", 1)
        setattr(tree[parent], leaf, tree[name])
    return tree


def install(monkeypatch: Any, bridge: Bridge) -> Bridge:
    """Put the stand-in into sys.modules for one test (optimum-habana absent)."""
    for name, module in modules(bridge).items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "optimum.habana.transformers.modeling_utils", None)
    return bridge
