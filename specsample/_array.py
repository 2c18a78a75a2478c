"""Array-API plumbing and the input checks every public function shares."""

from __future__ import annotations

import math
import operator
from typing import Any

import array_api_compat
import numpy as np

__all__ = ["Array", "check_finite", "check_int", "check_logits", "check_logits_shape", "check_probs",
           "check_shape", "check_tokens", "check_uniforms", "device", "host_array", "host_ints", "largest",
           "namespace", "rows_at"]

# NumPy, torch and JAX arrays all pass through; we type them loosely.
Array = Any


def namespace(*arrays: Array) -> Any:
    """The array-API namespace of `arrays` (NumPy, torch, JAX, ...)."""
    try:
        return array_api_compat.array_namespace(*arrays)
    except TypeError as err:
        kinds = ", ".join(sorted({type(a).__name__ for a in arrays}))
        raise TypeError(f"expected arrays of one library (NumPy, torch, JAX, ...), got {kinds}") from err


def device(x: Array) -> Any:
    """The device `x` lives on (CPU for NumPy)."""
    return array_api_compat.device(x)


def host_array(x: Array) -> np.ndarray:
    """A NumPy copy of a NumPy array or a torch tensor on any device (read to the host)."""
    return np.asarray(x.detach().cpu() if hasattr(x, "detach") else x)


def host_ints(x: Array) -> list[int]:
    """The values of a 1-D integer or bool array as Python ints, read to the host at once.

    One transfer (`tolist`, which NumPy, torch and JAX arrays have) rather than one
    device sync per element.
    """
    if len(x.shape) != 1:
        raise ValueError(f"x: expected a 1-D array, got shape {tuple(x.shape)}")
    values = x.tolist() if hasattr(x, "tolist") else list(x)
    return [int(v) for v in values]


def rows_at(x: Array, index: Array) -> Array:
    """x[b, index[b]] for x [B, N, ...] and index int [B]: one slice per row, no broadcast gather."""
    xp = namespace(x)
    return x[xp.arange(int(x.shape[0]), device=device(x)), index]


def largest(x: Array, b: int) -> tuple[Array, Array]:
    """The b largest entries of `x` [..., V] along its last axis and their ids (int64), the
    largest first, ties to the lower id: the first b of a stable descending sort."""
    if array_api_compat.is_torch_array(x):
        found = _top_unique(x, b)
        if found is not None:
            return found
    xp = namespace(x)
    order = xp.argsort(-x, axis=-1, stable=True)[..., :b]
    return xp.take_along_axis(x, order, axis=-1), xp.astype(order, xp.int64)


def _top_unique(x: Any, b: int) -> tuple[Array, Array] | None:
    """`largest` for a torch `x` by a partial selection (torch.topk) in place of a stable sort of
    the whole axis, or None where the two might differ: where the b values found are not
    strictly decreasing, or the b-th occurs again in its row, ties decide the order, and
    topk does not promise the lower id first. Outside a graph capture only (it reads the
    host)."""
    import torch

    if torch.compiler.is_compiling() or b >= int(x.shape[-1]):
        return None
    values, ids = torch.topk(x, b, dim=-1, largest=True, sorted=True)
    strict = (values[..., :-1] > values[..., 1:]).all()
    once = ((x == values[..., -1:]).sum(dim=-1) == 1).all()
    return (values, ids) if bool(strict & once) else None


