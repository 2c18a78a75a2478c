"""What every generation loop shares: the validated prompt, the cache capacity, one round's
tallies, the streamed `Step` and the final `Generation`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

from specsample._array import Array, check_shape, check_tokens, device, host_ints, namespace
from specsample.core.metrics import Metrics, tally
from specsample.engine.options import RunOptions
from specsample.engine.round import RoundResult, State

__all__ = ["Generation", "Step", "capacity_for", "finish", "last_step", "prepare_prompt", "tally_round"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Generation:
    """The result of a generation.

    Attributes:
        sequences: int64 [B, T]: each row's prompt then its generated tokens,
            right-padded with `pad_id` (rows differ in length).
        lengths: int64 [B]: the valid length of each row of `sequences`.
        prompt_lengths: int64 [B].
        metrics: acceptance metrics (empty for plain decoding).
        texts: each row's generated text, when a tokenizer decoded it (else None).
    """

    sequences: Array
    lengths: Array
    prompt_lengths: Array
    metrics: Metrics
    texts: tuple[str, ...] | None = None

    @classmethod
    def from_state(cls, state: State, prompt_lengths: Array, metrics: Metrics, pad_id: int) -> Generation:
        """Each row's committed tokens, right-padded with `pad_id` (copies, not views of `state`)."""
        xp = namespace(state.tokens)
        width = int(xp.max(state.lengths))
        pos = xp.arange(width, device=device(state.tokens))[None, :]
        sequences = xp.where(pos < state.lengths[:, None], state.tokens[:, :width], pad_id)
        return cls(sequences=sequences, lengths=xp.asarray(state.lengths, copy=True),
                   prompt_lengths=prompt_lengths, metrics=metrics)

    def new_tokens(self, row: int) -> list[int]:
        """The generated ids of one row, as a list."""
        start_, stop = int(self.prompt_lengths[row]), int(self.lengths[row])
        return [int(t) for t in self.sequences[row, start_:stop]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """One round as the streaming iterator reports it."""

    index: int
    k: int
    result: RoundResult
    state: State
    metrics: Metrics


def prepare_prompt(input_ids: Array, prompt_lengths: Array | None, vocab: int) -> tuple[Array, Array]:
    """Validated prompts: int64 ids [B, T] (zero past each row's end) and lengths [B].

    Args:
        input_ids: int [B, T], right-padded.
        prompt_lengths: int [B] in [1, T], or None (every row is T long).
        vocab: V, the models' vocabulary size.
    """
    xp = namespace(input_ids)
    check_shape("input_ids", input_ids, (None, None))
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids: expected a non-empty prompt [B >= 1, T >= 1], got "
                         f"{list(input_ids.shape)}")
    if prompt_lengths is None:
        prompt_lengths = xp.full((input_ids.shape[0],), input_ids.shape[1], dtype=xp.int64,
                                 device=device(input_ids))
    check_shape("prompt_lengths", prompt_lengths, (int(input_ids.shape[0]),))
    if bool(xp.any(prompt_lengths < 1)) or bool(xp.any(prompt_lengths > input_ids.shape[1])):
        raise ValueError(f"prompt_lengths: expected values in [1, {input_ids.shape[1]}], got "
                         f"{[int(v) for v in prompt_lengths]}")
    valid = xp.arange(input_ids.shape[1], device=device(input_ids))[None, :] < prompt_lengths[:, None]
    check_tokens("input_ids", xp.where(valid, input_ids, 0), vocab)
    return xp.where(valid, xp.astype(input_ids, xp.int64), 0), xp.astype(prompt_lengths, xp.int64)


def capacity_for(capacity: int | None, needed: int, extra: str = "K_max") -> int:
    """The cache capacity of a run: `capacity` if given (checked to hold `needed` positions,
    the longest prompt + max_new_tokens + `extra` + 1), else `needed`."""
    if capacity is None:
        return needed
    if capacity < needed:
        raise ValueError(f"capacity: expected >= {needed} (longest prompt + max_new_tokens + "
                         f"{extra} + 1), got {capacity}")
    return capacity


def tally_round(metrics: Metrics, result: RoundResult, *, k: int, began: float,
                wanted: list[int] | None = None, copied: list[bool] | None = None,
                siblings: list[bool] | None = None) -> Metrics:
    """`metrics` plus one round's counts (one host read) and its time since `began`; with
    `wanted` (and `copied`, `siblings`), each row's acceptance is filed under the draft length
    it wanted (and its kind; see `tally`)."""
    xp = namespace(result.emitted)
    batch = int(result.emitted.shape[0])
    counts = host_ints(xp.concat([xp.astype(a, xp.int64) for a in (
        result.verdict.num_accepted, result.emitted, result.active, result.drafted)]))
    return tally(metrics, k=k, accepted=counts[:batch], emitted=counts[batch:2 * batch],
                 active=[bool(v) for v in counts[2 * batch:3 * batch]],
                 elapsed_s=time.perf_counter() - began, drafted=counts[3 * batch:], wanted=wanted,
                 copied=copied, siblings=siblings)


def last_step(steps: Iterator[Step]) -> Step:
    """Run `steps` to the end keeping only the last one (memory stays flat)."""
    last = None
    for last in steps:  # noqa: B007
        pass
    if last is None:
        raise ValueError("steps: expected at least one round, got none")
    return last


def finish(steps: Iterator[Step], input_ids: Array, run: RunOptions, vocab: int) -> Generation:
    """The Generation of the last of `steps` (only that one is kept)."""
    step = last_step(steps)
    _, lengths = prepare_prompt(input_ids, run.prompt_lengths, vocab)
    return Generation.from_state(step.state, lengths, step.metrics, run.pad_id)
