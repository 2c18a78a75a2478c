"""warp: temperature, top-k, top-p, min-p; greedy; backends agree; bad logits."""

from __future__ import annotations

import array_api_compat
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specsample import SamplingParams, warp
from specsample.kernels import dispatch, select


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_temperature_only_is_a_tempered_softmax():
    logits = np.random.default_rng(0).normal(size=(3, 7))
    out = warp(logits, SamplingParams(temperature=0.5))
    assert np.allclose(out, _softmax(logits / 0.5), atol=1e-15)


def test_greedy_is_one_hot_at_the_lowest_argmax():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    out = warp(logits, SamplingParams(temperature=0))
    assert np.array_equal(out, np.array([[0, 1, 0, 0], [1, 0, 0, 0]], dtype=np.float64))


@pytest.mark.parametrize("library", ["numpy-float32", "torch-float32", "torch-float64"])
def test_greedy_writes_the_same_one_hot_as_the_comparison(library: str) -> None:
    # The written one-hot against the comparison it replaces, for every library, rank and dtype.
    logits = _as(library, np.random.default_rng(4).normal(size=(2, 3, 50)).round(1))  # ties
    got = warp(logits, SamplingParams(temperature=0))
    assert _same(got, _sorted_warp(logits, SamplingParams(temperature=0)))
    assert _same(warp(logits[0, 0], SamplingParams(temperature=0)),
                 _sorted_warp(logits[0, 0], SamplingParams(temperature=0)))
    strided = logits[:, ::2, ::3]  # not contiguous
    greedy = SamplingParams(temperature=0)
    assert _same(warp(strided, greedy), _sorted_warp(strided, greedy))
    masked = _as(library, np.where(np.arange(50) % 7 == 0, -np.inf, np.zeros((2, 50))))  # all ties, -inf
    assert _same(warp(masked, greedy), _sorted_warp(masked, greedy))


def test_top_k_keeps_k_and_zeroes_the_rest_exactly():
    logits = np.array([[0.1, 2.0, 1.0, -1.0, 3.0]])
    out = warp(logits, SamplingParams(top_k=2))
    assert np.count_nonzero(out) == 2 and out[0, 2] == 0.0 and out[0, 0] == 0.0
    assert np.allclose(out[0, [1, 4]], _softmax(logits[0, [1, 4]]))


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([[0.5, 0.3, 0.15, 0.05]])
    out = warp(np.log(probs), SamplingParams(top_p=0.79))
    assert np.array_equal(out > 0, np.array([[True, True, False, False]]))
    out = warp(np.log(probs), SamplingParams(top_p=0.85))
    assert np.array_equal(out > 0, np.array([[True, True, True, False]]))
    assert np.allclose(out.sum(-1), 1.0)


def test_min_p_scales_with_the_top_probability():
    probs = np.array([[0.6, 0.3, 0.07, 0.03]])
    out = warp(np.log(probs), SamplingParams(min_p=0.1))
    assert np.array_equal(out > 0, np.array([[True, True, True, False]]))


def test_the_order_is_temperature_top_k_top_p_min_p():
    logits = np.random.default_rng(1).normal(size=(5, 50))
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05)
    out = warp(logits, params)
    step = _softmax(logits / 0.7)
    kth = np.sort(step, -1)[:, -20][:, None]
    step = np.where(step >= kth, step, 0)
    step /= step.sum(-1, keepdims=True)
    ranked = -np.sort(-step, -1)
    keep = ((np.cumsum(ranked, -1) - ranked) < 0.9).sum(-1)
    threshold = ranked[np.arange(5), keep - 1][:, None]
    step = np.where(step >= threshold, step, 0)
    step /= step.sum(-1, keepdims=True)
    step = np.where(step >= 0.05 * step.max(-1, keepdims=True), step, 0)
    step /= step.sum(-1, keepdims=True)
    assert np.allclose(out, step, atol=1e-12)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0),
                                    SamplingParams(temperature=0.8, top_k=5, top_p=0.7, min_p=0.02)])
def test_numpy_and_torch_agree(params):
    logits = np.random.default_rng(2).normal(size=(4, 3, 40))
    ref = warp(logits, params)
    out = warp(torch.from_numpy(logits), params)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    assert np.allclose(ref, out.numpy(), atol=1e-14)
    assert np.array_equal(ref == 0, out.numpy() == 0)


