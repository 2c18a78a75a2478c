"""Caches as values: commit and rollback move lengths only, never buffers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specsample.core.cache import Cache, commit, rollback


def _cache(lengths: object = (2, 5, 0), capacity: int = 8) -> Cache:
    lengths = np.asarray(lengths, dtype=np.int64)
    return Cache(lengths=lengths, capacity=capacity,
                 buffers=np.arange(lengths.shape[0] * capacity).reshape(-1, capacity))


def test_fields_and_batch() -> None:
    cache = _cache()
    assert cache.batch == 3
    assert cache.capacity == 8
    assert cache.buffers.shape == (3, 8)
    assert Cache(lengths=np.zeros(4, dtype=np.int64), capacity=1).buffers is None


def test_frozen_and_keyword_only() -> None:
    cache = _cache()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cache.lengths = np.zeros(3, dtype=np.int64)  # type: ignore[misc]
    with pytest.raises(TypeError):
        Cache(np.zeros(3, dtype=np.int64), 8)  # type: ignore[misc]


def test_commit_advances_lengths_without_copying_buffers() -> None:
    cache = _cache()
    before = cache.buffers.copy()
    result = commit(cache, np.array([1, 3, 0], dtype=np.int64))
    assert result.lengths.tolist() == [3, 8, 0]
    assert result.lengths.dtype == np.int64
    assert result.buffers is cache.buffers
    assert result.capacity == cache.capacity
    # the old value is unchanged
    assert cache.lengths.tolist() == [2, 5, 0]
    np.testing.assert_array_equal(cache.buffers, before)


def test_rollback_sets_lengths_without_copying_buffers() -> None:
    cache = _cache()
    result = rollback(cache, np.array([1, 2, 0]))
    assert result.lengths.tolist() == [1, 2, 0]
    assert result.buffers is cache.buffers
    assert cache.lengths.tolist() == [2, 5, 0]


def test_rollback_casts_lengths_to_int64() -> None:
    result = rollback(_cache(), np.array([1, 2, 3], dtype=np.int32))
    assert result.lengths.dtype == np.int64
    assert result.lengths.tolist() == [1, 2, 3]


def test_commit_then_rollback_round_trip() -> None:
    cache = _cache()
    advanced = commit(cache, np.array([4, 1, 2]))
    back = rollback(advanced, cache.lengths)
    np.testing.assert_array_equal(back.lengths, cache.lengths)
    assert back.buffers is cache.buffers


@pytest.mark.parametrize("bad", [np.array([1, 2]), np.array([1, 2, 3, 4]), np.array([[1, 2, 3]])])
def test_rollback_shape_mismatch_names_lengths_and_shapes(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"lengths: expected shape \(3,\)") as info:
        rollback(_cache(), bad)
    assert str(tuple(bad.shape)) in str(info.value)


def test_commit_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="lengths: expected shape"):
        commit(_cache(), np.array([[1], [2], [3]]))


@pytest.mark.parametrize(("capacity", "error", "match"), [
    (0, ValueError, "capacity: expected >= 1, got 0"),
    (-4, ValueError, "capacity: expected >= 1, got -4"),
    (8.0, TypeError, "capacity: expected an int, got float"),
    (True, TypeError, "capacity: expected an int, got bool"),
    ("8", TypeError, "capacity: expected an int, got str"),
])
def test_bad_capacity(capacity: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Cache(lengths=np.zeros(2, dtype=np.int64), capacity=capacity)  # type: ignore[arg-type]


@pytest.mark.parametrize("lengths", [np.zeros((2, 3), dtype=np.int64), np.int64(3), [1, 2]])
def test_lengths_must_be_one_dimensional(lengths: object) -> None:
    with pytest.raises(ValueError, match="lengths: expected a 1-D integer array"):
        Cache(lengths=lengths, capacity=4)


def test_torch_int64_lengths() -> None:
    torch = pytest.importorskip("torch")
    buffers = torch.zeros(2, 6)
    cache = Cache(lengths=torch.tensor([1, 4], dtype=torch.int64), capacity=6, buffers=buffers)
    assert cache.batch == 2
    advanced = commit(cache, torch.tensor([2, 1], dtype=torch.int64))
    assert isinstance(advanced.lengths, torch.Tensor)
    assert advanced.lengths.dtype == torch.int64
    assert advanced.lengths.tolist() == [3, 5]
    assert advanced.buffers is buffers
    back = rollback(advanced, torch.tensor([0, 2], dtype=torch.int32))
    assert back.lengths.dtype == torch.int64
    assert back.lengths.tolist() == [0, 2]
    assert back.buffers is buffers
    assert cache.lengths.tolist() == [1, 4]
    with pytest.raises(ValueError, match="lengths: expected shape"):
        rollback(cache, torch.tensor([1, 2, 3]))
