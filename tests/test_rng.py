"""Counter-based uniforms: reproducible, per-row, independent of the batch."""

from __future__ import annotations

import numpy as np
import pytest

from specsample.core import rng
from specsample.core.rng import Stream, philox4x32, round_uniforms, uniforms


def test_shape_dtype_and_range() -> None:
    u = uniforms(3, 0, 4, 5)
    assert isinstance(u, np.ndarray)
    assert u.shape == (4, 5)
    assert u.dtype == np.float64
    assert np.all(u >= 0) and np.all(u < 1)
    big = uniforms(0, 7, 64, 1000)
    assert big.min() >= 0 and big.max() < 1
    assert 0.45 < big.mean() < 0.55  # not constant, not degenerate


def test_reproducible() -> None:
    np.testing.assert_array_equal(uniforms(42, 3, 2, 6), uniforms(42, 3, 2, 6))
    np.testing.assert_array_equal(uniforms(np.int64(42), np.int32(3), 2, 6), uniforms(42, 3, 2, 6))


def test_row_independent_of_batch_size() -> None:
    small = uniforms(5, 2, 2, 6)
    large = uniforms(5, 2, 7, 6)
    np.testing.assert_array_equal(large[:2], small)
    assert uniforms(5, 2, 1, 6)[0].tolist() == large[0].tolist()


def test_width_prefix_is_stable() -> None:
    np.testing.assert_array_equal(uniforms(5, 2, 3, 10)[:, :4], uniforms(5, 2, 3, 4))


def test_rows_differ() -> None:
    u = uniforms(5, 0, 3, 8)
    assert not np.array_equal(u[0], u[1]) and not np.array_equal(u[1], u[2])


def test_steps_streams_and_seeds_differ() -> None:
    base = uniforms(5, 0, 2, 8)
    assert not np.any(base == uniforms(5, 1, 2, 8))
    assert not np.any(base == uniforms(5, 0, 2, 8, stream=Stream.PLAIN))
    assert not np.any(base == uniforms(6, 0, 2, 8))
    # the seed's high 32 bits count too
    assert not np.any(base == uniforms(5 + 2**32, 0, 2, 8))


def test_stream_names() -> None:
    assert Stream.SPECULATIVE != Stream.PLAIN
    np.testing.assert_array_equal(uniforms(1, 0, 1, 3), uniforms(1, 0, 1, 3, stream=Stream.SPECULATIVE))


def test_empty_shapes() -> None:
    assert uniforms(0, 0, 2, 0).shape == (2, 0)
    assert uniforms(0, 0, 0, 3).shape == (0, 3)


def test_like_numpy_returns_numpy() -> None:
    u = uniforms(1, 2, 3, 4, like=np.zeros(1, dtype=np.float32))
    assert isinstance(u, np.ndarray)
    np.testing.assert_array_equal(u, uniforms(1, 2, 3, 4))


def test_like_torch_returns_torch_float64() -> None:
    torch = pytest.importorskip("torch")
    u = uniforms(1, 2, 3, 4, like=torch.zeros(2, dtype=torch.float32))
    assert isinstance(u, torch.Tensor)
    assert u.dtype == torch.float64
    assert u.shape == (3, 4)
    assert u.device.type == "cpu"
    np.testing.assert_array_equal(u.numpy(), uniforms(1, 2, 3, 4))
    assert isinstance(uniforms(1, 2, 3, 4, like=torch.zeros(1, dtype=torch.int64)), torch.Tensor)