def _shape(x: Array) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """`value` as an int after checking it is an integer (not a bool) in [minimum, maximum).

    Raises:
        TypeError: not an integer (a bool, a float, a string...).
        ValueError: below `minimum`, or at or above `maximum` when one is given.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got bool {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}") from None
    if maximum is not None and not minimum <= number < maximum:
        raise ValueError(f"{name}: expected an int in [{minimum}, {maximum}), got {number}")
    if number < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return number


def check_shape(name: str, x: Array, shape: tuple[int | None, ...]) -> None:
    """Raise ValueError unless `x` has rank len(shape) and the given dims (None: any)."""
    got = _shape(x)
    want = "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"
    if len(got) != len(shape) or any(w is not None and w != g for w, g in zip(shape, got, strict=False)):
        raise ValueError(f"{name}: expected shape {want}, got {list(got)}")


def check_float(name: str, x: Array) -> None:
    """Raise TypeError unless `x` is a real floating-point array."""
    xp = namespace(x)
    if not xp.isdtype(x.dtype, "real floating"):
        raise TypeError(f"{name}: expected a real floating-point array, got dtype {x.dtype}")


def check_finite(name: str, x: Array) -> None:
    """Raise ValueError if `x` holds NaN or +-inf."""
    check_float(name, x)
    xp = namespace(x)
    bad = ~xp.isfinite(x)
    if bool(xp.any(bad)):
        first = float(xp.reshape(x, (-1,))[xp.argmax(xp.astype(xp.reshape(bad, (-1,)), xp.int8))])
        raise ValueError(f"{name}: expected finite values, got {first} "
                         f"({int(xp.sum(xp.astype(bad, xp.int64)))} non-finite entries)")


def check_logits_shape(name: str, x: Array) -> None:
    """Raise unless `x` is a real floating-point array of shape [..., V] with V >= 1."""
    check_float(name, x)
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"{name}: expected shape [..., V] with V >= 1, got {list(x.shape)}")


def check_logits(name: str, x: Array) -> None:
    """Raise unless `x [..., V]` has no NaN or +inf and a finite entry per row.

    -inf is the usual mark of a masked token (probability exactly 0). One pass: the row
    maxima propagate NaN, are +inf where a row holds +inf and -inf where a row is all -inf;
    the entries are counted only to word an error.
    """
    check_logits_shape(name, x)
    xp = namespace(x)
    top = xp.max(x, axis=-1)  # [...]
    if bool(xp.any(xp.isnan(top) | (top == xp.inf))):
        raise ValueError(f"{name}: expected finite logits (or -inf for masked tokens), got "
                         f"{int(xp.sum(xp.astype(xp.isnan(x), xp.int64)))} NaN and "
                         f"{int(xp.sum(xp.astype(x == xp.inf, xp.int64)))} +inf entries")
    if bool(xp.any(top == -xp.inf)):
        raise ValueError(f"{name}: expected at least one finite logit per row, got a row of -inf")


def check_probs(name: str, x: Array) -> None:
    """Raise unless `x [..., V]` is finite, non-negative, with positive mass per row.

    Two reductions on the passing path: row minima >= 0 rule out negative entries, -inf
    and NaN (the minimum propagates NaN, and NaN >= 0 is false); with no negative entry,
    a +inf entry makes its row's sum +inf, so finite positive sums rule it out. Only a
    failing array is searched again, to word the error.
    """
    check_float(name, x)
    xp = namespace(x)
    if x.ndim >= 1 and x.shape[-1] >= 1:
        with np.errstate(invalid="ignore", over="ignore"):  # a faulty row is reported below
            low, mass = xp.min(x, axis=-1), xp.sum(x, axis=-1)
        if bool(xp.all((low >= 0) & (mass > 0) & xp.isfinite(mass))):
            return
    check_finite(name, x)
    if bool(xp.any(x < 0)):
        raise ValueError(f"{name}: expected non-negative probabilities, got minimum {float(xp.min(x))}")
    with np.errstate(over="ignore"):  # an overflowing sum is the error reported
        mass = xp.sum(x, axis=-1)
    if bool(xp.any(mass <= 0)) or not bool(xp.all(xp.isfinite(mass))):
        raise ValueError(f"{name}: expected positive, finite total mass in every row, got minimum "
                         f"row sum {float(xp.min(mass))} (not normalisable)")


def check_tokens(name: str, x: Array, vocab_size: int) -> None:
    """Raise unless `x` is an integer array of ids in [0, vocab_size)."""
    xp = namespace(x)
    if not xp.isdtype(x.dtype, "integral"):
        raise TypeError(f"{name}: expected an integer array of token ids, got dtype {x.dtype}")
    if math.prod(_shape(x)) and (bool(xp.any(x < 0)) or bool(xp.any(x >= vocab_size))):
        raise ValueError(f"{name}: expected token ids in [0, {vocab_size}), got range "
                         f"[{int(xp.min(x))}, {int(xp.max(x))}]")


def check_uniforms(name: str, x: Array) -> None:
    """Raise unless `x` is a float array with every value in [0, 1)."""
    check_float(name, x)
    xp = namespace(x)
    if math.prod(_shape(x)) == 0 or (bool(xp.min(x) >= 0) and bool(xp.max(x) < 1)):
        return  # (NaN fails both comparisons)
    check_finite(name, x)
    if bool(xp.any(x < 0)) or bool(xp.any(x >= 1)):
        raise ValueError(f"{name}: expected values in [0, 1), got range "
                         f"[{float(xp.min(x))}, {float(xp.max(x))}]")
