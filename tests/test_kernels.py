"""The compiled top-p pass: every threshold it proves is the full sort's, the rows it zeroes
are `where`'s bit for bit, its vector compaction keeps what a mask keeps, and a loose
rounding bound (the negative control) lets wrong thresholds through. The compiled top-k
stage: its k-th largest is NumPy's partition's, it picks the groups and candidates the NumPy
path picks, and declines the rows that path declines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specsample.core.params import SamplingParams
from specsample.core.warp import warp
from specsample.kernels import compiled, dispatch, layout, select


def _probs(seed: int, rows: int, vocab: int, spread: float, dtype: str, masked: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(rows, vocab)) * spread
    logits[rng.random((rows, vocab)) < masked] = -np.inf
    logits[:, 0] = np.maximum(logits[:, 0], 0.0)  # a finite entry in every row
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(dtype)


def _bound(rows: torch.Tensor) -> float:
    return float(select._error(1.0, int(rows.shape[-1]), select._roundoff(rows)))


def test_numba_builds_the_kernels_here() -> None:
    # numba comes with the fast, hf and dev extras: a build that fails where it is installed would
    # leave every caller on its slower path.
    assert dispatch.available()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("spread", [0.5, 1.0, 3.0, 6.0, 12.0])
@pytest.mark.parametrize("masked", [0.0, 0.9, 0.999])
def test_every_proven_threshold_is_the_sorts_and_most_rows_are_proven(dtype: str, spread: float,
                                                                      masked: float) -> None:
    # 40 rows of each vocabulary size (odd ones leave a tail past the last whole vector) and
    # top_p from 0.05 to 0.99: bit-equal thresholds wherever the pass claims a proof.
    proven_rows = 0
    for seed, vocab in enumerate([512, 1000, 4099, 49152]):
        rows = torch.from_numpy(_probs(seed, 10, vocab, spread, dtype, masked))
        for top_p in (0.05, 0.5, 0.9, 0.99):
            truth = select.sorted_threshold(rows, top_p)[:, 0].numpy()
            p = float(np.asarray(top_p, dtype=dtype))
            found, proven = dispatch.top_p_rows(rows.numpy().copy(), p, _bound(rows))
            assert np.array_equal(found[proven], truth[proven])
            proven_rows += int(proven.sum())
    assert proven_rows >= 0.95 * 160


def test_a_level_the_sample_puts_too_high_is_lowered_to_every_positive_entry() -> None:
    # The strided sample sees entry 0 (0.3) and the small ones; the 0.003 entries that hold the
    # threshold sit off the sample, so its level (at 0.3's bucket) leaves the candidates short of
    # top_p. The pass lowers the level and still proves the sort's threshold.
    vocab = 49152
    row = np.full(vocab, 0.15 / (vocab - 102))
    row[0], row[1] = 0.3, 0.25
    off_sample = np.arange(vocab)[np.arange(vocab) % layout.COMPILED_STRIDE != 0][1:101]
    row[off_sample] = 0.003
    rows = torch.from_numpy(row[None, :] / row.sum())
    truth = select.sorted_threshold(rows, 0.7)[:, 0].numpy()
    found, proven = dispatch.top_p_rows(rows.numpy().copy(), 0.7, _bound(rows))
    assert proven.all() and np.array_equal(found, truth)
    assert 0.002 < float(truth[0]) < 0.004  # the threshold is among the off-sample entries


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_zeroing_a_proven_row_is_where_bit_for_bit_and_unproven_rows_are_left(dtype: str) -> None:
    # Row 2 puts top_p on a prefix mass (0.5 + 0.3: the rounding bound cannot decide).
    rows = _probs(7, 3, 4096, 3.0, dtype)
    rows[2] = 0.0
    rows[2, :3] = (0.5, 0.3, 0.2)
    want = np.where(rows >= select.sorted_threshold(torch.from_numpy(rows), 0.8).numpy(), rows, 0.0)
    got = rows.copy()
    _, proven = dispatch.top_p_rows(got, float(np.asarray(0.8, dtype=dtype)), 1e-9, zero=True)
    assert proven.tolist() == [True, True, False]
    assert np.array_equal(got[:2], want[:2].astype(dtype))
    assert np.array_equal(got[2], rows[2])  # untouched: the caller decides it
    assert select.zero_outside_top_p(torch.from_numpy(got), 0.8)  # ... as the warp's caller does
    assert np.array_equal(got, want.astype(dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 1000, 49152])
def test_the_vector_compaction_keeps_what_a_mask_keeps_in_order(dtype: str, vocab: int) -> None:
    from specsample.kernels import compiled

    row = np.random.default_rng(vocab).random(vocab).astype(dtype)
    for level in (0.0, 0.5, 0.99, 2.0):
        out = np.full(vocab + layout.LANES, -1.0, dtype=dtype)
        n = compiled.compact(row, row.dtype.type(level), out)
        assert np.array_equal(out[:n], row[row >= level])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_zero_below_is_where(dtype: str) -> None:
    rows = _probs(3, 4, 1000, 2.0, dtype)
    floor = np.array([0.0, 1e-3, 0.5, 2.0], dtype=dtype)
    got = rows.copy()
    dispatch.zero_below(got, floor)
    assert np.array_equal(got, np.where(rows >= floor[:, None], rows, 0.0))


def test_the_rounding_bound_bites_without_it_wrong_thresholds_are_proven() -> None:
    # Negative control: flat float32 NumPy rows keep ~30,000 tokens, and NumPy's float32
    # cumulative sum moves the sort's threshold off the exact-mass one by many entries. With
    # the bound (float32 accumulation: about 6e-3 of the mass) no row is proven wrongly; with
    # a zero bound some rows are proven off the sort.
    rows = _probs(5, 16, 49152, 1.0, "float32")
    truth = select.sorted_threshold(rows, 0.9)[:, 0]
    p = float(np.float32(0.9))
    bound = float(select._error(1.0, 49152, select._roundoff(rows)))
    found, proven = dispatch.top_p_rows(rows.copy(), p, bound)
    assert not np.any(proven & (found != truth))
    found, proven = dispatch.top_p_rows(rows.copy(), p, 0.0)
    assert np.any(proven & (found != truth))


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="rows: expected a C-contiguous"):
        dispatch.top_p_rows(np.ones((2, 600), dtype=np.float16), 0.5, 1e-9)
    with pytest.raises(ValueError, match="rows: expected a C-contiguous"):
        dispatch.top_p_rows(np.ones((600, 2)).T, 0.5, 1e-9)
    with pytest.raises(ValueError, match="rows, floor"):
        dispatch.zero_below(np.ones((2, 600)), np.ones(3))


def test_switched_off_the_callers_take_their_other_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    probs = torch.from_numpy(_probs(1, 5, 49152, 3.0, "float32"))
    with_kernels = select.top_p_threshold(probs, 0.9)
    monkeypatch.setattr(dispatch, "enabled", False)
    assert not select.zero_outside_top_p(probs.clone(), 0.9)
    assert torch.equal(select.top_p_threshold(probs, 0.9), with_kernels)


def test_the_heap_selection_is_partitions_kth_largest() -> None:
    # Ties (rounded values), -inf entries, sorted and reversed rows (the heap's worst case),
    # k from 1 to n; a negative control: the (k+1)-th largest differs on distinct values.
    rng = np.random.default_rng(0)
    for trial in range(3000):
        n = int(rng.integers(1, 400))
        k = int(rng.integers(1, n + 1))
        x = rng.normal(size=n).astype(np.float32 if trial % 2 else np.float64)
        if trial % 3 == 0:
            x = np.round(x, 1)
        if trial % 5 == 0:
            x[rng.random(n) < 0.3] = -np.inf
        if trial % 7 == 0:
            x = np.sort(x)[::-1].copy() if trial % 2 else np.sort(x)
        heap = np.empty(k, x.dtype)
        assert compiled.kth_largest_of(x, n, k, heap) == np.partition(x, n - k)[n - k]
    distinct = rng.permutation(50).astype(np.float64)
    assert compiled.kth_largest_of(distinct, 50, 5, np.empty(5)) == 45.0
    assert compiled.kth_largest_of(distinct, 50, 6, np.empty(6)) != 45.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_top_k_stage_gives_the_numpy_paths_bits(dtype: torch.dtype,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Uneven rows (one row's maxima tie across many groups), temperatures that merge values,
    # k at the edge of the grouped path (V / 128): the warp with the stage and without it.
    rng = np.random.default_rng(3)
    logits = torch.from_numpy(rng.normal(size=(2, 3, 8192)) * 3).to(dtype)
    logits[0, 1] = -logits[0, 1].abs()
    logits[0, 1, 64 * np.arange(60)] = 5.0  # 60 groups tie at the top: a wider row, the others padded
    logits[1, 2] = torch.round(logits[1, 2] * 2) / 2  # many ties inside groups
    for params in (SamplingParams(top_k=1), SamplingParams(top_k=50, temperature=0.7),
                   SamplingParams(top_k=64, temperature=1.3, top_p=0.9), SamplingParams(top_k=17, min_p=0.1)):
        with_stage = warp(logits, params)
        monkeypatch.setattr(dispatch, "enabled", False)
        without = warp(logits, params)
        monkeypatch.setattr(dispatch, "enabled", True)
        assert torch.equal(with_stage, without), params


def test_the_compiled_top_k_stage_declines_what_the_numpy_path_declines() -> None:
    rows = np.random.default_rng(4).normal(size=(3, 4096)).astype(np.float32)
    maxima = lambda r: r.reshape(r.shape[0], -1, 32).max(-1)  # noqa: E731
    assert dispatch.top_k_candidates(rows, maxima(rows), 8, 0.7) is not None
    for bad in (np.nan, np.inf):
        broken = rows.copy()
        broken[1, 100] = bad
        assert dispatch.top_k_candidates(broken, maxima(broken), 8, 0.7) is None
    masked = rows.copy()
    masked[2] = -np.inf
    assert dispatch.top_k_candidates(masked, maxima(masked), 8, 1.0) is None
    flat = np.zeros((1, 4096), np.float32)  # every group ties: more than a quarter picked
    assert dispatch.top_k_candidates(flat, maxima(flat), 8, 1.0) is None
    overflow = np.full((1, 4096), 3e38, np.float32)  # finite logits, scaled to +inf
    assert dispatch.top_k_candidates(overflow, maxima(overflow), 8, 0.5) is None
    with pytest.raises(ValueError, match="rows, maxima, k"):
        dispatch.top_k_candidates(rows, maxima(rows), 33, 1.0)  # k > G / 4


def test_the_scratch_arrays_come_back_clear() -> None:
    # The pass keeps each thread's histograms between calls and clears only what it wrote:
    # after calls on varied rows they are zeros again, and a later call gives the same bits.
    rows = torch.from_numpy(_probs(8, 6, 49152, 3.0, "float32"))
    first = dispatch.top_p_rows(rows.numpy().copy(), float(np.float32(0.9)), _bound(rows))
    for seed, spread in enumerate([0.5, 6.0, 12.0]):
        other = _probs(seed, 4, 49152, spread, "float32", 0.9)
        dispatch.top_p_rows(other, float(np.float32(0.5)), 1e-9, zero=True)
    hist, squares, _ = dispatch._scratch(49152, np.dtype(np.float32))
    assert not hist.any() and not squares.any()
    again = dispatch.top_p_rows(rows.numpy().copy(), float(np.float32(0.9)), _bound(rows))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
