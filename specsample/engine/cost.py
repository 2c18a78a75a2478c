"""Costs measured on this machine: the draft/target cost ratio c and a verify's cost per width."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from specsample._array import check_int
from specsample.core.cache import rollback
from specsample.core.params import SamplingParams
from specsample.core.protocols import (
    Drafter,
    FeatureModel,
    Model,
    StatefulTreeDrafter,
    TreeDrafter,
    forward_select,
    reads_features,
)
from specsample.core.rng import uniforms
from specsample.core.shard import agree

__all__ = ["WidthCost", "anchor_widths", "measure_cost_ratio", "next_logits", "timings"]


def next_logits(target: Model, prompt: Any) -> Any:
    """The target's logits [V] for the token after `prompt` [1, T], from a fresh cache."""
    if len(prompt.shape) != 2 or int(prompt.shape[0]) != 1:
        raise ValueError(f"prompt: expected ids of shape [1, T], got {list(prompt.shape)}")
    logits, _ = target.forward(prompt, target.new_cache(1, int(prompt.shape[1]) + 1))
    return logits[0, -1]


def timings(call: Callable[[], object], repeats: int, *, warm_up: bool = True) -> list[float]:
    """Seconds of `repeats` calls of `call`, after one warm-up call (unless `warm_up` is False)."""
    if warm_up:
        call()
    out = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        out.append(time.perf_counter() - began)
    return out


def _sync(value: Any) -> None:
    float(value.reshape(-1)[0])  # a host read: waits for an asynchronous device


def _ratio_in_turn(first: Callable[[], None], second: Callable[[], None], repeats: int) -> float:
    """The median time of `first` over that of `second`, after one warm-up call of each,
    timed in turn (`repeats` of each), so that a slow spell of a shared machine falls on
    both alike: timed one after the other, a slow spell over one side alone skews the ratio
    (it once halved c)."""
    first()
    second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        times[0].extend(timings(first, 1, warm_up=False))
        times[1].extend(timings(second, 1, warm_up=False))
    return statistics.median(times[0]) / statistics.median(times[1])


def measure_cost_ratio(target: Model, drafter: Drafter, prompt: Any, params: SamplingParams, *,
                       repeats: int = 5) -> float:
    """c: the median time of one draft step over that of one target forward, at batch 1.

    A draft step is `drafter.propose` with K = 1 (a draft forward, warp and sample), or
    a tree drafter's whole tree;
    the target step is a one-token forward after the prompt. Both write at the
    same cache position each time (rollback is free), after one warm-up, and are timed
    in turn. In a distributed run, every rank returns rank 0's measurement.

    Args:
        prompt: int64 [1, T] ids, T >= 2, of the backend's array library.
        repeats: timed calls of each step (>= 1).
    """
    check_int("repeats", repeats, 1)
    if len(prompt.shape) != 2 or int(prompt.shape[0]) != 1:
        raise ValueError(f"prompt: expected ids of shape [1, T], got {list(prompt.shape)}")
    width = int(prompt.shape[1])
    if width < 2:
        raise ValueError(f"prompt: expected at least 2 tokens to time a step, got {width}")
    lengths = prompt[:, 0] * 0 + width  # [1] int64, on the prompt's device
    cache = target.new_cache(1, width + 2)
    if reads_features(drafter) and isinstance(target, FeatureModel):
        # A feature head starts from the target's features and takes one per round.
        reader: Any = drafter
        _, read, cache = forward_select(target, prompt[:, :-1], cache, None, features=True)
        features: Any = read
        state = reader.start_features(prompt, lengths, width + 2, features)

        def advance(state: Any) -> Any:
            return reader.advance_features(state, lengths, features[:, -1:], lengths - 1)
    else:
        _, _, cache = forward_select(target, prompt[:, :-1], cache, None)
        state = drafter.start(prompt, lengths, width + 2)

        def advance(state: Any) -> Any:
            return drafter.advance(state, lengths)
    cache = rollback(cache, lengths - 1)
    u = uniforms(0, 0, 1, 1, like=prompt)

    def target_step() -> None:
        nonlocal cache
        logits, cache = target.forward(prompt[:, -1:], cache)  # the forward consumes the old cache
        _sync(logits)
        cache = rollback(cache, lengths - 1)

    def draft_step() -> None:
        nonlocal state
        if isinstance(drafter, StatefulTreeDrafter):  # a whole tree, from the drafter's state
            tree, state = drafter.propose_from(state, prompt, lengths, drafter.nodes, drafter.depth)
            _sync(tree.tokens)
            state = advance(state)
            return
        if not isinstance(drafter, Drafter) and isinstance(drafter, TreeDrafter):  # a whole tree
            _sync(drafter.propose_tree(prompt, lengths, drafter.nodes, drafter.depth).tokens)
            return
        proposal = drafter.propose(state, prompt, lengths, 1, params, u)
        _sync(proposal.tokens)
        state = advance(proposal.state)  # nothing committed: back to the prompt

    # Ranks time differently; a value that steers the run (K, the auto drafter's choice)
    # must be one value on every rank of a distributed run.
    return agree(_ratio_in_turn(draft_step, target_step, repeats))


