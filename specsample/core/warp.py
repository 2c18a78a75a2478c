"""Logits -> probabilities: temperature, top-k, top-p, min-p, the same for p and q."""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np

from specsample._array import Array, check_logits, check_logits_shape, device, namespace
from specsample.core.params import SamplingParams
from specsample.kernels import dispatch
from specsample.kernels.select import GROUP, grouped, kth_largest, top_p_threshold, zero_outside_top_p

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


def _minus(xp: Any, x: Array, y: Array, in_place: bool) -> Array:
    """x - y, written over x where `in_place` and x may be overwritten."""
    if in_place and _owned(x):
        if array_api_compat.is_torch_array(x):
            return x.sub_(y)
        return np.subtract(x, y, out=x)
    return x - y


def _renormalise(xp: Any, probs: Array) -> Array:
    if _owned(probs):
        # The arrays' own sum methods: the namespace's wrapper adds a call on every warp.
        if array_api_compat.is_torch_array(probs):
            return probs.div_(probs.sum(dim=-1, keepdim=True))
        return np.divide(probs, probs.sum(axis=-1, keepdims=True), out=probs)
    return probs / xp.sum(probs, axis=-1, keepdims=True)


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
    if key is values and _zero_compiled(values, floor):
        return values
    if _eager_torch_cpu(values) and _owned(values):
        import torch

        if key is values and _mask_by_rows(values, floor):
            return values
        size = floor.abs()
        if bool(torch.all(torch.isfinite(size) & ((size == 0) | (size >= 2.0**-100)))):
            step = torch.sub(key, floor).sign_().add_(1).clamp_(max=1)
            return values.mul_(step)
    return xp.where(key >= floor, values, 0.0)


