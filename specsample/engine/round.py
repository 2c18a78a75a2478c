"""One speculative round over a Model and a Drafter, as a pure function of state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast, overload

from specsample._array import Array, check_int, check_shape, check_uniforms, device, namespace
from specsample.core.cache import Cache, check_live, rollback
from specsample.core.params import SamplingParams
from specsample.core.protocols import (
    Drafter,
    FeatureModel,
    Model,
    Proposal,
    SkippingDrafter,
    TreeModel,
    forward_select,
    reads_features,
)
from specsample.core.sample import sample
from specsample.core.verifiers import tree_rule
from specsample.core.verify import Verdict, verify
from specsample.core.warp import warp

__all__ = ["RoundResult", "State", "commit_verdict", "path_features", "round_step", "score_tree", "start"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class State:
    """Everything a generation carries from round to round.

    Attributes:
        tokens: int64 [B, C]: the committed ids (prompt, then generated).
        lengths: int64 [B]: committed length L per row.
        stop_lengths: int64 [B]: a row is done once its length reaches this.
        target_cache: the target's cache, holding L - 1 entries (the last
            committed token is fed at the start of the next round).
        draft_state: the drafter's state.
        done: bool [B]: rows that stopped (EOS or max new tokens).
    """

    tokens: Array
    lengths: Array
    stop_lengths: Array
    target_cache: Cache
    draft_state: Any
    done: Array


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundResult:
    """What one round did: the verdict and how many tokens each row committed."""

    verdict: Verdict
    emitted: Array  # int64 [B]; 0 for rows that were already done
    active: Array  # bool [B]; rows that took part in this round
    drafted: Array  # int64 [B]; the drafts each row verified (0 in a plain step)


def start(target: Model, drafter: Drafter, prompt: Array, prompt_lengths: Array, *,
          capacity: int, stop_lengths: Array) -> State:
    """Prefill the target and the drafter with ragged prompts (right-padded).

    Args:
        prompt: int64 [B, T], row b valid on [0, prompt_lengths[b]).
        prompt_lengths: int64 [B], each >= 1.
        capacity: positions per row in every buffer.
        stop_lengths: int64 [B], the length at which a row stops.
    """
    xp = namespace(prompt)
    batch, width = (int(d) for d in prompt.shape)
    buffer = xp.zeros((batch, capacity), dtype=xp.int64, device=device(prompt))
    buffer = xp.concat([xp.astype(prompt, xp.int64), buffer[:, width:]], axis=1)
    cache = target.new_cache(batch, capacity)
    features = None
    if width > 1:
        # Rows shorter than T write padding beyond their length: masked by
        # position, overwritten later.
        _, features, cache = _forward(target, drafter, buffer[:, : width - 1], cache, logits=False)
    lengths = xp.astype(prompt_lengths, xp.int64)
    reader: Any = drafter  # a FeatureDrafter, or a feature tree drafter
    draft_state = reader.start_features(buffer, lengths, capacity, features) \
        if reads_features(drafter) else drafter.start(buffer, lengths, capacity)
    return State(tokens=buffer, lengths=lengths, stop_lengths=stop_lengths,
                 target_cache=rollback(cache, lengths - 1), draft_state=draft_state,
                 done=lengths >= stop_lengths)


@overload
def _forward(target: Model, drafter: Drafter, tokens: Array, cache: Cache
             ) -> tuple[Array, Array | None, Cache]: ...


@overload
def _forward(target: Model, drafter: Drafter, tokens: Array, cache: Cache, *, logits: bool
             ) -> tuple[Array | None, Array | None, Cache]: ...


def _forward(target: Model, drafter: Drafter, tokens: Array, cache: Cache, *, logits: bool = True
             ) -> tuple[Array | None, Array | None, Cache]:
    """The target's logits (None without `logits`: a prefill, which reads none), its features
    when the drafter reads them (else None), the cache."""
    wanted = reads_features(drafter)
    if wanted and not isinstance(target, FeatureModel):
        raise TypeError(f"target: a {type(drafter).__name__} reads the target's features: expected "
                        f"a FeatureModel (forward_features), got {type(target).__name__}")
    if not logits:
        return forward_select(target, tokens, cache, None, features=wanted)
    if wanted:  # a FeatureModel, checked above
        return cast(FeatureModel, target).forward_features(tokens, cache)
    scores, cache = target.forward(tokens, cache)
    return scores, None, cache


def _emitted(xp: Any, verdict: Verdict, state: State, eos: int | None) -> Array:
    """Tokens each row commits: up to the first EOS and the row's stop length."""
    count = verdict.num_accepted + 1  # [B]
    if eos is not None:
        slots = xp.arange(verdict.tokens.shape[1], dtype=xp.int64, device=device(count))[None, :]
        hit = (verdict.tokens == eos) & (slots < count[:, None])
        first = xp.min(xp.where(hit, slots, verdict.tokens.shape[1]), axis=1)
        count = xp.minimum(count, first + 1)
    count = xp.minimum(count, state.stop_lengths - state.lengths)
    return xp.where(state.done, 0, count)