@pytest.mark.parametrize("seed", [0, 2**64 - 1, [5, 2**40, 0]])
@pytest.mark.parametrize("step", [0, 2**32 - 1])
@pytest.mark.parametrize("stream", [Stream.SPECULATIVE, Stream.PLAIN, Stream.FINAL])
def test_torch_draws_are_the_numpy_bits(seed: object, step: int, stream: int) -> None:
    # A torch `like` takes the same Philox words as NumPy for every (seed, step, row, stream):
    # the few-block (Python integers) and vectorised paths, and the round's layout.
    torch = pytest.importorskip("torch")
    like = torch.zeros(1)
    ids = None if isinstance(seed, list) else np.array([4, 0, 2**32 - 1])
    for width in (3, 2 * rng._FEW_BLOCKS + 5):
        want = uniforms(seed, step, 3, width, stream=stream, row_ids=ids)  # type: ignore[arg-type]
        got = uniforms(seed, step, 3, width, stream=stream, like=like, row_ids=ids)  # type: ignore[arg-type]
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
        assert np.array_equal(got.numpy().view(np.uint64), want.view(np.uint64))
    got = round_uniforms(seed, step, 3, 4, like=like, row_ids=ids)  # type: ignore[arg-type]
    assert np.array_equal(got.numpy().view(np.uint64),
                          round_uniforms(seed, step, 3, 4, row_ids=ids).view(np.uint64))  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"seed": -1}, ValueError, r"seed: expected an int in \[0, 18446744073709551616\), got -1"),
    ({"seed": 2**64}, ValueError, r"seed: expected an int in \[0, \d+\), got 18446744073709551616"),
    ({"seed": 1.5}, TypeError, "seed: expected an int, got float"),
    ({"seed": "1"}, TypeError, "seed: expected an int, got str"),
    ({"seed": True}, TypeError, "seed: expected an int, got bool"),
    ({"step": -1}, ValueError, r"step: expected an int in \[0, 4294967296\), got -1"),
    ({"step": 2**32}, ValueError, r"step: expected an int in \[0, 4294967296\), got 4294967296"),
    ({"step": 0.0}, TypeError, "step: expected an int, got float"),
    ({"rows": -2}, ValueError, r"rows: expected an int in \[0, \d+\), got -2"),
    ({"rows": None}, TypeError, "rows: expected an int, got NoneType"),
    ({"width": -1}, ValueError, r"width: expected an int in \[0, \d+\), got -1"),
    ({"width": False}, TypeError, "width: expected an int, got bool"),
    ({"stream": -1}, ValueError, r"stream: expected an int in \[0, 4294967296\), got -1"),
    ({"stream": 2**32}, ValueError, r"stream: expected an int in \[0, 4294967296\), got 4294967296"),
    ({"stream": 1.0}, TypeError, "stream: expected an int, got float"),
])
def test_bad_arguments(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    args: dict[str, object] = {"seed": 0, "step": 0, "rows": 2, "width": 3, **kwargs}
    with pytest.raises(error, match=match):
        uniforms(**args)  # type: ignore[arg-type]


def test_largest_seed_and_step_work() -> None:
    u = uniforms(2**64 - 1, 2**32 - 1, 1, 3, stream=2**32 - 1)
    assert u.shape == (1, 3) and np.all((u >= 0) & (u < 1))


@pytest.mark.parametrize(("counter", "key", "expected"), [
    # Known-answer vectors of Philox4x32-10 from Random123 (kat_vectors).
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox4x32_known_answers(counter: tuple[int, ...], key: tuple[int, int],
                                  expected: tuple[int, ...]) -> None:
    block = philox4x32(np.array(counter, dtype=np.uint32), key)
    assert block.dtype == np.uint32
    assert [int(x) for x in block] == list(expected)
    batched = philox4x32(np.array([counter, counter], dtype=np.uint32), key)
    assert batched.shape == (2, 4) and [int(x) for x in batched[1]] == list(expected)
    # The Python-integer block that small draws take gives the same answers.
    assert rng._philox_block(*counter, *key) == expected


def test_uniforms_are_53_bit_doubles_from_philox_words() -> None:
    # seed 0, step 0, row 0, stream 0: counter (0, 0, 0, 0), key (0, 0) -> the first KAT block.
    words = [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    expected = [((words[i] >> 5) * 2**26 + (words[i + 1] >> 6)) / 2**53 for i in (0, 2)]
    assert uniforms(0, 0, 1, 2)[0].tolist() == expected


def test_row_ids_draw_those_rows_of_the_whole_batch() -> None:
    whole = uniforms(3, 7, 10, 5)
    ids = np.array([9, 2, 4])
    assert np.array_equal(uniforms(3, 7, 3, 5, row_ids=ids), whole[ids])
    assert np.array_equal(round_uniforms(3, 7, 3, 2, row_ids=ids), round_uniforms(3, 7, 10, 2)[ids])
    with pytest.raises(ValueError, match="row_ids: expected None with one seed per row"):
        uniforms([1, 2], 0, 2, 1, row_ids=np.array([0, 1]))
    with pytest.raises(ValueError, match=r"row_ids: expected 3 integers in \[0, 2\^32\), got an array "
                                         r"of shape \[2\]"):
        uniforms(3, 0, 3, 1, row_ids=np.array([0, 1]))
    with pytest.raises(ValueError, match="row_ids: expected 2 integers"):
        uniforms(3, 0, 2, 1, row_ids=np.array([-1, 1]))


@pytest.mark.parametrize("seed", [0, 7, 2**64 - 1, [3, 2**63, 0]])
@pytest.mark.parametrize("step", [0, 41, 2**32 - 1])
@pytest.mark.parametrize("stream", [Stream.SPECULATIVE, Stream.FINAL])
def test_few_draws_by_python_integers_equal_the_vectorised_philox(seed: object, step: int,
                                                                  stream: int) -> None:
    # Small draws (a round at batch 1) take Python integers; they must be the NumPy path's bits.
    rows = 3
    per_row = rng.row_seeds(seed, rows)  # type: ignore[arg-type]
    ids = np.array([0, 5, 2**32 - 1], dtype=np.uint32)
    if per_row is not None:
        ids = np.arange(rows, dtype=np.uint32)
    for pairs in (0, 1, 4):
        few = rng._few_uniforms(seed, per_row, ids, step, stream, rows, pairs)  # type: ignore[arg-type]
        many = rng._many_uniforms(seed, per_row, ids, step, stream, rows, pairs)  # type: ignore[arg-type]
        assert few.dtype == many.dtype == np.float64 and np.array_equal(few, many)
    # The public draws cross from one path to the other without a change in any column.
    wide = uniforms(7, step, 2, 2 * rng._FEW_BLOCKS + 2, stream=stream)  # the vectorised path
    assert np.array_equal(uniforms(7, step, 2, 9, stream=stream), wide[:, :9])  # the Python path