def test_minus_inf_marks_a_masked_token():
    out = warp(np.array([[0.0, -np.inf, 1.0]]), SamplingParams())
    assert out[0, 1] == 0.0 and np.isclose(out.sum(), 1.0)


@pytest.mark.parametrize(("logits", "error", "match"), [
    (np.array([[0.0, np.nan]]), ValueError, "logits: expected finite logits"),
    (np.array([[0.0, np.inf]]), ValueError, r"logits: .*1 \+inf"),
    (np.array([[-np.inf, -np.inf]]), ValueError, "logits: expected at least one finite logit"),
    (np.array([[1, 2]]), TypeError, "logits: expected a real floating-point array"),
    (np.zeros((2, 0)), ValueError, "V >= 1"),
])
def test_bad_logits(logits, error, match):
    with pytest.raises(error, match=match):
        warp(logits, SamplingParams())


def test_params_must_be_sampling_params():
    with pytest.raises(TypeError, match="params: expected SamplingParams, got dict"):
        warp(np.zeros((1, 3)), {"temperature": 1.0})  # type: ignore[arg-type]


# -- the selection paths equal the full-sort implementation they replace -----------------------


def _sorted_warp(logits, params):  # type: ignore[no-untyped-def]
    """The previous implementation, kept as the oracle: full sorts for top-k and top-p."""
    xp = array_api_compat.array_namespace(logits)
    vocab = logits.shape[-1]
    if params.greedy:
        best = xp.argmax(logits, axis=-1, keepdims=True)
        ids = xp.arange(vocab, device=array_api_compat.device(logits))
        return xp.astype(ids == best, logits.dtype)

    def renormalise(probs):  # type: ignore[no-untyped-def]
        return probs / xp.sum(probs, axis=-1, keepdims=True)

    scaled = logits / params.temperature
    if params.top_k is not None and params.top_k < vocab:
        kth = xp.sort(scaled, axis=-1, descending=True)[..., params.top_k - 1 : params.top_k]
        scaled = xp.where(scaled >= kth, scaled, -xp.inf)
        probs = renormalise(xp.exp(scaled - xp.max(scaled, axis=-1, keepdims=True)))
    elif isinstance(scaled, torch.Tensor):  # torch's fused softmax, as `warp` computes it on torch CPU
        probs = torch.softmax(scaled, dim=-1)
    else:
        probs = renormalise(xp.exp(scaled - xp.max(scaled, axis=-1, keepdims=True)))
    if params.top_p is not None and params.top_p < 1:
        ranked = xp.sort(probs, axis=-1, descending=True)
        before = xp.cumulative_sum(ranked, axis=-1) - ranked
        kept = xp.sum(xp.astype(before < params.top_p, xp.int64), axis=-1, keepdims=True)
        threshold = xp.take_along_axis(ranked, kept - 1, axis=-1)
        probs = renormalise(xp.where(probs >= threshold, probs, 0.0))
    if params.min_p is not None and params.min_p > 0:
        floor = params.min_p * xp.max(probs, axis=-1, keepdims=True)
        probs = renormalise(xp.where(probs >= floor, probs, 0.0))
    return probs


LIBRARIES = ["numpy-float64", "numpy-float32", "torch-float64", "torch-float32"]


def _as(library: str, x: np.ndarray):  # type: ignore[no-untyped-def]
    dtype = library.split("-")[1]
    return torch.from_numpy(x.astype(dtype)) if library.startswith("torch") else x.astype(dtype)


def _random_logits(seed: int, rows: int, vocab: int, spread: float, ties: str, masked: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(rows, vocab)) * spread
    if ties == "round":
        logits = np.round(logits)
    elif ties == "few":  # three distinct values: ties at every threshold
        logits = rng.integers(0, 3, size=(rows, vocab)) * spread
    logits[rng.random((rows, vocab)) < masked] = -np.inf
    logits[np.arange(rows), rng.integers(0, vocab, rows)] = 0.0  # one finite logit per row
    return logits


def _same(got, want) -> bool:  # type: ignore[no-untyped-def]
    if type(got) is not type(want) or got.dtype != want.dtype:
        return False
    return torch.equal(got, want) if isinstance(got, torch.Tensor) else np.array_equal(got, want)


