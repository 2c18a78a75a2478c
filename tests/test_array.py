"""Array-API plumbing: the shared checks and the host read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specsample._array import check_int, check_probs, host_ints, largest


def test_check_int_names_the_argument_and_the_bounds() -> None:
    assert check_int("k", 3, 1) == 3
    with pytest.raises(TypeError, match="k: expected an int"):
        check_int("k", 2.0, 1)
    with pytest.raises(TypeError, match="k: expected an int"):
        check_int("k", True, 0)
    with pytest.raises(ValueError, match="k: expected an int >= 1"):
        check_int("k", 0, 1)
    with pytest.raises(ValueError, match=r"in \[1, 4\)"):
        check_int("k", 5, 1, 4)


@pytest.mark.parametrize("make", [np.asarray, torch.tensor])
def test_host_ints_reads_ints_and_bools(make) -> None:  # type: ignore[no-untyped-def]
    assert host_ints(make([3, 0, 7])) == [3, 0, 7]
    values = host_ints(make([True, False]))
    assert values == [1, 0] and all(type(v) is int for v in values)
    with pytest.raises(ValueError, match="x: expected a 1-D array"):
        host_ints(make([[1, 2]]))


_BIG = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("make", [np.asarray, torch.tensor])
@pytest.mark.parametrize(("rows", "match"), [
    ([[0.5, float("nan")]], r"p: expected finite values, got nan \(1 non-finite entries\)"),
    ([[0.5, float("inf")]], r"p: expected finite values, got inf"),
    ([[0.5, float("-inf")]], r"p: expected finite values, got -inf"),
    ([[float("inf"), float("-inf")]], r"p: expected finite values, got inf \(2 non-finite"),
    ([[0.5, -0.25], [0.5, 0.5]], r"p: expected non-negative probabilities, got minimum -0.25"),
    ([[0.5, 0.5], [0.0, 0.0]], r"p: expected positive, finite total mass in every row, got minimum row sum"),
    ([[_BIG, _BIG]], r"p: expected positive, finite total mass in every row"),
    ([[]], r"p: expected positive, finite total mass in every row"),
])
def test_check_probs_names_each_fault(make, rows, match) -> None:  # type: ignore[no-untyped-def]
    """The two-reduction pass lets through only what the entry-by-entry checks let through."""
    with pytest.raises(ValueError, match=match):
        check_probs("p", make(np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)))


@pytest.mark.parametrize("make", [np.asarray, torch.tensor])
def test_check_probs_passes_unnormalised_masses_and_zeros(make) -> None:  # type: ignore[no-untyped-def]
    check_probs("p", make(np.array([[0.0, 3.0, 0.0], [-0.0, 1e-30, 0.0]], dtype=np.float32)))
    check_probs("p", make(np.array([2.0, 1.0])))  # one row, float64
    with pytest.raises(TypeError, match="p: expected a real floating-point array"):
        check_probs("p", make(np.array([[1, 2]])))


def test_largest_on_torch_is_the_stable_sorts_prefix_ties_included(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The torch path selects with topk where no tie decides the order; with a tie among the b
    # found, or at the b-th value, it must still give the lower id first.
    rng = np.random.default_rng(0)
    laws = rng.dirichlet(np.ones(50), size=(3, 40))
    laws[0, 0, [4, 9]] = 0.9  # a tie at the top
    laws[0, 1, [7, 30]] = laws[0, 1].max() + 0.01  # a tie at the top, ids apart
    laws[1, 2, :] = 0.0  # all zeros below two values: the b-th value recurs
    laws[1, 2, [3, 8]] = [0.6, 0.4]
    laws[2, 5, [11, 12, 13]] = 0.5  # three equal: the boundary splits them
    calls, argsort = [], torch.argsort
    monkeypatch.setattr(torch, "argsort", lambda *a, **k: calls.append(1) or argsort(*a, **k))
    for b in (1, 3, 50):
        values, ids = largest(torch.from_numpy(laws), b)
        order = np.argsort(-laws, axis=-1, kind="stable")[..., :b]
        assert np.array_equal(ids.numpy(), order) and ids.dtype == torch.int64
        assert np.array_equal(values.numpy(), np.take_along_axis(laws, order, axis=-1))
    assert calls  # the ties took the stable sort
    calls.clear()
    distinct = torch.from_numpy(rng.dirichlet(np.ones(50), size=(3, 40)))
    largest(distinct, 3)
    assert not calls  # no tie: the partial selection alone
