"""The law after each prefix of generated ids, computed once per distinct prefix.

`tree_samples` draws many rows from these tables: rows that share a prefix share its
forward pass, so the cost grows with the number of distinct prefixes, not with the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from specsample._array import Array, check_int, device, namespace
from specsample.core.cache import Cache
from specsample.core.protocols import Model

__all__ = ["Key", "LawFn", "PrefixLaws"]

Key = tuple[int, ...]
LawFn = Callable[[Array], tuple[Array, ...]]


def _take_rows(buffers: Any, index: Array) -> Any:
    """Rows `index` of every array in a (nested tuple/list of) cache buffer(s), batch on axis 0."""
    if isinstance(buffers, (tuple, list)):
        return type(buffers)(_take_rows(b, index) for b in buffers)
    if hasattr(buffers, "shape"):
        return namespace(buffers).take(buffers, index, axis=0)
    return buffers


class PrefixLaws:
    """The law after each prefix of generated ids (after one prompt), computed once per prefix.

    Args:
        model: the model.
        prompt: int64 [1, T], T >= 1, of the model's array library.
        law: logits [N, V] -> (the law to sample from, the law to report, any further
            per-prefix arrays, e.g. the logits for a confidence rule), each [N, ...]; e.g.
            `lambda x: (warp(x, params),) * 2` for a target, a drafter's `laws` for a draft.
        depth: the longest prefix asked for (generated ids after the prompt).
        batch: rows times tokens per forward when filling in prefixes.
    """

    def __init__(self, model: Model, prompt: Array, law: LawFn, *, depth: int,
                 batch: int = 512) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"model: expected a specsample Model, got {type(model).__name__}")
        if getattr(prompt, "ndim", None) != 2 or int(prompt.shape[0]) != 1 or int(prompt.shape[1]) < 1:
            raise ValueError(f"prompt: expected int64 ids [1, T >= 1], got shape "
                             f"{list(getattr(prompt, 'shape', []))}")
        self.model, self.law = model, law
        self.depth = check_int("depth", depth, 0)
        self.batch = check_int("batch", batch, 1)
        self.width = int(prompt.shape[1])
        self.xp = namespace(prompt)
        logits, self.cache = model.forward(prompt, model.new_cache(1, self.width + max(self.depth, 1)))
        self.table: dict[Key, tuple[Array, ...]] = {}
        self.computed = 0  # laws computed so far (a forgotten one computed again counts twice)
        self._store([()], logits[:, -1, :])
        self.forwarded = 0  # prefix tokens fed so far, beyond the prompt

    def _store(self, keys: Sequence[Key], logits: Array) -> None:
        self.computed += len(keys)
        draw, *rest = self.law(logits)
        if not rest:
            raise ValueError("law: expected (the law to sample from, the law to report, ...), "
                             "got one array")
        for i, key in enumerate(keys):
            row = draw[i]
            self.table[key] = (row, *(row if more is draw else more[i] for more in rest))

    def fill(self, keys: Iterable[Key]) -> None:
        """Compute the laws after every prefix in `keys` not yet known (shorter ones first)."""
        missing = sorted({k for k in keys if k not in self.table}, key=len)
        for key in missing:
            if len(key) > self.depth:
                raise ValueError(f"keys: expected prefixes of at most {self.depth} ids, got {len(key)}")
        for length in sorted({len(k) for k in missing}):
            group = [k for k in missing if len(k) == length]
            rows = max(1, self.batch // length)
            for start in range(0, len(group), rows):
                self._forward(group[start:start + rows], length)

    def _forward(self, keys: list[Key], length: int) -> None:
        xp, dev = self.xp, device(self.cache.lengths)
        ids = xp.asarray(keys, dtype=xp.int64, device=dev)  # [P, length]
        zeros = xp.zeros(len(keys), dtype=xp.int64, device=dev)
        cache = Cache(lengths=zeros + self.width, capacity=self.cache.capacity,
                      buffers=_take_rows(self.cache.buffers, zeros))
        logits, _ = self.model.forward(ids, cache)  # [P, length, V]
        self.forwarded += len(keys) * length
        for j in range(length):  # ancestors come for free; keep those not yet known
            fresh = [i for i, k in enumerate(keys) if k[: j + 1] not in self.table]
            if fresh:
                at = xp.asarray(fresh, dtype=xp.int64, device=dev)
                self._store([keys[i][: j + 1] for i in fresh], xp.take(logits[:, j, :], at, axis=0))

    def rows(self, keys: Sequence[Key]) -> tuple[Array, Array]:
        """The laws (to sample from, to report) after each prefix: two arrays [len(keys), V]."""
        self.fill(keys)
        laws = [self.table[k] for k in keys]
        draw = self.xp.stack([law[0] for law in laws])
        same = all(law[1] is law[0] for law in laws)
        return draw, (draw if same else self.xp.stack([law[1] for law in laws]))

    def column(self, keys: Sequence[Key], index: int) -> Array:
        """The `index`-th array the law gave after each prefix, stacked: [len(keys), ...]."""
        self.fill(keys)
        return self.xp.stack([self.table[k][index] for k in keys])

    def forget(self, length: int) -> None:
        """Drop the laws after prefixes of `length` or more ids (to bound memory)."""
        self.table = {k: v for k, v in self.table.items() if len(k) < length}

    def __len__(self) -> int:
        return len(self.table)