TOP_P = st.sampled_from([1e-9, 0.1, 0.5, 0.9, 0.95, 0.999, 1 - 1e-7, 1 - 2**-24, 1 - 1e-12, 1.0]) | st.floats(
    1e-6, 1.0)


# Each example compares every output entry bit for bit (no tolerance): top-k by partial
# selection, top-p from the proven histogram threshold or the sort for unproven rows.
@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4),
       vocab=st.sampled_from([1, 2, 5, 64, 1000, 4096]),
       spread=st.sampled_from([0.0, 0.1, 1.0, 3.0, 10.0, 60.0]),
       ties=st.sampled_from(["none", "round", "few"]),
       masked=st.sampled_from([0.0, 0.5, 0.99]), temperature=st.sampled_from([0.0, 0.3, 1.0, 2.0]),
       top_k=st.none() | st.integers(1, 4100), top_p=st.none() | TOP_P,
       min_p=st.none() | st.sampled_from([0.0, 0.05, 0.5, 1.0]), library=st.sampled_from(LIBRARIES))
def test_warp_equals_the_full_sort_warp(seed, rows, vocab, spread, ties, masked, temperature, top_k, top_p,
                                        min_p, library):  # type: ignore[no-untyped-def]
    logits = _as(library, _random_logits(seed, rows, vocab, spread, ties, masked))
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    assert _same(warp(logits, params), _sorted_warp(logits, params))


# The same without the compiled passes (`specsample.kernels.dispatch`): the NumPy and torch paths
# that machines without numba take.
@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4), vocab=st.sampled_from([5, 1000, 4096]),
       spread=st.sampled_from([0.0, 1.0, 3.0, 10.0]), ties=st.sampled_from(["none", "round", "few"]),
       masked=st.sampled_from([0.0, 0.99]), temperature=st.sampled_from([0.3, 1.0]),
       top_k=st.none() | st.integers(1, 4100), top_p=st.none() | TOP_P,
       min_p=st.none() | st.sampled_from([0.0, 0.05]), library=st.sampled_from(LIBRARIES))
def test_warp_without_the_compiled_passes_equals_the_full_sort_warp(
        seed, rows, vocab, spread, ties, masked, temperature, top_k, top_p, min_p, library):  # type: ignore[no-untyped-def]
    logits = _as(library, _random_logits(seed, rows, vocab, spread, ties, masked))
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    dispatch.enabled = False
    try:
        assert _same(warp(logits, params), _sorted_warp(logits, params))
    finally:
        dispatch.enabled = True


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("spread", [1.0, 3.0, 8.0])
def test_warp_equals_the_full_sort_warp_at_a_real_vocabulary(library: str, spread: float, compiled: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "enabled", compiled)
    logits = _as(library, _random_logits(int(spread), 6, 49152, spread, "none", 0.0).reshape(2, 3, 49152))
    one = SamplingParams(top_p=0.9)
    assert _same(warp(logits[0, 0], one), _sorted_warp(logits[0, 0], one))  # a single row [V]
    for params in (SamplingParams(top_p=0.9), SamplingParams(top_k=50),
                   SamplingParams(temperature=0.7, top_p=0.5),
                   SamplingParams(top_k=2000, top_p=0.95, min_p=0.01), SamplingParams(top_p=1 - 1e-7)):
        assert _same(warp(logits, params), _sorted_warp(logits, params)), params


def test_torch_cpu_accumulates_float32_cumulative_sums_in_float64() -> None:
    # The top-p proof bounds the sort's rounding with float64 accumulation on torch CPU.
    x = torch.from_numpy(np.random.default_rng(0).random(49152, dtype=np.float32) * 1e-4)
    got = torch.cumsum(x, 0)
    assert torch.equal(got, torch.from_numpy(np.cumsum(x.numpy().astype(np.float64)).astype(np.float32)))
    assert not torch.equal(got, torch.from_numpy(np.cumsum(x.numpy())))  # a float32 sum differs


@pytest.mark.parametrize("library", LIBRARIES)
def test_unproven_rows_take_the_sort_and_proven_rows_keep_the_candidate(library: str) -> None:
    # Row 0 puts top_p on a prefix mass (0.5 + 0.3: the proof cannot tell the sort's rounding);
    # row 1 is far from any prefix mass. Both must equal the sort.
    probs = np.array([[0.5, 0.3, 0.2, 0.0], [0.6, 0.25, 0.1, 0.05]])
    rows = _as(library, probs)
    xp = array_api_compat.array_namespace(rows)
    _, proven = select._bucket_threshold(xp, rows, 0.8)
    assert np.asarray(proven).tolist() == [False, True]
    assert _same(select.top_p_threshold(rows, 0.8), select.sorted_threshold(rows, 0.8))


