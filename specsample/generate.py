"""The generation loop: rounds until every row stops, and plain decoding to compare."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator

from specsample._array import Array, check_shape, check_tokens, device, host_ints, namespace
from specsample.cache import rollback
from specsample.metrics import Metrics, tally
from specsample.options import RunOptions
from specsample.params import SamplingParams
from specsample.policy import WIDTH_PRIOR, KPolicy, batch_width
from specsample.protocols import Drafter, Model, forward_select
from specsample.rng import Seed, Stream, round_uniforms, uniforms
from specsample.round import RoundResult, State, round_step, start
from specsample.sample import sample
from specsample.verify import Verdict
from specsample.warp import warp

__all__ = [
    "Generation",
    "Step",
    "capacity_for",
    "finish",
    "generate",
    "generate_plain",
    "iterate",
    "last_step",
    "prepare_prompt",
    "run_plain",
    "run_rounds",
    "tally_round",
]


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


def _round_k(xp: object, drafter: Drafter, state: State, wanted: int, metrics: Metrics
             ) -> tuple[int, Array | None, list[int], list[bool] | None] | None:
    """This round's K, the per-row draft lengths (None when every active row drafts K), each
    row's wanted length (-1 for a done row) and, for a drafter that says so, which rows
    propose a copy (else None); or None when every row is done. One host read: the rows'
    wanted lengths, tokens left and copy flags.

    A drafter may draft fewer tokens for some rows (`Drafter.draft_lengths`, read from
    each row's committed tokens, or `draft_plan`, which also says which rows copy); the
    round drafts the longest active row's length, or, for a drafter that rates rounds by
    their cost (`round_cost`, the `auto` drafter), the width `batch_width` predicts to end
    the call soonest from the rows' tokens left and the acceptance so far of proposals of
    each length and kind (`Metrics.alpha_at`, prior `WIDTH_PRIOR`).
    """
    plan = getattr(drafter, "draft_plan", None)
    if plan is not None:
        lengths, copies = plan(state.draft_state, state.tokens, state.lengths, wanted)  # [B], [B]
        flags = [xp.astype(copies, xp.int64)]  # type: ignore[attr-defined]
    else:
        lengths, flags = drafter.draft_lengths(state.tokens, state.lengths, wanted), []
    batch = int(state.lengths.shape[0])
    read = host_ints(xp.concat([xp.where(state.done, -1, lengths),  # type: ignore[attr-defined]
                                state.stop_lengths - state.lengths, *flags]))
    wanted_by_row, left_by_row = read[:batch], read[batch:2 * batch]
    copied = [bool(v) for v in read[2 * batch:]] if flags else None
    rows = [b for b, v in enumerate(wanted_by_row) if v >= 0]
    if not rows:
        return None
    active = [wanted_by_row[b] for b in rows]
    k = max(active)
    cost = getattr(drafter, "round_cost", None)
    if cost is not None and k > 0:
        rates = [metrics.alpha_at(wanted_by_row[b], *WIDTH_PRIOR, copied=bool(copied and copied[b]))
                 if wanted_by_row[b] >= 1 else 0.0 for b in rows]
        if copied is not None and all(copied[b] for b in rows if wanted_by_row[b] >= 1):
            cost = functools.partial(cost, modelled=False)  # every drafting row copies
        k = batch_width(active, [left_by_row[b] for b in rows], batch, rates, cost)
    if k == 0 or all(v == k for v in active):
        return k, None, wanted_by_row, copied
    return k, xp.minimum(lengths, k), wanted_by_row, copied  # type: ignore[attr-defined]


def run_rounds(target: Model, drafter: Drafter, input_ids: Array, run: RunOptions) -> Iterator[Step]:
    """Speculative rounds until every row stops, yielding after each (see `iterate`); with a
    tree drafter (`specsample.tree.TreeDrafter`), tree rounds."""
    if not isinstance(run, RunOptions):
        raise TypeError(f"run: expected RunOptions, got {type(run).__name__}")
    if not isinstance(drafter, Drafter):
        from specsample.tree import TreeDrafter, run_tree_rounds

        if isinstance(drafter, TreeDrafter):
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
        k, draft_lengths, wanted, copied = chosen
        began = time.perf_counter()
        u = round_uniforms(run.seed, index, batch, k, like=state.tokens)
        state, result = round_step(state, target, drafter, k=k, params=run.params, uniforms=u,
                                   eos=run.eos_token_id, check=run.check, verifier=verifier,
                                   draft_lengths=draft_lengths)
        metrics = tally_round(metrics, result, k=k, began=began, wanted=wanted, copied=copied)
        yield Step(index=index, k=k, result=result, state=state, metrics=metrics)
        index += 1


def tally_round(metrics: Metrics, result: RoundResult, *, k: int, began: float,
                wanted: list[int] | None = None, copied: list[bool] | None = None) -> Metrics:
    """`metrics` plus one round's counts (one host read) and its time since `began`; with
    `wanted` (and `copied`), each row's acceptance is filed under the draft length it wanted
    (and its kind; see `tally`)."""
    xp = namespace(result.emitted)
    batch = int(result.emitted.shape[0])
    counts = host_ints(xp.concat([xp.astype(a, xp.int64) for a in (
        result.verdict.num_accepted, result.emitted, result.active, result.drafted)]))
    return tally(metrics, k=k, accepted=counts[:batch], emitted=counts[batch:2 * batch],
                 active=[bool(v) for v in counts[2 * batch:3 * batch]],
                 elapsed_s=time.perf_counter() - began, drafted=counts[3 * batch:], wanted=wanted,
                 copied=copied)


def last_step(steps: Iterator[Step]) -> Step:
    """Run `steps` to the end keeping only the last one (memory stays flat)."""
    last = None
    for last in steps:  # noqa: B007
        pass
    if last is None:
        raise ValueError("steps: expected at least one round, got none")
    return last


def iterate(target: Model, drafter: Drafter, input_ids: Array, *, max_new_tokens: int,
            params: SamplingParams | None = None, k: int | KPolicy = 4, seed: Seed = 0,
            eos_token_id: int | None = None, prompt_lengths: Array | None = None,
            capacity: int | None = None, check: bool = True,
            verifier: str | Callable[..., Verdict] = "token") -> Iterator[Step]:
    """Run speculative rounds, yielding after each, until every row stops.

    The arguments are the fields of `RunOptions` (see it); `run_rounds` takes them as one.
    Each yielded Step holds the state after its round; that state's caches are
    consumed by the next round (see `specsample.cache`).

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


def finish(steps: Iterator[Step], input_ids: Array, run: RunOptions, vocab: int) -> Generation:
    """The Generation of the last of `steps` (only that one is kept)."""
    step = last_step(steps)
    _, lengths = prepare_prompt(input_ids, run.prompt_lengths, vocab)
    return Generation.from_state(step.state, lengths, step.metrics, run.pad_id)


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
