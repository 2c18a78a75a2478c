"""The generation loop: rounds until every row stops, and plain decoding to compare."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from specsample._array import Array, check_int, check_shape, check_tokens, device, namespace
from specsample.cache import rollback
from specsample.metrics import Metrics, tally
from specsample.params import SamplingParams
from specsample.policy import ConstantK, KPolicy
from specsample.protocols import Drafter, Model
from specsample.rng import Stream, uniforms
from specsample.round import RoundResult, State, round_step, start
from specsample.sample import sample
from specsample.verify import Verdict, verify
from specsample.warp import warp

__all__ = ["Generation", "Step", "generate", "generate_plain", "iterate"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Generation:
    """The result of a generation.

    Attributes:
        sequences: int64 [B, T]: each row's prompt then its generated tokens,
            right-padded with `pad_id` (rows differ in length).
        lengths: int64 [B]: the valid length of each row of `sequences`.
        prompt_lengths: int64 [B].
        metrics: acceptance metrics (empty for plain decoding).
    """

    sequences: Array
    lengths: Array
    prompt_lengths: Array
    metrics: Metrics

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


def _prompt(input_ids: Array, prompt_lengths: Array | None, vocab: int) -> tuple[Array, Array]:
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


def _check_run(max_new_tokens: int, seed: int) -> None:
    check_int("max_new_tokens", max_new_tokens, 1)
    check_int("seed", seed, 0)


def _capacity(capacity: int | None, needed: int) -> int:
    if capacity is None:
        return needed
    if capacity < needed:
        raise ValueError(f"capacity: expected >= {needed} (longest prompt + max_new_tokens + "
                         f"K_max + 1), got {capacity}")
    return capacity


def iterate(target: Model, drafter: Drafter, input_ids: Array, *, max_new_tokens: int,
            params: SamplingParams | None = None, k: int | KPolicy = 4, seed: int = 0,
            eos_token_id: int | None = None, prompt_lengths: Array | None = None,
            capacity: int | None = None, check: bool = True,
            verifier: Callable[..., Verdict] = verify) -> Iterator[Step]:
    """Run speculative rounds, yielding after each, until every row stops.

    Args:
        target: the target model (p).
        drafter: proposes drafts (q).
        input_ids: int [B, T] prompts, right-padded; `prompt_lengths` [B] says
            where each ends (default: all T).
        max_new_tokens: per-row budget of generated tokens.
        params: sampling parameters (the same warp for p and q).
        k: an int K or a KPolicy.
        seed: the key of the uniforms (see `specsample.rng.uniforms`).
        eos_token_id: a token that ends its row (kept in the output).
        capacity: positions per cache row (default: just enough).
        check: validate every verify input (a host sync per round).
        verifier: the acceptance rule (default `verify`; see `round_step`).
    """
    params = SamplingParams() if params is None else params
    policy = ConstantK(k=k) if isinstance(k, int) else k
    if not isinstance(policy, KPolicy):
        raise TypeError(f"k: expected an int or a KPolicy, got {type(k).__name__}")
    _check_run(max_new_tokens, seed)
    prompt, lengths = _prompt(input_ids, prompt_lengths, target.vocab_size)
    xp = namespace(prompt)
    width = int(xp.max(lengths)) + max_new_tokens + policy.k_max + 1
    state = start(target, drafter, prompt, lengths, capacity=_capacity(capacity, width),
                  stop_lengths=lengths + max_new_tokens)
    metrics, index = Metrics(), 0
    shorten = getattr(drafter, "draft_length", None)  # e.g. prompt lookup without a match
    while not bool(xp.all(state.done)):  # the one host read of a round
        kk = policy.next_k(metrics)
        if callable(shorten):
            kk = max(0, min(kk, int(shorten(state.tokens, state.lengths, kk))))
        began = time.perf_counter()
        u = uniforms(seed, index, int(prompt.shape[0]), 2 * kk + 1, like=state.tokens)
        state, result = round_step(state, target, drafter, k=kk, params=params, uniforms=u,
                                   eos=eos_token_id, check=check, verifier=verifier)
        metrics = tally(metrics, k=kk, accepted=[int(v) for v in result.verdict.num_accepted],
                        emitted=[int(v) for v in result.emitted],
                        active=[bool(v) for v in result.active],
                        elapsed_s=time.perf_counter() - began)
        yield Step(index=index, k=kk, result=result, state=state, metrics=metrics)
        index += 1


def _finish(state: State, prompt_lengths: Array, metrics: Metrics, pad_id: int) -> Generation:
    xp = namespace(state.tokens)
    width = int(xp.max(state.lengths))
    pos = xp.arange(width, device=device(state.tokens))[None, :]
    sequences = xp.where(pos < state.lengths[:, None], state.tokens[:, :width], pad_id)
    return Generation(sequences=sequences, lengths=state.lengths, prompt_lengths=prompt_lengths,
                      metrics=metrics)


def generate(target: Model, drafter: Drafter, input_ids: Array, *, max_new_tokens: int,
             pad_id: int = 0, **options: Any) -> Generation:
    """Speculative sampling to completion; see `iterate` for the arguments.

    Returns:
        A Generation: sequences [B, T] (prompt then generated ids), metrics.
    """
    steps = list(iterate(target, drafter, input_ids, max_new_tokens=max_new_tokens, **options))
    _, lengths = _prompt(input_ids, options.get("prompt_lengths"), target.vocab_size)
    # max_new_tokens >= 1, so every row runs at least one round.
    return _finish(steps[-1].state, lengths, steps[-1].metrics, pad_id)


def generate_plain(target: Model, input_ids: Array, *, max_new_tokens: int,
                   params: SamplingParams | None = None, seed: int = 0,
                   eos_token_id: int | None = None, prompt_lengths: Array | None = None,
                   pad_id: int = 0) -> Generation:
    """Plain autoregressive sampling of the target, one token per forward.

    The baseline speculative sampling must match in law (and, at temperature
    0, token for token). Its uniforms come from their own stream of the seed.
    """
    params = SamplingParams() if params is None else params
    _check_run(max_new_tokens, seed)
    prompt, lengths = _prompt(input_ids, prompt_lengths, target.vocab_size)
    xp = namespace(prompt)
    batch = int(prompt.shape[0])
    capacity = int(xp.max(lengths)) + max_new_tokens + 1
    tokens = xp.concat([prompt, xp.zeros((batch, capacity - prompt.shape[1]), dtype=xp.int64,
                                          device=device(prompt))], axis=1)
    cache = target.new_cache(batch, capacity)
    if prompt.shape[1] > 1:
        _, cache = target.forward(prompt[:, :-1], cache)
    cache = rollback(cache, lengths - 1)
    stop, cur = lengths + max_new_tokens, lengths
    done = cur >= stop
    began, step = time.perf_counter(), 0
    pos = xp.arange(capacity, device=device(prompt))[None, :]
    while not bool(xp.all(done)):
        last = xp.take_along_axis(tokens, (cur - 1)[:, None], axis=1)
        logits, cache = target.forward(last, cache)
        u = uniforms(seed, step, batch, 1, stream=Stream.PLAIN, like=tokens)[:, 0]
        x = sample(warp(logits[:, 0, :], params), u, check=False)  # [B]
        write = (pos == cur[:, None]) & ~done[:, None]
        tokens = xp.where(write, x[:, None], tokens)
        cur = xp.where(done, cur, cur + 1)
        cache = rollback(cache, cur - 1)
        done = done | (cur >= stop)
        if eos_token_id is not None:
            done = done | ((x == eos_token_id) & xp.any(write, axis=1))
        step += 1
    elapsed = time.perf_counter() - began
    made = int(xp.sum(cur - lengths))
    state = State(tokens=tokens, lengths=cur, stop_lengths=stop, target_cache=cache,
                  draft_state=None, done=done)
    return _finish(state, lengths, Metrics(emitted=made, elapsed_s=elapsed, rounds=step), pad_id)
