"""The HPU-graph capture rule on K/V writes, checked on a traced graph (on any device).

docs.habana.ai, "Run Inference Using HPU Graphs": "Capturing HPU Graphs on models
containing in-place view updates is not supported". An in-place view update is an
op that writes into a tensor which is a view of another (`cache[:, :, pos] = k`,
`buffer.view(-1, hd).index_copy_(0, ...)`). The engine's steps write K/V with
in-place ops on whole buffers (`scatter_`, `index_put_`; optimum-habana's
`index_copy_` is of the same kind), never through a view, and this is how a test
shows it: trace a step with `torch.fx.experimental.proxy_tensor.make_fx` (aten
ops, mutations kept) and list the in-place ops whose written argument is a view.
"""

from __future__ import annotations

import torch
from torch import fx

__all__ = ["inplace_view_updates", "is_view_op", "written_args"]


def is_view_op(target: object) -> bool:
    """True for an aten op whose output aliases its input without writing it (view, slice, ...)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def written_args(target: object) -> list[int]:
    """Positions of the arguments an aten op writes in place (none for a functional op)."""
    if not isinstance(target, torch._ops.OpOverload):
        return []
    return [i for i, arg in enumerate(target._schema.arguments)
            if arg.alias_info is not None and arg.alias_info.is_write]


def _is_view(node: object, module: fx.GraphModule) -> bool:
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_function":
        return is_view_op(node.target)
    if node.op == "get_attr":  # a constant captured from the module (a buffer it holds)
        value = getattr(module, str(node.target), None)
        return isinstance(value, torch.Tensor) and value._is_view()
    return False


def inplace_view_updates(module: fx.GraphModule) -> list[str]:
    """The in-place view updates in a traced graph, as "op(written <- view op)" strings.

    Args:
        module: an aten-level graph with its mutations (e.g. from `make_fx`).

    Raises:
        TypeError: `module` is not an `fx.GraphModule`.
    """
    if not isinstance(module, fx.GraphModule):
        raise TypeError(f"module: expected a torch.fx.GraphModule (e.g. from make_fx), got "
                        f"{type(module).__name__}")
    found = []
    for node in module.graph.nodes:
        if node.op != "call_function":
            continue
        for i in written_args(node.target):
            if i < len(node.args) and _is_view(node.args[i], module):
                source = node.args[i]
                via = source.target if source.op == "call_function" else f"view {source.target}"
                found.append(f"{node.target}({source.name} <- {via})")
    return found
