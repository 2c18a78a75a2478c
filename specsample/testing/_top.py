"""The most likely token sequences of an autoregressive law, with their exact probabilities.

A goodness-of-fit test of a sampler's first L tokens needs a small set of outcomes fixed
before the samples are seen (projecting on outcomes chosen from the data makes the miss
bound approximate). `most_likely_sequences` gives that set from the law alone: the `count`
most likely sequences, found by best-first search, each with its probability, so the
remaining mass is exact too. `project_sequences` maps sampled rows onto them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from itertools import count as counter

import numpy as np

from specsample._array import check_int

__all__ = ["most_likely_sequences", "project_sequences"]

NextLaw = Callable[[tuple[int, ...]], object]


def _next_law(law_of: NextLaw, prefix: tuple[int, ...], size: int | None) -> np.ndarray:
    probs = np.asarray(law_of(prefix), dtype=np.float64)
    if probs.ndim != 1 or probs.shape[0] < 1 or (size is not None and probs.shape[0] != size):
        want = f"[{size}]" if size is not None else "[V]"
        raise ValueError(f"law_of: expected probabilities of shape {want} after prefix {prefix}, "
                         f"got shape {list(probs.shape)}")
    if not np.all(np.isfinite(probs)) or float(probs.min()) < 0 or abs(float(probs.sum()) - 1) > 1e-6:
        raise ValueError(f"law_of: expected finite probabilities >= 0 summing to 1 after prefix "
                         f"{prefix}, got min {float(probs.min())}, sum {float(probs.sum())}")
    # Exactly normalised: a child then never outweighs its parent, which the search's order needs.
    out: np.ndarray = probs / probs.sum()
    return out


def most_likely_sequences(law_of: NextLaw, *, count: int,
                          length: int) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """The `count` most likely sequences of `length` tokens, most likely first.

    Best-first search over prefixes: a prefix's probability bounds that of every sequence
    it starts, so sequences leave the queue in order of probability. Each expanded prefix's
    children enter the queue lazily, one at a time in order of probability, so the queue
    holds one entry per expanded prefix, and `law_of` runs only on prefixes at least as
    likely as the last sequence returned (equal probabilities come in the order found, siblings
    by token id).

    Args:
        law_of: the law of the next token after a prefix (a tuple of token ids, () first):
            probabilities [V], NumPy or anything `np.asarray` reads, summing to 1.
        count: sequences wanted, >= 1 (fewer come back if the law has fewer of positive
            probability).
        length: tokens per sequence, >= 1.

    Returns:
        (sequences, probabilities): a list of token-id tuples and their probabilities
        (float64 [len(sequences)]), in decreasing order of probability.
    """
    if not callable(law_of):
        raise TypeError(f"law_of: expected a function of a prefix (a tuple of ids), got "
                        f"{type(law_of).__name__}")
    count = check_int("count", count, 1)
    length = check_int("length", length, 1)
    size: int | None = None
    ties = counter()
    # Entries: (-probability, tie, the prefix's probability, prefix, its children's order and
    # probabilities, rank): the rank-th most likely child of `prefix`.
    queue: list[tuple[float, int, float, tuple[int, ...], np.ndarray, np.ndarray, int]] = []

    def expand(prefix: tuple[int, ...], mass: float) -> None:
        nonlocal size
        probs = _next_law(law_of, prefix, size)
        size = probs.shape[0]
        order = np.argsort(-probs, kind="stable")
        if mass * float(probs[order[0]]) > 0:  # not a sequence whose probability underflows to 0
            heapq.heappush(queue, (-mass * float(probs[order[0]]), next(ties), mass, prefix, order,
                                   probs, 0))

    expand((), 1.0)
    found: list[tuple[int, ...]] = []
    masses: list[float] = []
    while queue and len(found) < count:
        neg, _, mass, parent, order, probs, rank = heapq.heappop(queue)
        child = (*parent, int(order[rank]))
        if rank + 1 < len(order) and mass * float(probs[order[rank + 1]]) > 0:  # the next sibling in
            heapq.heappush(queue, (-mass * float(probs[order[rank + 1]]), next(ties), mass, parent,
                                   order, probs, rank + 1))
        if len(child) == length:
            found.append(child)
            masses.append(-neg)
        else:
            expand(child, -neg)
    return found, np.asarray(masses, dtype=np.float64)


def project_sequences(tokens: object, sequences: Sequence[tuple[int, ...]]) -> np.ndarray:
    """Outcome i for rows equal to the i-th sequence, len(sequences) for any other row.

    Args:
        tokens: token ids [n, L] (NumPy, or anything `np.asarray` reads).
        sequences: sequences of L token ids each.

    Returns:
        int64 [n] outcome ids in [0, len(sequences)].
    """
    rows = np.asarray(tokens)
    if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.integer):
        raise ValueError(f"tokens: expected integer ids of shape [n, L], got {rows.dtype} of shape "
                         f"{list(rows.shape)}")
    out = np.full(rows.shape[0], len(sequences), dtype=np.int64)
    for i, seq in enumerate(sequences):
        if not isinstance(seq, (tuple, list)) or len(seq) != rows.shape[1] or not all(
                isinstance(t, (int, np.integer)) and not isinstance(t, bool) and 0 <= t < 2**63 for t in seq):
            raise ValueError(f"sequences: expected tuples of {rows.shape[1]} token ids >= 0 each (the "
                             f"columns of tokens), got {seq!r} as sequence {i}")
        match = np.all(rows.astype(np.int64) == np.asarray(seq, dtype=np.int64), axis=1)
        out[match & (out == len(sequences))] = i
    return out