@pytest.mark.parametrize("library", LIBRARIES)
def test_the_proof_bites_a_candidate_off_the_sort_is_never_proven(library: str) -> None:
    # Negative control: on flat rows (~30000 tokens kept) the float cumsum's rounding moves the
    # sort's threshold off the exact-mass candidate in some rows; every such row must be unproven.
    logits = _random_logits(5, 64, 49152, 1.0, "none", 0.0)
    probs = _as(library, np.exp(logits) / np.exp(logits).sum(-1, keepdims=True))
    xp = array_api_compat.array_namespace(probs)
    candidate, proven = (np.asarray(a) for a in select._bucket_threshold(xp, probs, 0.9))
    truth = np.asarray(select.sorted_threshold(probs, 0.9))[:, 0]
    assert not np.any(proven & (candidate != truth))
    if library == "numpy-float32":  # float32 accumulation: off by many entries, never proven
        assert np.any(candidate != truth) and not np.any(proven)
    else:  # float64 accumulation: the proof holds for most rows
        assert proven.mean() > 0.8


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_torch_takes_the_sort(dtype: torch.dtype) -> None:
    logits = torch.from_numpy(_random_logits(3, 4, 2000, 3.0, "none", 0.0)).to(dtype)
    for params in (SamplingParams(top_p=0.9), SamplingParams(top_k=50, top_p=0.5)):
        assert _same(warp(logits, params), _sorted_warp(logits, params))


# The grouped top-k path (torch, V >= 4096, k <= V / 128): ties that reach outside the chosen
# groups (the "few" rows: three values), rows with fewer finite logits than k (masked 0.99),
# and temperatures that merge distinct logits; every output bit for bit the full sort's.
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ties", ["none", "round", "few"])
@pytest.mark.parametrize("masked", [0.0, 0.99])
@pytest.mark.parametrize("vocab", [4096, 49152])
def test_grouped_top_k_equals_the_full_sort_warp(dtype: str, ties: str, masked: float, vocab: int) -> None:
    logits = _as(f"torch-{dtype}", _random_logits(vocab + len(ties), 5, vocab, 3.0, ties, masked))
    for params in (SamplingParams(top_k=1), SamplingParams(top_k=7, temperature=0.3),
                   SamplingParams(top_k=32, temperature=1 + 2**-20), SamplingParams(top_k=32, top_p=0.9),
                   SamplingParams(top_k=20, temperature=2.0, min_p=0.05)):
        assert _same(warp(logits, params), _sorted_warp(logits, params)), params
        assert _same(warp(logits[:, None], params), _sorted_warp(logits[:, None], params)), params


# One row's group maxima tie at the k-th largest (21 groups reach it where the other rows
# have 7), so the rows hold different numbers of groups and the short ones are padded; and
# logits laid out column-major, whose row sums run in another order (the full path's, bit
# for bit: the grouped path, which sums contiguous rows, must leave them to it). The last
# vocabulary entry is every row's largest: a write at a padding index (-1) would show.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grouped_top_k_pads_rows_with_tied_maxima_and_leaves_strided_logits_to_the_full_path(
        dtype: torch.dtype) -> None:
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(3, 4096))
    logits[1, ::32][:20] = 9.0  # 20 groups whose maximum is 9
    logits[:, -1] = 12.0
    tied = torch.from_numpy(logits).to(dtype)
    strided = torch.from_numpy(np.asfortranarray(logits)).to(dtype)
    assert not strided.is_contiguous()
    for params in (SamplingParams(top_k=7), SamplingParams(top_k=7, temperature=0.3)):
        for x in (tied, strided):
            out = warp(x, params)
            assert _same(out, _sorted_warp(x, params)), params
            assert int((out[1] > 0).sum()) == 21 and int((out[0] > 0).sum()) == 7
            assert bool((out[:, -1] > 0).all())


