"""`specsample.engine.cost.WidthCost`'s table: which widths it measures, how it fills the
widths between them, and that noise cannot make a wider forward look cheaper. The timings
come from a table (a subclass's `_measure`), so the arithmetic is checked exactly; the
measurement itself runs on the real target in tests/test_bench_models.py."""

from __future__ import annotations

import numpy as np
import pytest
from specsample_backends.reference.ngram import random_ngram

from specsample.engine.cost import WidthCost, anchor_widths


class Table(WidthCost):
    """A WidthCost whose measurements come from `table[(batch, width)]`, counted."""

    def __init__(self, table: dict[tuple[int, int], float]) -> None:
        model = random_ngram(8, order=2, seed=0)
        super().__init__(model, np.array([[1, 2, 3]], dtype=np.int64), repeats=1)
        self.table, self.calls = table, []

    def _measure(self, batch: int, width: int) -> float:
        self.calls.append((batch, width))
        return self.table[batch, width]


def test_anchor_widths() -> None:
    assert anchor_widths(1) == [2] and anchor_widths(5) == [2, 3, 4, 5]
    assert anchor_widths(9) == [2, 3, 4, 5, 9] and anchor_widths(10) == [2, 3, 4, 5, 9, 17]
    assert anchor_widths(33) == [2, 3, 4, 5, 9, 17, 33]
    with pytest.raises(ValueError, match="widest: expected an int >= 1"):
        anchor_widths(0)


def test_widths_between_anchors_are_interpolated_from_the_two_around_them() -> None:
    cost = Table({(1, 2): 1.1, (1, 3): 1.2, (1, 4): 1.3, (1, 5): 1.4, (1, 9): 1.8, (1, 17): 2.6})
    assert cost(1, 1) == 1.0 and not cost.calls
    assert cost(1, 13) == pytest.approx(1.8 + 0.8 * 4 / 8)
    assert cost.calls == [(1, 9), (1, 17)]
    assert cost(1, 9) == pytest.approx(1.8) and cost(1, 17) == pytest.approx(2.6)
    assert len(cost.calls) == 2  # kept, not measured again
    assert cost(1, 7) == pytest.approx(1.4 + 0.4 * 2 / 4)  # 5 measured now; 9 kept
    assert sorted(cost.calls) == [(1, 5), (1, 9), (1, 17)]


def test_a_wider_anchor_never_reads_cheaper_than_a_narrower_one() -> None:
    # Timing noise measured 4 positions below 2 and 3: the 4-position value is lifted.
    cost = Table({(2, 2): 1.13, (2, 3): 1.13, (2, 4): 1.06, (2, 5): 1.2})
    cost.prepare(2, 5)
    assert sorted(cost.calls) == [(2, 2), (2, 3), (2, 4), (2, 5)]
    assert [cost(2, w) for w in (2, 3, 4, 5)] == pytest.approx([1.13, 1.13, 1.13, 1.2])
    # Each batch keeps its own table.
    other = Table({(1, 2): 1.0, (2, 2): 1.5})
    assert other(1, 2) == 1.0 and other(2, 2) == 1.5


def test_prepare_measures_every_anchor_up_to_the_widest_once() -> None:
    table = {(3, w): 1 + w / 10 for w in (2, 3, 4, 5, 9, 17)}
    cost = Table(table)
    cost.prepare(3, 17)
    assert sorted(cost.calls) == sorted(table)
    cost.prepare(3, 10)
    for w in range(2, 18):
        cost(3, w)
    assert len(cost.calls) == len(table)  # everything read from the table
    for args, match in [((0, 5), "batch: expected an int >= 1"), ((3, 0), "widest: expected an int >= 1")]:
        with pytest.raises(ValueError, match=match):
            cost.prepare(*args)