def commit_verdict(state: State, verdict: Verdict, eos: int | None) -> tuple[Array, Array, Array, Array]:
    """The committed tokens, lengths and done flags after `verdict`, and the tokens each row
    emitted (up to the first EOS and the row's stop length; 0 for rows already done)."""
    xp = namespace(state.tokens)
    emitted = _emitted(xp, verdict, state, eos)
    tokens = _write(xp, state.tokens, state.lengths, verdict.tokens, emitted)
    lengths = state.lengths + emitted
    done = state.done | (lengths >= state.stop_lengths)
    if eos is not None:
        done = done | xp.any((tokens == eos) & _window(xp, tokens, state.lengths, emitted), axis=1)
    return tokens, lengths, done, emitted


def _write(xp: Any, buffer: Array, lengths: Array, new: Array, count: Array) -> Array:
    """buffer[b, lengths[b] + j] = new[b, j] for j < count[b], without scatter."""
    width = int(new.shape[1])
    pos = xp.arange(buffer.shape[1], dtype=xp.int64, device=device(buffer))[None, :]  # [1, C]
    offset = pos - lengths[:, None]  # [B, C]
    gathered = xp.take_along_axis(new, xp.clip(offset, min=0, max=width - 1), axis=1)
    return xp.where((offset >= 0) & (offset < count[:, None]), gathered, buffer)


def round_step(state: State, target: Model, drafter: Drafter, *, k: int, params: SamplingParams,
               uniforms: Array, eos: int | None = None, check: bool = True,
               verifier: Callable[..., Verdict] = verify,
               draft_lengths: Array | None = None) -> tuple[State, RoundResult]:
    """Draft k tokens, score them with one target forward, verify, commit.

    With k = 0 the round is a plain step: one token per row sampled from p with
    `uniforms[:, 0]`, no draft and no verify (a drafter with nothing to propose, such as
    prompt lookup without a match, asks for it). Only a stateless drafter (state None) or
    a `SkippingDrafter` may sit out a round, since its state must follow the committed
    tokens.

    Args:
        k: drafts per row, >= 0.
        uniforms: [B, 2k+1] in [0, 1): k for drafting, k+1 for verification.
        eos: a token id that ends a row, or None.
        check: validate the verify inputs.
        verifier: the acceptance rule, `verify` unless studying another one
            (the statistical tests swap in broken rules to show they are caught).
        draft_lengths: int [B] in [0, k] or None: row b verifies only its first L_b
            drafts (see `verify`); the drafter chose them from committed tokens. A
            drafter may shorten rows further while drafting (`Proposal.lengths`) and
            stop early: the round then verifies the k' <= k drafts it made, with the
            acceptance columns k..k+k'-1 and the final column 2k.

    Raises:
        ConsumedCacheError: `state` was already used for a round (its caches were
            consumed by a forward; see `specsample.core.cache`).
    """
    check_int("k", k, 0)
    check_live(state.target_cache, "state.target_cache")
    step = _plain_step if k == 0 else _speculative_step
    verdict, cache, draft_state, drafted, features = step(
        state, target, drafter, k=k, params=params, uniforms=uniforms, check=check,
        verifier=verifier, draft_lengths=draft_lengths)
    tokens, lengths, done, emitted = commit_verdict(state, verdict, eos)
    new = State(tokens=tokens, lengths=lengths, stop_lengths=state.stop_lengths,
                target_cache=rollback(cache, lengths - 1),
                draft_state=drafter.advance(draft_state, lengths) if features is None else
                drafter.advance_features(draft_state, lengths, features,  # type: ignore[attr-defined]
                                         state.lengths - 1), done=done)
    return new, RoundResult(verdict=verdict, emitted=emitted, active=~state.done, drafted=drafted)