# Scaling merges two logits: b just below a in another group, b / T == a / T. With top_k=1
# the full path keeps both (the scaled values tie); choosing the groups on the unscaled
# maxima would keep a alone. Also an empty batch, and a NaN row with check=False (the
# full path's NaN, not a row of zeros).
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grouped_top_k_chooses_groups_on_the_scaled_maxima(dtype: torch.dtype) -> None:
    x = torch.full((2, 4096), -3.0, dtype=dtype)
    a = torch.tensor(1.543625, dtype=dtype)
    x[:, 0], x[:, 32] = a, torch.nextafter(a, torch.tensor(-np.inf, dtype=dtype))
    t = next(t for t in (0.3 + 0.01 * i for i in range(300)) if bool((x[0, 0] / t == x[0, 32] / t).item()))
    out = warp(x, SamplingParams(top_k=1, temperature=t))
    assert _same(out, _sorted_warp(x, SamplingParams(top_k=1, temperature=t)))
    assert bool((out[:, 0] == out[:, 32]).all()) and bool((out[:, 0] == 0.5).all())
    empty = torch.zeros((0, 4096), dtype=dtype)
    assert warp(empty, SamplingParams(top_k=7)).shape == (0, 4096)
    x[1, 5] = float("nan")
    assert bool(warp(x, SamplingParams(top_k=1), check=False)[1].isnan().all())


def test_the_float_step_masks_like_where_next_to_zero_and_infinities() -> None:
    import importlib

    warping = importlib.import_module("specsample.core.warp")

    key = torch.tensor([[-np.inf, -1e-40, 0.0, 1e-40, 1e-30, 2.0, np.inf]], dtype=torch.float32)
    values = torch.arange(1.0, 8.0)[None]
    for floor in (-np.inf, -1.0, -1e-40, 0.0, 1e-40, 1e-30, 1e-20, 2.0):
        at = torch.tensor([[floor]], dtype=torch.float32)
        want = torch.where(key >= at, values, 0.0)
        assert torch.equal(warping._keep(torch, values.clone(), key, at), want), floor


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masking_a_row_by_itself_keeps_exactly_the_entries_at_or_above_its_floor(dtype: torch.dtype) -> None:
    # Top-p and min-p mask a row by its own values, in place, a row at a time; floors too
    # small for that (or not finite) take the float step instead. Both give `where`'s bits.
    import importlib

    warping = importlib.import_module("specsample.core.warp")
    values = torch.tensor([[0.0, 1e-40, 2.0**-100, 0.1, 0.2, 0.2, 0.5]], dtype=dtype).repeat(3, 1)
    for floor in (0.2, 0.1 + 1e-9, 2.0**-100, 1e-40, 0.0, 0.5, 1.0):
        at = torch.full((3, 1), floor, dtype=dtype)
        want = torch.where(values >= at, values, 0.0)
        copy = values.clone()
        assert torch.equal(warping._keep(torch, copy, copy, at), want), floor
        rows = values.clone()
        assert warping._mask_by_rows(rows, at) == (floor >= 2.0**-100), floor  # which path ran
        assert torch.equal(rows, want if floor >= 2.0**-100 else values), floor
    # Negative control: `threshold` at the floor itself (x > floor) drops the entries equal to it.
    assert not torch.equal(torch.nn.functional.threshold(values, 0.2, 0.0),
                           torch.where(values >= 0.2, values, 0.0))


def test_a_temperature_that_overflows_the_logits_is_named() -> None:
    with pytest.raises(ValueError, match=r"params\.temperature"):
        warp(torch.tensor([[1.0, 3e38]]), SamplingParams(temperature=0.5))
    with pytest.raises(ValueError, match="NaN"):
        warp(torch.tensor([[1.0, float("nan")]]), SamplingParams(temperature=0.5))


