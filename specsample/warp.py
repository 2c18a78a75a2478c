"""Logits -> probabilities: temperature, top-k, top-p, min-p, the same for p and q."""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np

from specsample._array import Array, check_logits, check_logits_shape, device, namespace
from specsample._select import grouped, kth_largest, top_groups, top_p_threshold
from specsample.params import SamplingParams

__all__ = ["warp"]


def _owned(x: Array) -> bool:
    """Whether `x`, a fresh intermediate, may be overwritten in place: NumPy, or torch when
    autograd does not record it (an in-place op would break its backward)."""
    if array_api_compat.is_numpy_array(x):
        return True
    if array_api_compat.is_torch_array(x):
        import torch

        return not (x.requires_grad and torch.is_grad_enabled())
    return False


def _exp(xp: Any, x: Array) -> Array:
    if _owned(x):
        if array_api_compat.is_torch_array(x):
            return x.exp_()
        return np.exp(x, out=x)
    return xp.exp(x)


def _renormalise(xp: Any, probs: Array) -> Array:
    total = xp.sum(probs, axis=-1, keepdims=True)
    if _owned(probs):
        if array_api_compat.is_torch_array(probs):
            return probs.div_(total)
        return np.divide(probs, total, out=probs)
    return probs / total


def _eager_torch_cpu(x: Array) -> bool:
    """A float32/float64 torch CPU array outside a graph capture (where host reads break it)."""
    if not array_api_compat.is_torch_array(x) or x.device.type != "cpu":
        return False
    import torch

    return x.dtype in (torch.float32, torch.float64) and not torch.compiler.is_compiling()


def _keep(xp: Any, values: Array, key: Array, floor: Array) -> Array:
    """`where(key >= floor, values, 0)` for `values` finite, the same array bit for bit.

    torch on CPU writes bool arrays several times slower than float ones, so there it
    multiplies by a 0/1 step made by float operations: sign(key - floor) is exact because a
    difference of two floats is 0 only when they are equal. That needs a finite floor, and
    one of 0 or at least 2^-100 in size, so that no difference is small enough to be
    flushed to zero where the process flushes subnormal numbers.
    """
    if _eager_torch_cpu(values) and _owned(values):
        import torch

        if key is values and _mask_by_rows(values, floor):
            return values
        size = floor.abs()
        if bool(torch.all(torch.isfinite(size) & ((size == 0) | (size >= 2.0**-100)))):
            step = torch.sub(key, floor).sign_().add_(1).clamp_(max=1)
            return values.mul_(step)
    return xp.where(key >= floor, values, 0.0)


# Rows up to which `_mask_by_rows` masks row by row (one call a row) rather than in passes
# over the whole array.
_ROW_CALLS = 4096


def _mask_by_rows(values: Any, floor: Any) -> bool:
    """For torch CPU `values` [..., V] and per-row floors [..., 1]: zero the entries below
    their row's floor in place, one in-place `threshold` a row (a single pass, no new array),
    and say so; False (nothing done) where another path must do it.

    `threshold` keeps x > t; with t the largest float below the floor, that is x >= floor
    exactly. Floors of at least 2^-100 only, so that t is a normal number wherever the
    process flushes subnormal ones.
    """
    import torch
    import torch.nn.functional as F

    if floor.dtype != values.dtype or floor.shape[-1:] != (1,) or floor.numel() > _ROW_CALLS \
            or tuple(floor.shape[:-1]) != tuple(values.shape[:-1]) or not values.is_contiguous():
        return False
    if not bool(torch.all(torch.isfinite(floor) & (floor >= 2.0**-100))):
        return False
    below = torch.nextafter(floor, floor.new_full((), float("-inf"))).reshape(-1)
    for row, t in zip(values.view(-1, values.shape[-1]), below.tolist(), strict=True):
        F.threshold(row, t, 0.0, inplace=True)
    return True


def _top_k_groups(logits: Any, params: SamplingParams, check: bool) -> Any:
    """The top-k warp of torch logits without a pass over whole rows after the first: the
    k-th largest scaled logit and the kept entries come from the k groups with the largest
    maxima (`top_groups`), and the kept values are scattered into zeros. The output is the
    full path's bit for bit. None where a group not chosen reaches the k-th largest value
    (a tie the chosen groups miss): the caller takes the full path.
    """
    import torch

    k, temperature = int(params.top_k or 0), params.temperature
    values, indices, maxima, chosen = top_groups(logits, k)
    peak = maxima.amax(dim=-1, keepdim=True)  # the row maximum
    if temperature != 1:
        values, maxima, peak = values / temperature, maxima / temperature, peak / temperature
    if check:
        _check_peak(logits, peak, temperature)
    kth = values.topk(k, dim=-1, sorted=False).values.amin(dim=-1, keepdim=True)
    others = maxima.scatter(-1, chosen, float("-inf")).amax(dim=-1, keepdim=True)
    if bool(torch.any(others >= kth)):
        return None
    kept = torch.where(values >= kth, _exp(torch, values - peak), 0.0)  # k groups: a short row
    # The full path's array before its normalisation, bit for bit: the same normaliser follows.
    return _renormalise(torch, torch.zeros_like(logits).scatter_(-1, indices, kept))