# verdict, target cache, draft state, drafts per row, the target's features (feature drafters)
Stepped = tuple[Verdict, Cache, Any, Array, Array | None]


def _plain_step(state: State, target: Model, drafter: Drafter, *, k: int, params: SamplingParams,
                uniforms: Array, check: bool, verifier: Callable[..., Verdict],
                draft_lengths: Array | None) -> Stepped:
    """k = 0: one token per row from p, no draft (the drafter, if it has state, sits out)."""
    xp = namespace(state.tokens)
    skips = isinstance(drafter, SkippingDrafter)
    if state.draft_state is not None and not skips:
        raise ValueError(f"k: 0 (a plain step) needs a stateless drafter (state None) or a "
                         f"SkippingDrafter, got a {type(state.draft_state).__name__} state; "
                         f"use k >= 1")
    check_shape("uniforms", uniforms, (int(state.tokens.shape[0]), 1))
    last = xp.take_along_axis(state.tokens, (state.lengths - 1)[:, None], axis=1)  # [B, 1]
    logits, features, cache = _forward(target, drafter, last, state.target_cache)
    if check:
        check_uniforms("uniforms", uniforms)
    # warp's output needs no check: it is finite, non-negative and normalised by construction.
    final = sample(warp(logits[:, 0, :], params, check=check), uniforms[:, 0], check=False)
    verdict = Verdict(tokens=final[:, None], num_accepted=xp.zeros_like(state.lengths))
    draft_state = drafter.skip(state.draft_state) if skips else None  # type: ignore[attr-defined]
    return verdict, cache, draft_state, xp.zeros_like(state.lengths), features


def _speculative_step(state: State, target: Model, drafter: Drafter, *, k: int,
                      params: SamplingParams, uniforms: Array, check: bool,
                      verifier: Callable[..., Verdict], draft_lengths: Array | None) -> Stepped:
    """k >= 1: draft, one target forward over the last token and the drafts, verify."""
    xp = namespace(state.tokens)
    proposal = drafter.propose(state.draft_state, state.tokens, state.lengths, k, params,
                               uniforms[:, :k])
    made = _drafts_made(proposal, k)
    if proposal.lengths is not None:
        draft_lengths = proposal.lengths if draft_lengths is None else xp.minimum(
            draft_lengths, proposal.lengths)
    if proposal.parents is not None:
        return _tree_step(state, target, drafter, proposal, k=k, made=made, params=params,
                          uniforms=uniforms, check=check, verifier=verifier, sizes=draft_lengths)
    last = xp.take_along_axis(state.tokens, (state.lengths - 1)[:, None], axis=1)  # [B, 1]
    logits, features, cache = _forward(target, drafter, xp.concat([last, proposal.tokens], axis=1),
                                       state.target_cache)
    target_probs = warp(logits, params, check=check)  # [B, K+1, V]
    extra = {} if draft_lengths is None else {"draft_lengths": draft_lengths}
    # Acceptance slot i reads column k + i and the final token column 2k whatever k' is:
    # a row's draws never depend on how long its neighbours drafted.
    verdict = verifier(proposal.tokens, proposal.probs, target_probs,
                       xp.concat([uniforms[:, k:k + made], uniforms[:, 2 * k:]], axis=1),
                       check=check, **extra)
    drafted = xp.full_like(state.lengths, made) if draft_lengths is None else \
        xp.astype(draft_lengths, xp.int64)
    return verdict, cache, proposal.state, drafted, features


