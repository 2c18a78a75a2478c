"""Array-API plumbing: the shared integer check and the host read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specsample._array import check_int, host_ints


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
