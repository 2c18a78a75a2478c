"""The generation loop: rounds until every row stops, and plain decoding to compare."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from specsample._array import Array, device, host_ints, namespace
from specsample.core.cache import rollback
from specsample.core.metrics import Metrics
from specsample.core.params import SamplingParams
from specsample.core.protocols import Drafter, Model, TreeDrafter, forward_select
from specsample.core.rng import Seed, Stream, round_uniforms, uniforms
from specsample.core.sample import sample
from specsample.core.verify import Verdict
from specsample.core.warp import warp
from specsample.drafters.hybrid import HybridDrafter
from specsample.engine.options import RunOptions
from specsample.engine.policy import KPolicy
from specsample.engine.round import State, round_step, start
from specsample.engine.runs import Generation, Step, capacity_for, finish, prepare_prompt, tally_round
from specsample.engine.scheduler import Scheduler
from specsample.engine.tree import run_tree_rounds

__all__ = ["generate", "generate_plain", "iterate", "run_plain", "run_rounds"]


class _Round(NamedTuple):
    """What `_round_k` decides for a round."""

    k: int
    draft_lengths: Array | None  # per row, or None when every active row drafts k
    wanted: list[int]  # each row's wanted length (-1 for a done row), filed with its acceptance
    copied: list[bool] | None  # a hybrid's rows that propose a copy (else None)
    siblings: list[bool] | None  # a fan-out hybrid's rows that draft from its model (else None)


def _round_k(xp: Any, drafter: Drafter, state: State, wanted: int, metrics: Metrics) -> _Round | None:
    """This round's K and what each row drafts at it, or None when every row is done. One
    host read (two when a hybrid's round is narrower than `wanted`): the rows' wanted
    lengths, tokens left and copy flags.

    A drafter may draft fewer tokens for some rows (`Drafter.draft_lengths`, read from
    each row's committed tokens, or a hybrid's `draft_plan`, which also says which rows
    copy); the round drafts the longest active row's length, or, for the `auto` drafter
    whose scheduler narrows rounds, the width `Scheduler.width` rates fastest.
    """
    hybrid = drafter if isinstance(drafter, HybridDrafter) else None
    if hybrid is not None:
        # [B] lengths, [B] copy flags
        lengths, copies = hybrid.draft_plan(state.draft_state, state.tokens, state.lengths, wanted)
        flags = [xp.astype(copies, xp.int64)]
    else:
        lengths, flags = drafter.draft_lengths(state.tokens, state.lengths, wanted), []
    batch = int(state.lengths.shape[0])
    read = host_ints(xp.concat([xp.where(state.done, -1, lengths), state.stop_lengths - state.lengths,
                                *flags]))
    wanted_by_row, left_by_row = read[:batch], read[batch:2 * batch]
    copied = [bool(v) for v in read[2 * batch:]] if flags else None
    rows = [b for b, v in enumerate(wanted_by_row) if v >= 0]
    if not rows:
        return None
    active = [wanted_by_row[b] for b in rows]
    k = max(active)
    gate = None if hybrid is None else hybrid.scheduler
    if isinstance(gate, Scheduler) and gate.narrows and k > 0:
        k = gate.width(active, [left_by_row[b] for b in rows],
                       None if copied is None else [copied[b] for b in rows], batch, metrics)
    drafts = wanted_by_row
    if hybrid is not None and 0 < k != wanted:
        # The plan was made at `wanted`, but `propose` drafts at k, where a row may
        # decide otherwise: a match of 2 tokens is a short one at 16 and a whole copy at
        # 2. Plan again at k, so that what the round drafts and files as a copy or a
        # sibling is what it proposes; the acceptance stays filed under the length wanted.
        lengths, copies = hybrid.draft_plan(state.draft_state, state.tokens, state.lengths, k)
        read = host_ints(xp.concat([xp.where(state.done, -1, lengths), xp.astype(copies, xp.int64)]))
        drafts, copied = read[:batch], [bool(v) for v in read[batch:]]
    siblings = None if hybrid is None or not hybrid.fan_out or copied is None else \
        [n >= 1 and not copy for n, copy in zip(drafts, copied, strict=True)]
    if k == 0 or all(drafts[b] == k for b in rows):
        return _Round(k, None, wanted_by_row, copied, siblings)
    return _Round(k, xp.minimum(lengths, k), wanted_by_row, copied, siblings)


def run_rounds(target: Model, drafter: Drafter, input_ids: Array, run: RunOptions) -> Iterator[Step]:
    """Speculative rounds until every row stops, yielding after each (see `iterate`); with a
    tree drafter (`specsample.core.protocols.TreeDrafter`), tree rounds."""
    if not isinstance(run, RunOptions):
        raise TypeError(f"run: expected RunOptions, got {type(run).__name__}")
    if not isinstance(drafter, Drafter) and isinstance(drafter, TreeDrafter):
        yield from run_tree_rounds(target, drafter, input_ids, run)
        return
    prompt, lengths = prepare_prompt(input_ids, run.prompt_lengths, target.vocab_size)
    run.rows(int(prompt.shape[0]))
    policy, verifier = run.policy, run.verify
    xp = namespace(prompt)
    width = int(xp.max(lengths)) + run.max_new_tokens + policy.k_max + 1
    state = start(target, drafter, prompt, lengths, capacity=capacity_for(run.capacity, width),
                  stop_lengths=lengths + run.max_new_tokens)
    metrics, index, batch = Metrics(), 0, int(prompt.shape[0])
    # Two host reads a round: the draft lengths (which also say whether any row is
    # active) and the round's per-row counts.
    while (chosen := _round_k(xp, drafter, state, policy.next_k(metrics), metrics)) is not None:
        k = chosen.k
        began = time.perf_counter()
        u = round_uniforms(run.seed, index, batch, k, like=state.tokens)
        state, result = round_step(state, target, drafter, k=k, params=run.params, uniforms=u,
                                   eos=run.eos_token_id, check=run.check, verifier=verifier,
                                   draft_lengths=chosen.draft_lengths)
        metrics = tally_round(metrics, result, k=k, began=began, wanted=chosen.wanted, copied=chosen.copied,
                              siblings=chosen.siblings)
        yield Step(index=index, k=k, result=result, state=state, metrics=metrics)
        index += 1


def iterate(target: Model, drafter: Drafter, input_ids: Array, *, max_new_tokens: int,
            params: SamplingParams | None = None, k: int | KPolicy = 4, seed: Seed = 0,
            eos_token_id: int | None = None, prompt_lengths: Array | None = None,
            capacity: int | None = None, check: bool = True,
            verifier: str | Callable[..., Verdict] = "token") -> Iterator[Step]:
    """Run speculative rounds, yielding after each, until every row stops.

    The arguments are the fields of `RunOptions` (see it); `run_rounds` takes them as one.
    Each yielded Step holds the state after its round; that state's caches are
    consumed by the next round (see `specsample.core.cache`).

    Args:
        target: the target model (p).
        drafter: proposes drafts (q).
        input_ids: int [B, T] prompts, right-padded; `prompt_lengths` [B] says
            where each ends (default: all T).
    """
    run = RunOptions(max_new_tokens=max_new_tokens, params=params or SamplingParams(), k=k,
                     seed=seed, eos_token_id=eos_token_id, prompt_lengths=prompt_lengths,
                     capacity=capacity, check=check, verifier=verifier)
    return run_rounds(target, drafter, input_ids, run)


def generate(target: Model, drafter: Drafter, input_ids: Array, *, max_new_tokens: int,
             params: SamplingParams | None = None, k: int | KPolicy = 4, seed: Seed = 0,
             eos_token_id: int | None = None, prompt_lengths: Array | None = None,
             capacity: int | None = None, check: bool = True,
             verifier: str | Callable[..., Verdict] = "token", pad_id: int = 0) -> Generation:
    """Speculative sampling to completion; the arguments are `RunOptions`' fields.

    Returns:
        A Generation: sequences [B, T] (prompt then generated ids), metrics.
    """
    run = RunOptions(max_new_tokens=max_new_tokens, params=params or SamplingParams(), k=k,
                     seed=seed, eos_token_id=eos_token_id, prompt_lengths=prompt_lengths,
                     capacity=capacity, check=check, verifier=verifier, pad_id=pad_id)
    return finish(run_rounds(target, drafter, input_ids, run), input_ids, run, target.vocab_size)


def generate_plain(target: Model, input_ids: Array, *, max_new_tokens: int,
                   params: SamplingParams | None = None, seed: Seed = 0,
                   eos_token_id: int | None = None, prompt_lengths: Array | None = None,
                   pad_id: int = 0) -> Generation:
    """Plain autoregressive sampling of the target, one token per forward.

    The baseline speculative sampling must match in law (and, at temperature
    0, token for token). Its uniforms come from their own stream of the seed.
    """
    return run_plain(target, input_ids, RunOptions(
        max_new_tokens=max_new_tokens, params=params or SamplingParams(), seed=seed,
        eos_token_id=eos_token_id, prompt_lengths=prompt_lengths, pad_id=pad_id))


def run_plain(target: Model, input_ids: Array, run: RunOptions) -> Generation:
    """`generate_plain` with its arguments as RunOptions (k, capacity, verifier unused)."""
    prompt, lengths = prepare_prompt(input_ids, run.prompt_lengths, target.vocab_size)
    run.rows(int(prompt.shape[0]))
    xp = namespace(prompt)
    batch = int(prompt.shape[0])
    capacity = int(xp.max(lengths)) + run.max_new_tokens + 1
    tokens = xp.concat([prompt, xp.zeros((batch, capacity - prompt.shape[1]), dtype=xp.int64,
                                          device=device(prompt))], axis=1)
    cache = target.new_cache(batch, capacity)
    if prompt.shape[1] > 1:
        _, _, cache = forward_select(target, prompt[:, :-1], cache, None)  # no logits: none is read
    cache = rollback(cache, lengths - 1)
    stop, cur = lengths + run.max_new_tokens, lengths
    done = cur >= stop
    began, step = time.perf_counter(), 0
    pos = xp.arange(capacity, device=device(prompt))[None, :]
    while not bool(xp.all(done)):
        last = xp.take_along_axis(tokens, (cur - 1)[:, None], axis=1)
        logits, cache = target.forward(last, cache)
        u = uniforms(run.seed, step, batch, 1, stream=Stream.PLAIN, like=tokens)[:, 0]
        x = sample(warp(logits[:, 0, :], run.params), u, check=False)  # [B]
        write = (pos == cur[:, None]) & ~done[:, None]
        tokens = xp.where(write, x[:, None], tokens)
        cur = xp.where(done, cur, cur + 1)
        cache = rollback(cache, cur - 1)
        done = done | (cur >= stop)
        if run.eos_token_id is not None:
            done = done | ((x == run.eos_token_id) & xp.any(write, axis=1))
        step += 1
    elapsed = time.perf_counter() - began
    made = int(xp.sum(cur - lengths))
    state = State(tokens=tokens, lengths=cur, stop_lengths=stop, target_cache=cache,
                  draft_state=None, done=done)
    return Generation.from_state(state, lengths, Metrics(emitted=made, elapsed_s=elapsed, rounds=step),
                                 run.pad_id)