def _check_peak(logits: Array, peak: Array, temperature: float) -> None:
    """Raise unless every row maximum of logits / temperature is finite: one small check
    on the row maxima that the warp computes anyway (NaN propagates through them)."""
    xp = namespace(peak)
    finite = peak.isfinite().all() if array_api_compat.is_torch_array(peak) else xp.all(xp.isfinite(peak))
    if bool(finite):
        return
    check_logits("logits", logits)  # names NaN, +inf or an all -inf row
    raise ValueError(f"params.temperature: logits / {temperature!r} overflows (row maximum "
                     f"{float(xp.max(xp.abs(peak)))}); expected a temperature at which the scaled "
                     f"logits stay finite")


def warp(logits: Array, params: SamplingParams, *, check: bool = True) -> Array:
    """Turn logits into the sampling distribution that `params` describe.

    Args:
        logits: [..., V] float; -inf marks a masked token; NaN and +inf are errors.
        params: the sampling parameters.
        check: validate the input (switch off inside graphs once validated).

    Returns:
        probs [..., V] of the same dtype, normalised; masked entries are exactly 0.
        Temperature 0 gives a one-hot at the argmax (ties: the lowest index).
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params: expected SamplingParams, got {type(params).__name__}")
    xp = namespace(logits)
    vocab = logits.shape[-1]
    if params.greedy:
        if check:
            check_logits("logits", logits)
        return _one_hot(xp, logits, _first_argmax(xp, logits))
    if check:
        check_logits_shape("logits", logits)  # the values: from the row maxima below
    if params.top_k is not None and grouped(vocab, params.top_k) and _eager_torch_cpu(logits):
        fast = _top_k_groups(logits, params, check)
        if fast is not None:
            return _top_p_min_p(xp, fast, params)
    scaled = logits if params.temperature == 1 else logits / params.temperature  # x / 1 == x
    # max(x / t) == max(x) / t: rounding is monotone, so the largest logit scales to the largest.
    peak = xp.max(scaled, axis=-1, keepdims=True)
    if check:
        _check_peak(logits, peak, params.temperature)
    # The row maximum always survives top-k. Masking after exp gives the same zeros as exp(-inf)
    # and spares exp the -inf entries, its slow path.
    shifted = _exp(xp, scaled - peak)
    if params.top_k is not None and params.top_k < vocab:
        shifted = _keep(xp, shifted, scaled, kth_largest(scaled, params.top_k))
    return _top_p_min_p(xp, _renormalise(xp, shifted), params)


def _first_argmax(xp: Any, logits: Array) -> Array:
    """The index of each row's first maximum (ties: the lowest index): [..., V] -> [..., 1].
    Eager torch on CPU reads it through NumPy, whose vectorised argmax is an order of
    magnitude faster there than torch's, without a copy; the same index."""
    if _eager_torch_cpu(logits):
        import torch

        best = np.argmax(logits.detach().numpy(), axis=-1)[..., None]
        return torch.from_numpy(best.astype(np.int64, copy=False))
    return xp.argmax(logits, axis=-1, keepdims=True)


def _one_hot(xp: Any, like: Array, best: Array) -> Array:
    """1 at `best` [..., 1] and 0 elsewhere, of `like`'s shape and dtype. torch and NumPy
    write the ones into zeros (torch writes bool arrays slowly); other libraries compare."""
    if array_api_compat.is_torch_array(like):
        return like.new_zeros(like.shape).scatter_(-1, best, 1.0)
    if array_api_compat.is_numpy_array(like):
        out = np.zeros(like.shape, dtype=like.dtype)
        np.put_along_axis(out, best, 1.0, axis=-1)
        return out
    ids = xp.arange(like.shape[-1], device=device(like))
    return xp.astype(ids == best, like.dtype)


def _top_p_min_p(xp: Any, probs: Array, params: SamplingParams) -> Array:
    if params.top_p is not None and params.top_p < 1:
        # Keep the most likely tokens while the mass *before* them is < top_p; the
        # last kept value is the threshold (ties at the threshold are all kept).
        threshold = top_p_threshold(probs, params.top_p)
        probs = _renormalise(xp, _keep(xp, probs, probs, threshold))
    if params.min_p is not None and params.min_p > 0:
        floor = params.min_p * xp.max(probs, axis=-1, keepdims=True)
        probs = _renormalise(xp, _keep(xp, probs, probs, floor))
    return probs