# `warp`'s torch path without top-k reads one probability per row to find a bad row: the
# fused softmax must turn a NaN, a +inf or a row of -inf anywhere (first, middle, last entry,
# across vector-width tails) into a NaN in that row's first entry.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 2, 17, 4099, 49152])
def test_the_softmax_path_names_a_bad_entry_wherever_it_lies(dtype: torch.dtype, vocab: int) -> None:
    base = torch.from_numpy(np.random.default_rng(vocab).normal(size=(3, vocab))).to(dtype)
    for params in (SamplingParams(), SamplingParams(temperature=0.5), SamplingParams(top_p=0.9)):
        for at in sorted({0, vocab // 2, vocab - 1}):
            for bad, match in ((float("nan"), "NaN"), (float("inf"), r"\+inf")):
                logits = base.clone()
                logits[1, at] = bad
                with pytest.raises(ValueError, match=match):
                    warp(logits, params)
        masked = base.clone()
        masked[2] = -float("inf")
        with pytest.raises(ValueError, match="at least one finite logit"):
            warp(masked, params)
        assert bool(torch.isnan(torch.softmax(masked, dim=-1)[2]).all())  # what the check reads
    # The masked entries of good rows are exactly 0, and the path is torch's softmax.
    logits = base.clone()
    logits[:, ::2] = -float("inf")
    logits[:, -1] = 0.0
    out = warp(logits, SamplingParams(temperature=0.5))
    assert bool((out[:, :-1:2] == 0).all()) and torch.equal(out, torch.softmax(logits / 0.5, dim=-1))


def test_warp_under_autograd_gives_gradients() -> None:
    logits = torch.randn(2, 4096, dtype=torch.float64, requires_grad=True)
    for params in (SamplingParams(temperature=0.7), SamplingParams(top_k=5), SamplingParams(top_p=0.5)):
        probs = warp(logits, params)
        (probs * torch.arange(4096.0, dtype=torch.float64)).sum().backward()
        assert logits.grad is not None and bool(torch.isfinite(logits.grad).all())
        logits.grad = None


def _normal_probs(seed: int, rows: int, spread: float) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(rows, 49152)) * spread
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95])
def test_the_candidate_threshold_proves_most_rows_and_each_is_the_sorts(library: str, top_p: float) -> None:
    # Rows keeping a few percent of the vocabulary are proven from the candidates above the
    # sampled level, without a histogram or a sort, in every library and dtype.
    probs = _as(library, _normal_probs(int(100 * top_p), 64, 3.0))
    candidate, proven = select._candidate_threshold(probs, np.asarray(probs), top_p)
    truth = np.asarray(select.sorted_threshold(probs, top_p))[:, 0]
    assert proven.mean() > 0.9 and np.array_equal(candidate[proven], truth[proven])
    assert _same(select.top_p_threshold(probs, top_p), select.sorted_threshold(probs, top_p))


@pytest.mark.parametrize("library", LIBRARIES)
def test_cumulative_sums_of_a_prefix_are_the_prefix_of_the_cumulative_sums(library: str) -> None:
    # What the candidate path rests on: each library's cumulative sum of a row's first n
    # entries has the bits of the first n entries of the whole row's.
    x = _as(library, np.sort(_normal_probs(11, 4, 3.0), axis=-1)[:, ::-1].copy())
    xp = array_api_compat.array_namespace(x)
    whole = xp.cumulative_sum(x, axis=-1)
    for n in (1, 7, 100, 1023, 1024, 1025, 4096, 20000):
        assert _same(xp.cumulative_sum(x[:, :n], axis=-1), whole[:, :n]), n


def test_the_candidate_path_bites_a_float64_sum_of_float32_rows_is_not_the_sort() -> None:
    # Negative control: NumPy float32 rows accumulate the sort's cumulative sum in float32.
    # The same candidates summed in float64 give another threshold in some rows; the
    # candidate path, summing as the sort does, gives the sort's in every proven row.
    probs = _normal_probs(5, 256, 3.0)
    truth = select.sorted_threshold(probs, 0.9)[:, 0]
    wide = probs.astype(np.float64)
    exact = select._candidate_threshold(wide, wide, 0.9)[0].astype(np.float32)
    assert np.any(exact != truth)
    candidate, proven = select._candidate_threshold(probs, probs, 0.9)
    assert proven.mean() > 0.9 and np.array_equal(candidate[proven], truth[proven])
    assert np.array_equal(select.top_p_threshold(probs, 0.9), select.sorted_threshold(probs, 0.9))


def test_top_k_zeros_leave_the_candidates_to_the_positive_entries() -> None:
    probs = torch.from_numpy(_normal_probs(7, 8, 3.0))
    probs[probs < probs.topk(300, dim=-1).values[:, -1:]] = 0.0  # 300 positives per row
    probs /= probs.sum(-1, keepdim=True)  # as top-k leaves them for top-p
    candidate, proven = select._candidate_threshold(probs, probs.numpy(), 0.9)
    truth = np.asarray(select.sorted_threshold(probs, 0.9))[:, 0]
    assert proven.all() and np.array_equal(candidate, truth)
