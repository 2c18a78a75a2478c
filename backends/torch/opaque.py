"""`specsample::linear`: any of our linears as one opaque op inside a compiled graph.

A compiler traces `F.linear` into its own GEMM call, which on CPU is MKL's
(slow for a few rows) and knows nothing of a oneDNN-packed weight or of
fbgemm's int8 kernels. Through this op a compiled graph calls the very linear
the eager path calls (`DenseLinear`, `Int8Linear`), so both compute the same
numbers, while the compiler still fuses everything around it.

The graph's input is a key: an int64 [1] tensor naming a live linear. Keys
are never reused, and a linear's entry dies with it, so a stale key is an
error, never another layer's weights.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["OpaqueLinear", "call", "key_of", "out_features"]


class OpaqueLinear(Protocol):
    """A linear the op can call: x [..., D] -> [..., out_features], a new tensor."""

    out_features: int

    def __call__(self, x: Tensor) -> Tensor:
        """Apply it."""
        ...


_LIVE: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_KEYS: weakref.WeakKeyDictionary[Any, Tensor] = weakref.WeakKeyDictionary()
_IDS = itertools.count(1)

# torch.library.Library is unannotated in torch, hence the ignores on its calls.
_LIB = torch.library.Library("specsample", "DEF")  # type: ignore[no-untyped-call]
_LIB.define("linear(Tensor x, Tensor key, int out_features) -> Tensor")  # type: ignore[no-untyped-call]


def _check_key(key: object) -> None:
    if not isinstance(key, Tensor) or key.dtype != torch.int64 or key.shape != (1,) or \
            key.device.type != "cpu":
        got = (f"{key.dtype} {tuple(key.shape)} on {key.device}" if isinstance(key, Tensor)
               else type(key).__name__)
        raise TypeError(f"key: expected an int64 [1] CPU tensor from key_of(), got {got}")


def _check_out(out_features: object) -> None:
    if isinstance(out_features, bool) or not isinstance(out_features, int) or out_features < 1:
        raise ValueError(f"out_features: expected an int >= 1, got {out_features!r}")


def _linear(x: Tensor, key: Tensor, out_features: int) -> Tensor:
    _check_key(key)
    ident = int(key)
    linear = _LIVE.get(ident)
    if linear is None:
        raise RuntimeError(f"key: no live linear has id {ident} (the model it belonged to was "
                           f"freed); rebuild the graph's inputs with key_of()")
    y: Tensor = linear(x)
    if y.shape[-1] != out_features:
        raise RuntimeError(f"out_features: the graph expects {out_features}, linear {ident} gives "
                           f"{y.shape[-1]}")
    return y


def _fake(x: Tensor, key: Tensor, out_features: int) -> Tensor:
    return x.new_empty((*x.shape[:-1], out_features))


_LIB.impl("linear", _linear, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
torch.library.register_fake("specsample::linear", _fake, lib=_LIB)


def out_features(linear: object) -> int:
    """`linear.out_features`, checked: the op's output width for it.

    Raises:
        TypeError: `linear` has no int `out_features` or is not callable.
    """
    out = getattr(linear, "out_features", None)
    if not callable(linear) or isinstance(out, bool) or not isinstance(out, int):
        raise TypeError(f"linear: expected a callable with an int out_features (DenseLinear, "
                        f"Int8Linear), got {type(linear).__name__}")
    return out


def key_of(linear: OpaqueLinear) -> Tensor:
    """The key (int64 [1], on CPU) that names `linear` to the op; the same tensor every call.

    Raises:
        TypeError: `linear` has no int `out_features` or is not callable.
    """
    out_features(linear)
    try:
        key = _KEYS.get(linear)
    except TypeError as err:  # not weak-referenceable or not hashable
        raise TypeError(f"linear: expected a hashable, weak-referenceable object, got "
                        f"{type(linear).__name__}") from err
    if key is None:
        ident = next(_IDS)
        _LIVE[ident] = linear
        with torch.inference_mode(False):  # a graph input made in inference mode is another guard
            key = _KEYS[linear] = torch.tensor([ident], dtype=torch.int64)
    return key


def call(x: Tensor, key: Tensor, out_features: int) -> Tensor:
    """`linear(x)` for the linear `key` names, as one op a compiler does not look into."""
    _check_key(key)
    _check_out(out_features)
    out: Tensor = torch.ops.specsample.linear.default(x, key, out_features)
    return out