def anchor_widths(widest: int) -> list[int]:
    """The widths `WidthCost` measures to cover widths 2..`widest`: 2, 3, 4, 5, then
    2^i + 1 (9, 17, 33, ...), up to the first at or above `widest`. A round's width is a
    power of two of drafts plus one (`specsample.engine.ratings.batch_width`'s halves) or a
    row's own length, so the common widths are measured and the others lie between two."""
    check_int("widest", widest, 1)
    out: list[int] = []
    width = 2
    while not out or out[-1] < widest:
        out.append(width)
        width = width + 1 if width < 5 else 2 * width - 1
    return out


class WidthCost:
    """(batch, width) -> the time of a target forward of `width` positions per row over that of
    one position, at `batch` rows: what a round that verifies width - 1 drafts per row costs
    in plain steps (`specsample.engine.ratings.batch_width`).

    Only the anchor widths (`anchor_widths`) are measured, each once per batch when first
    needed (a prefill of `prompt` in every row, then the medians of `repeats` timed forwards
    of that width and of one position at the same cache position, in turn), and kept; a
    width between two anchors is interpolated linearly. A forward of more positions never
    costs less, so an anchor's value is the largest measured at or below its width: timing
    noise cannot make a wider round look cheaper. `prepare` measures the anchors up to a
    width ahead of time (at load, or in a warm-up), so that a generation does not stop
    for a measurement. In a distributed run every rank keeps rank 0's values, so ranks
    choose alike.

    Args:
        target: the target model.
        prompt: int64 [1, T] ids, T >= 1, of the backend's array library: the context.
        repeats: timed forwards of each width (>= 1).
    """

    def __init__(self, target: Model, prompt: Any, *, repeats: int = 9) -> None:
        if not isinstance(target, Model):
            raise TypeError(f"target: expected a Model, got {type(target).__name__}")
        if len(prompt.shape) != 2 or int(prompt.shape[0]) != 1 or int(prompt.shape[1]) < 1:
            raise ValueError(f"prompt: expected ids of shape [1, T] with T >= 1, got {list(prompt.shape)}")
        self.target, self.prompt, self.repeats = target, prompt, check_int("repeats", repeats, 1)
        # (batch, anchor width) -> the measured ratio
        self.measured: dict[tuple[int, int], float] = {}

    def __call__(self, batch: int, width: int) -> float:
        check_int("batch", batch, 1)
        check_int("width", width, 1)
        if width == 1:
            return 1.0
        anchors = anchor_widths(width)
        hi = anchors[-1]
        lo = anchors[-2] if len(anchors) > 1 and hi > width else hi
        for anchor in dict.fromkeys((lo, hi)):
            self._ensure(batch, anchor)
        at_lo, at_hi = self._monotone(batch, lo), self._monotone(batch, hi)
        if hi == lo:
            return at_lo
        return at_lo + (at_hi - at_lo) * (width - lo) / (hi - lo)

    def prepare(self, batch: int, widest: int) -> None:
        """Measure now every anchor that widths up to `widest` at `batch` rows read."""
        check_int("batch", batch, 1)
        for anchor in anchor_widths(check_int("widest", widest, 1)):
            self._ensure(batch, anchor)

    def _ensure(self, batch: int, anchor: int) -> None:
        if (batch, anchor) not in self.measured:
            self.measured[batch, anchor] = agree(self._measure(batch, anchor))

    def _monotone(self, batch: int, anchor: int) -> float:
        return max(v for (b, w), v in self.measured.items() if b == batch and w <= anchor)

    def _measure(self, batch: int, width: int) -> float:
        from specsample._array import namespace

        xp = namespace(self.prompt)
        context = int(self.prompt.shape[1])
        rows = xp.concat([self.prompt] * batch, axis=0)  # [batch, T]
        lengths = rows[:, 0] * 0 + context
        cache = self.target.new_cache(batch, context + width)
        _, _, cache = forward_select(self.target, rows, cache, None)
        span = xp.concat([rows[:, -1:]] * width, axis=1)

        def step(tokens: Any) -> Callable[[], None]:
            def run() -> None:
                nonlocal cache
                logits, cache = self.target.forward(tokens, cache)
                _sync(logits)
                cache = rollback(cache, lengths)
            return run

        return _ratio_in_turn(step(span), step(span[:, :1]), self.repeats)