def _tree_step(state: State, target: Model, drafter: Drafter, proposal: Proposal, *, k: int, made: int,
               params: SamplingParams, uniforms: Array, check: bool, verifier: Callable[..., Verdict],
               sizes: Array | None) -> Stepped:
    """A proposal that is a tree (`Proposal.parents`): one tree forward over the last token and
    the nodes, `verify_tree`, and the accepted path's K/V moved into place (`commit_path`).
    Node i reads acceptance column k + i and the final token column 2k, as chain drafts do."""
    xp = namespace(state.tokens)
    if not isinstance(target, TreeModel):
        raise TypeError(f"target: a tree proposal needs a TreeModel (forward_tree, commit_path), got "
                        f"{type(target).__name__}")
    rule = tree_rule(verifier)
    parents = xp.astype(proposal.parents, xp.int64)
    last = xp.take_along_axis(state.tokens, (state.lengths - 1)[:, None], axis=1)  # [B, 1]
    tokens = xp.concat([last, proposal.tokens], axis=1)
    tree = xp.concat([xp.full_like(last, -1), parents + 1], axis=1)
    logits, features, cache = score_tree(target, drafter, tokens, tree, state.target_cache)
    target_probs = warp(logits, params, check=check)  # [B, 1 + made, V]
    sizes = xp.full_like(state.lengths, made) if sizes is None else xp.astype(sizes, xp.int64)
    verdict = rule(proposal.tokens, parents, proposal.probs, target_probs,
                   xp.concat([uniforms[:, k:k + made], uniforms[:, 2 * k:]], axis=1), depth=made,
                   check=check, tree_sizes=sizes)
    cache = target.commit_path(cache, state.lengths, verdict.path)
    if features is not None:
        features = path_features(features, verdict.path)
    return (Verdict(tokens=verdict.tokens, num_accepted=verdict.num_accepted), cache, proposal.state,
            sizes, features)


def score_tree(target: Model, drafter: object, tokens: Array, parents: Array, cache: Cache
               ) -> tuple[Array, Array | None, Cache]:
    """A tree forward's logits, each node's features when the drafter reads them (else None),
    and the cache (`TreeModel.forward_tree`, or `forward_tree_features`)."""
    if not reads_features(drafter):
        logits, cache = target.forward_tree(tokens, parents, cache)  # type: ignore[attr-defined]
        return logits, None, cache
    scorer = getattr(target, "forward_tree_features", None)
    if not callable(scorer):
        raise TypeError(f"target: a {type(drafter).__name__} reads the target's features: expected "
                        f"a TreeModel with forward_tree_features, got {type(target).__name__}")
    logits, features, cache = scorer(tokens, parents, cache)
    return logits, features, cache


def path_features(features: Array, path: Array) -> Array:
    """The features [B, 1 + D, F] along each row's accepted path, from a tree forward's
    features [B, 1 + W, F] (column 0: the last committed token; column 1 + i: node i) and
    the verdict's path [B, D] (node indices, -1 past the accepted ones: column 0 there)."""
    xp = namespace(features, path)
    root = xp.zeros((int(path.shape[0]), 1), dtype=xp.int64, device=device(path))
    path = xp.astype(path, xp.int64)
    columns = xp.concat([root, xp.where(path >= 0, 1 + path, 0)], axis=1)  # [B, 1 + D]
    shape = (int(columns.shape[0]), int(columns.shape[1]), int(features.shape[2]))
    return xp.take_along_axis(features, xp.broadcast_to(columns[:, :, None], shape), axis=1)


def _drafts_made(proposal: Proposal, k: int) -> int:
    """k', the drafts per row in `proposal`: k, or fewer when the drafter stopped early."""
    made = int(proposal.tokens.shape[1]) if getattr(proposal.tokens, "ndim", 0) == 2 else -1
    if not 1 <= made <= k or (proposal.lengths is None and made != k):
        raise ValueError(f"proposal.tokens: expected [B, k'] drafts with 1 <= k' <= k = {k} "
                         f"(k' = k unless proposal.lengths says how many each row keeps), got shape "
                         f"{list(getattr(proposal.tokens, 'shape', []))}")
    return made


def _window(xp: Any, tokens: Array, lengths: Array, count: Array) -> Array:
    """bool [B, C]: the positions written this round."""
    pos = xp.arange(tokens.shape[1], dtype=xp.int64, device=device(tokens))[None, :]
    return (pos >= lengths[:, None]) & (pos < (lengths + count)[:, None])