def _zero_compiled(values: Any, floor: Any) -> bool:
    """For host `values` [..., V] that may be overwritten (NumPy, or eager torch CPU) and
    finite per-row floors [..., 1] of their dtype: zero the entries below their row's floor
    in place with the compiled pass (one read of each row), and say so; False (nothing
    done) where numba is absent or another path must do it."""
    if not dispatch.available() or not _owned(values):
        return False
    if array_api_compat.is_torch_array(values):
        if not _eager_torch_cpu(values) or not values.is_contiguous() or floor.dtype != values.dtype:
            return False
        rows, floors = values.detach().numpy(), floor.detach().contiguous().numpy()
    elif array_api_compat.is_numpy_array(values) and values.flags.c_contiguous \
            and floor.dtype == values.dtype and values.dtype in (np.float32, np.float64):
        rows, floors = values, np.ascontiguousarray(floor)
    else:
        return False
    vocab = int(rows.shape[-1])
    if floors.shape != (*rows.shape[:-1], 1) or vocab == 0 or not np.isfinite(floors).all():
        return False
    dispatch.zero_below(rows.reshape(-1, vocab), floors.reshape(-1))
    return True


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
    """The top-k warp of eager torch CPU logits with one pass over whole rows before the
    output's: the k-th largest scaled logit and the kept entries come from the groups (of
    `GROUP` consecutive entries) whose maxima are among the k largest, and the kept values
    are written into zeros. The output is the full path's bit for bit. None (the caller
    takes the full path) where autograd records the logits, where they are not contiguous
    (the full path's row sums then run in their layout's order), for an empty batch, and
    where a row's maxima pick fewer than k groups (NaN, unchecked) or more than a quarter
    of them (fewer than k finite groups, wide ties), which the full path does faster.

    The selections run on NumPy views of torch's arrays (their per-call cost is a fraction
    of torch's at these sizes); what decides bits stays in torch: the scaling, exp and the
    row sums. Division is correctly rounded in both libraries, so the kept values divided
    by torch's row sum are the full path's normalised entries.
    """
    import torch

    if (logits.requires_grad and torch.is_grad_enabled()) or not logits.is_contiguous():
        return None
    k, temperature = int(params.top_k or 0), params.temperature
    vocab = int(logits.shape[-1])
    rows = logits.detach().view(-1, vocab)  # [R, V]
    count, groups = int(rows.shape[0]), vocab // GROUP
    if count == 0:
        return None
    maxima = rows.unflatten(-1, (groups, GROUP)).amax(dim=-1)  # [R, G]
    if dispatch.available():
        return _top_k_compiled(logits, rows, maxima, k, temperature)
    # max(x / t) == max(x) / t: rounding is monotone, so each group's largest logit scales to
    # its largest scaled one. The groups are chosen on the scaled maxima: scaling may merge a
    # logit just below the k-th largest with it, and the full path keeps both.
    scaled_maxima = (maxima if temperature == 1 else maxima / temperature).numpy()
    peak = torch.from_numpy(scaled_maxima.max(axis=-1, keepdims=True))  # [R, 1]
    if check:
        _check_peak(logits, peak, temperature)
    # Every group whose scaled maximum reaches the k-th largest: at least k groups holding k
    # scaled values >= it, so the k-th largest scaled entry is at least that maximum and every
    # entry of a group left out is below it. Ties may take more than k groups in a row.
    level = np.partition(scaled_maxima, groups - k, axis=-1)[:, groups - k:groups - k + 1]  # [R, 1]
    row, group = np.nonzero(scaled_maxima >= level)
    sizes = np.bincount(row, minlength=count)
    width = int(sizes.max())
    # Fewer than k groups (NaN rows, unchecked) or many (rows with fewer than k finite
    # groups, or wide ties): the full path.
    if int(sizes.min()) < k or width > groups // 4:
        return None
    flat = (row * groups + group)[:, None] * GROUP + np.arange(GROUP)  # [n, GROUP] into rows.view(-1)
    source = rows.numpy().reshape(-1)
    even = int(sizes.min()) == width  # the same number of groups in every row
    if even:  # [R, width * GROUP] at once
        flat = flat.reshape(count, -1)
        values = torch.from_numpy(source[flat])
    else:  # pad the shorter rows with -inf (below every kept value) and index -1
        slots = np.arange(row.size) - np.repeat(np.cumsum(sizes) - sizes, sizes) + row * width
        padded = np.full((count * width, GROUP), -1, dtype=np.int64)
        padded[slots] = flat
        flat = padded.reshape(count, -1)
        values = torch.from_numpy(np.where(flat >= 0, source[flat], -np.inf).astype(source.dtype, copy=False))
    if temperature != 1:
        values = values / temperature
    scaled = values.numpy()
    place = scaled.shape[-1] - k
    kth = np.partition(scaled, place, axis=-1)[:, place:place + 1]  # [R, 1], the k-th largest
    kept = _exp(torch, values - peak).numpy()  # the chosen groups only: a short row
    kept[scaled < kth] = 0.0
    out = torch.zeros_like(logits)
    written = out.view(-1).numpy()
    if not even:  # padded: write the real entries alone
        real = flat >= 0
        flat, kept = flat[real], kept[real]
    written[flat] = kept
    # The full path's normaliser: torch's sum over the whole row, zeros included.
    total = out.view(count, vocab).sum(dim=-1, keepdim=True).numpy()  # [R, 1]
    written[flat] = kept / (total if even else total[flat // vocab, 0])
    return out


def _top_k_compiled(logits: Any, rows: Any, maxima: Any, k: int, temperature: float) -> Any:
    """`_top_k_groups` with its selections in one compiled call (`dispatch.top_k_candidates`:
    the same maxima, level, picked groups and k-th largest, where NumPy's calls each cost tens
    of microseconds); exp and the row sums stay in torch. None where that call declines a
    row (NaN, +inf, a row of -inf, wide ties): the full path then checks and warps."""
    import torch

    found = dispatch.top_k_candidates(rows.numpy(), maxima.numpy(), k, temperature)
    if found is None:
        return None
    scaled, flat, peak, kth = found
    count, vocab = int(rows.shape[0]), int(rows.shape[1])
    values = _exp(torch, torch.from_numpy(scaled) - torch.from_numpy(peak)[:, None]).numpy()
    out = torch.zeros_like(logits)
    # The full path's normaliser: torch's sum over the whole row, zeros included.
    dispatch.top_k_write(out.view(-1).numpy(), values, scaled, kth, flat,
                         lambda: out.view(count, vocab).sum(dim=-1).numpy())
    return out


def _check_peak(logits: Array, peak: Array, temperature: float) -> None:
    """Raise unless every row maximum of logits / temperature is finite: one small check
    on the row maxima that the warp computes anyway (NaN propagates through them)."""
    xp = namespace(peak)
    if _eager_torch_cpu(peak):  # NumPy's test of a few values costs a fraction of torch's
        finite = np.isfinite(peak.detach().numpy()).all()
    elif array_api_compat.is_torch_array(peak):
        finite = peak.isfinite().all()
    else:
        finite = xp.all(xp.isfinite(peak))
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
        Temperature 0 gives a one-hot at the argmax (ties: the lowest index). On torch
        arrays without top-k the probabilities before top-p and min-p are torch's own
        `softmax(logits / temperature)`; elsewhere exp(x - max) over its sum.
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
    top_k = params.top_k if params.top_k is not None and params.top_k < vocab else None
    if top_k is None and array_api_compat.is_torch_array(logits):
        return _top_p_min_p(xp, _softmax(logits, scaled, params.temperature, check), params)
    # max(x / t) == max(x) / t: rounding is monotone, so the largest logit scales to the largest.
    peak = xp.max(scaled, axis=-1, keepdims=True)
    if check:
        _check_peak(logits, peak, params.temperature)
    # The row maximum always survives top-k. Masking after exp gives the same zeros as exp(-inf)
    # and spares exp the -inf entries, its slow path.
    # A scaled copy that top-k does not read again is shifted in place: no new array.
    shifted = _exp(xp, _minus(xp, scaled, peak, scaled is not logits and top_k is None))
    if top_k is not None:
        shifted = _keep(xp, shifted, scaled, kth_largest(scaled, top_k))
    return _top_p_min_p(xp, _renormalise(xp, shifted), params)


def _softmax(logits: Array, scaled: Array, temperature: float, check: bool) -> Array:
    """softmax(scaled) over the last axis by torch's fused kernel: one call where the
    separate maximum, shift, exp, sum and division cost five passes and five calls, and the
    probabilities torch users compute. Masked (-inf) entries come out exactly 0.

    The check reads one entry per row: the kernel divides exp(x - max) by its row sum, and a
    row with a NaN, a +inf (or an entry that the temperature scaled to +inf) or no finite
    entry has a NaN in that sum (NaN - max, inf - inf or -inf + inf), which makes every
    entry of the row NaN; a finite row maximum makes every entry finite (exp(x - max) <= 1
    and the sum >= 1). `tests/test_warp.py` holds torch to this for each position.
    """
    import torch

    probs = torch.softmax(scaled, dim=-1)
    if not check:
        return probs
    if _eager_torch_cpu(probs):  # NumPy's test of a few values costs a fraction of torch's
        host = probs.detach().numpy()
        finite = bool(np.isfinite(host.reshape(-1, host.shape[-1])[:, 0]).all())
    else:
        finite = bool(probs[..., 0].isfinite().all())
    if not finite:
        _check_peak(logits, torch.amax(scaled, dim=-1, keepdim=True), temperature)
        raise ValueError("logits: the softmax of logits / params.temperature is not finite; expected "
                         "finite logits (or -inf for masked tokens)")
    return probs


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
        if not (_owned(probs) and zero_outside_top_p(probs, params.top_p)):  # in place, one pass
            threshold = top_p_threshold(probs, params.top_p)
            probs = _keep(xp, probs, probs, threshold)
        probs = _renormalise(xp, probs)
    if params.min_p is not None and params.min_p > 0:
        floor = params.min_p * xp.max(probs, axis=-1, keepdims=True)
        probs = _renormalise(xp, _keep(xp, probs, probs, floor))
    return probs
