"""Speculative rounds with a draft tree: one target forward scores every node.

A round takes a `TreeProposal` (N nodes per row), feeds the last committed token and
the nodes to the target in one pass with a tree mask (`TreeModel.forward_tree`),
verifies with `verify_tree`, commits the accepted path and the final token, and moves
the path's K/V into place (`TreeModel.commit_path`); the rejected branches are dropped
by rolling the cache back by length. Rounds compose as chain rounds do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from specsample._array import Array, check_int, device, host_ints, namespace
from specsample.core.cache import check_live, rollback
from specsample.core.metrics import Metrics
from specsample.core.params import SamplingParams
from specsample.core.protocols import FeatureTreeDrafter, StatefulTreeDrafter, TreeDrafter, TreeModel
from specsample.core.rng import Seed, round_uniforms
from specsample.core.sample import sample
from specsample.core.verifiers import tree_rule
from specsample.core.verify import Verdict
from specsample.core.verify_tree import TreeVerdict, verify_tree
from specsample.core.warp import warp
from specsample.engine.options import RunOptions
from specsample.engine.round import RoundResult, State, commit_verdict, path_features, score_tree, start
from specsample.engine.runs import Generation, Step, capacity_for, finish, prepare_prompt, tally_round

__all__ = ["generate_tree", "run_tree_rounds", "tree_round_step"]


def tree_round_step(state: State, target: TreeModel, drafter: TreeDrafter, *, nodes: int, depth: int,
                    params: SamplingParams, uniforms: Array, eos: int | None = None,
                    check: bool = True, verifier: Callable[..., TreeVerdict] = verify_tree
                    ) -> tuple[State, RoundResult]:
    """Draft a tree, score it with one target forward, verify, commit.

    Args:
        nodes: N, nodes per tree (the drafter may use fewer per row).
        depth: the deepest level, >= 1.
        uniforms: [B, N+1] in [0, 1): one test per node, then the final token.
        eos: a token id that ends a row, or None.
        check: validate the verify inputs.
        verifier: the acceptance rule, `verify_tree` unless studying another one (the
            statistical tests swap in broken rules to show they are caught).

    Returns:
        The new state and the round's result (`drafted`: each row's tree size).
    """
    check_int("nodes", nodes, 1)
    check_int("depth", depth, 1)
    check_live(state.target_cache, "state.target_cache")
    xp = namespace(state.tokens)
    reader = drafter if isinstance(drafter, FeatureTreeDrafter) else None
    if isinstance(drafter, StatefulTreeDrafter):  # a draft model's cache, or a head's
        tree, draft_state = drafter.propose_from(state.draft_state, state.tokens, state.lengths, nodes, depth)
    else:
        tree, draft_state = drafter.propose_tree(state.tokens, state.lengths, nodes, depth), state.draft_state
    # Only the columns some row uses are scored (the rest would be masked anyway).
    width = max([*host_ints(xp.where(state.done, 0, tree.sizes)), 0])
    last = xp.take_along_axis(state.tokens, (state.lengths - 1)[:, None], axis=1)  # [B, 1]
    tokens = xp.concat([last, tree.tokens[:, :width]], axis=1)
    parents = xp.concat([xp.full_like(last, -1), tree.parents[:, :width] + 1], axis=1)
    logits, features, cache = score_tree(target, drafter, tokens, parents, state.target_cache)
    target_probs = warp(logits, params, check=check)  # [B, 1 + width, V]
    if width == 0:  # no row has a tree: a plain step
        final = sample(target_probs[:, 0, :], uniforms[:, nodes], check=check)
        verdict = Verdict(tokens=final[:, None], num_accepted=xp.zeros_like(state.lengths))
        path = xp.zeros((int(state.lengths.shape[0]), 0), dtype=xp.int64, device=device(final))
    else:
        u = xp.concat([uniforms[:, :width], uniforms[:, nodes:]], axis=1)
        tree_verdict = verifier(tree.tokens[:, :width], tree.parents[:, :width],
                                   None if tree.probs is None else tree.probs[:, :width],
                                   target_probs, u, depth=depth, check=check,
                                   tree_sizes=xp.minimum(tree.sizes, width))
        verdict = Verdict(tokens=tree_verdict.tokens, num_accepted=tree_verdict.num_accepted)
        path = tree_verdict.path
    cache = target.commit_path(cache, state.lengths, path)
    committed, lengths, done, emitted = commit_verdict(state, verdict, eos)
    if reader is not None:
        assert features is not None  # score_tree returns them for a drafter that reads them
        draft_state = reader.advance_features(draft_state, lengths, path_features(features, path),
                                              state.lengths - 1)
    else:
        draft_state = drafter.advance(draft_state, lengths)
    new = State(tokens=committed, lengths=lengths, stop_lengths=state.stop_lengths,
                target_cache=rollback(cache, lengths - 1), draft_state=draft_state, done=done)
    return new, RoundResult(verdict=verdict, emitted=emitted, active=~state.done,
                            drafted=xp.where(state.done, 0, xp.minimum(tree.sizes, width)))


def run_tree_rounds(target: TreeModel, drafter: TreeDrafter, input_ids: Array, run: RunOptions
                    ) -> Iterator[Step]:
    """Tree rounds until every row stops, yielding after each (as `run_rounds` does for chains).

    The tree budget is the drafter's (`nodes`, `depth`); `run.k` is not used. Round r
    takes the verification columns of `round_uniforms(seed, r, B, nodes)`.
    """
    for name, value in (("target", target), ("drafter", drafter)):
        wanted = TreeModel if name == "target" else TreeDrafter
        if not isinstance(value, wanted):
            raise TypeError(f"{name}: expected a {wanted.__name__}, got {type(value).__name__}")
    nodes, depth = check_int("drafter.nodes", drafter.nodes, 1), check_int("drafter.depth", drafter.depth, 1)
    rule = tree_rule(run.verifier)
    prompt, lengths = prepare_prompt(input_ids, run.prompt_lengths, target.vocab_size)
    run.rows(int(prompt.shape[0]))
    xp = namespace(prompt)
    batch = int(prompt.shape[0])
    needed = int(xp.max(lengths)) + run.max_new_tokens + nodes + 1
    state = start(target, drafter, prompt, lengths, capacity=capacity_for(run.capacity, needed, "nodes"),  # type: ignore[arg-type]
                  stop_lengths=lengths + run.max_new_tokens)
    metrics, index = Metrics(), 0
    while not all(host_ints(state.done)):
        began = time.perf_counter()
        u = round_uniforms(run.seed, index, batch, nodes, like=state.tokens)[:, nodes:]  # [B, N+1]
        state, result = tree_round_step(state, target, drafter, nodes=nodes, depth=depth, params=run.params,
                                        uniforms=u, eos=run.eos_token_id, check=run.check, verifier=rule)
        metrics = tally_round(metrics, result, k=nodes, began=began)
        yield Step(index=index, k=nodes, result=result, state=state, metrics=metrics)
        index += 1


def generate_tree(target: TreeModel, drafter: TreeDrafter, input_ids: Array, *, max_new_tokens: int,
                  params: SamplingParams | None = None, seed: Seed = 0, eos_token_id: int | None = None,
                  prompt_lengths: Array | None = None, check: bool = True, pad_id: int = 0,
                  verifier: str | Callable[..., TreeVerdict] = "token") -> Generation:
    """Speculative sampling with draft trees, to completion (`generate` does the same for a
    tree drafter; this spelling takes a tree rule as `verifier`).

    Args:
        target: a TreeModel (p).
        drafter: a TreeDrafter; its `nodes` and `depth` are the budget per round.
        input_ids: int [B, T] prompts, right-padded; `prompt_lengths` [B] says where each ends.
        max_new_tokens: tokens to generate per row, >= 1.
        verifier: the tree rule, or a chain rule's name (meaning `verify_tree`).

    Returns:
        A Generation; its metrics count nodes as drafts (tokens per target forward =
        emitted / row_rounds).
    """
    run = RunOptions(max_new_tokens=max_new_tokens, params=params or SamplingParams(), seed=seed,
                     eos_token_id=eos_token_id, prompt_lengths=prompt_lengths, check=check,
                     pad_id=pad_id, verifier=verifier)  # type: ignore[arg-type]
    return finish(run_tree_rounds(target, drafter, input_ids, run), input_ids, run, target.vocab_size)
