"""Many exact samples of a real model's first tokens, each distinct prefix evaluated once.

Speculative and plain sampling of the first L tokens after one prompt, for n independent
rows, where n is large enough (hundreds of thousands) to detect small TV distances. Rows
that share a prefix share its forward pass: the law after each distinct prefix is computed
once, in batches, from a copy of the prompt's cache, so the cost grows with the number of
distinct prefixes, not with n. Each row then draws its own tokens with its own uniforms:
the drafts from q (the drafter's `laws`), the verdict from the acceptance rule (`verify`
unless a broken one is studied), plain tokens from p with `sample`. Nothing else differs
from a generation, so the law of each row's first L tokens is that of `generate` (resp.
`generate_plain`) on the same models; what is not exercised is the engine around the rule
(caches, rollback), which `specsample check --sampler engine` covers at smaller n. A
drafter of deterministic trees (the suffix tree) is run the same way: its tree is built
once per distinct context, the target's law at every node is the law after the node's
path, and `verify_tree` decides with the row's uniforms, as `run_tree_rounds` lays them out.

Laws after L or more generated tokens can only decide tokens past the first L, which are
cut: they are replaced by the law after the row's first L - 1 tokens, saving forwards
without changing the first L tokens' law. That holds for rules that decide position i from
the laws at positions <= i, as `verify` does; for a rule that looks further ahead (e.g.
`broken.p_shifted`), pass `lookahead` (K covers any rule that reads one round).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from specsample._array import Array, check_int, device, host_array, namespace
from specsample.core.params import SamplingParams
from specsample.core.protocols import Model, reads_features
from specsample.core.rng import Stream, round_uniforms, uniforms
from specsample.core.sample import sample
from specsample.core.verifiers import VERIFIERS, tree_rule
from specsample.core.verify import Verdict, verify
from specsample.core.verify_tree import verify_tree
from specsample.core.warp import warp
from specsample.drafters.hybrid import HybridDrafter
from specsample.drafters.model import token_confidence
from specsample.testing._prefix import Key, PrefixLaws

__all__ = ["tree_samples"]

# generated ids of each row -> (rows that copy, their copies [R, k])
Copier = Callable[[list[NDArray[np.int64]]], tuple[NDArray[np.bool_], NDArray[np.int64]]]


def _keys(out: NDArray[np.int64], rows: NDArray[np.intp], depth: NDArray[np.int64],
          extra: NDArray[np.int64] | None, cut: int) -> list[Key]:
    """Per row: its committed ids, then `extra` ids, cut to the first `cut` ids."""
    keys = []
    for i, r in enumerate(rows):
        key = tuple(int(t) for t in out[r, : depth[r]])
        if extra is not None:
            key += tuple(int(t) for t in extra[i])
        keys.append(key[:cut])
    return keys


def _on(u: NDArray[np.float64], like: Array) -> Array:
    """Host uniforms on `like`'s library and device."""
    xp = namespace(like)
    return xp.asarray(u, dtype=xp.float64, device=device(like))


def _speculative(target: PrefixLaws, draft: PrefixLaws, out: NDArray[np.int64], *, k: int,
                 length: int, cut: int, seed: int, row_ids: NDArray[np.int64],
                 verifier: Callable[..., Verdict], batch: int,
                 stops: Any = None, copies: Copier | None = None) -> None:
    """Fill `out` [R, length] with rounds of drafting k tokens and verifying them.

    The laws every active row needs at a step are filled in first, in large batches; rows
    then draw and verify in small batches (V-wide work per row stays in cache-sized blocks).
    Round t of row b (global index `row_ids[b]`) reads `round_uniforms(seed, t)` of that
    row, as the generate loop lays them out: drafts, acceptance, final token.

    With `stops` (a drafter with a confidence `threshold` and its `kept` rule, as
    `ModelDrafter`), the draft's third per-prefix array holds its logits; a row keeps
    the first L_b drafts and is verified with `draft_lengths`, as the engine verifies a round
    whose rows stopped drafting early. Once a row's confidence fell below the threshold its
    later drafts are never read: they repeat its last law (no new prefix), and its target
    keys past L_b repeat the one at L_b.

    With `copies` (each active row's generated ids -> (rows that copy, their k copied ids),
    as `HybridDrafter` decides from the row's whole context), a copying row proposes its copy
    (q one-hot, all k kept) and reads no draft law; the others draft from the model.
    """
    depth = np.zeros(out.shape[0], dtype=np.int64)
    xp = target.xp
    step = 0
    while (active := np.flatnonzero(depth < length)).size:
        u = round_uniforms(seed, step, active.size, k, row_ids=row_ids[active])  # [A, 2k + 1]
        drafted = np.zeros((active.size, k), dtype=np.int64)
        copy, copied = (None, None) if copies is None else copies([out[r, :depth[r]] for r in active])
        draft_keys: list[list[Key]] = []
        confidence: list[NDArray[Any]] = []
        stopped = np.zeros(active.size, dtype=bool)
        for i in range(k):
            keys = _keys(out, active, depth, drafted[:, :i], cut)
            if copy is not None:  # a copying row reads no draft law: the prompt's stands in
                keys = [() if copy[j] else key for j, key in enumerate(keys)]
            if i and stopped.any():  # a stopped row's later drafts are never read: no new law
                keys = [draft_keys[-1][j] if stopped[j] else key for j, key in enumerate(keys)]
            draft.fill(keys)
            draft_keys.append(keys)
            for s in range(0, active.size, batch):
                law, _ = draft.rows(keys[s:s + batch])
                drafted[s:s + batch, i] = host_array(sample(law, _on(u[s:s + batch, i], law), check=False))
            if stops is not None:
                confidence.append(_confidence(draft, keys, drafted[:, i], batch))
                stopped |= confidence[-1] < stops.threshold
        lengths = None
        if stops is not None:
            got = xp.asarray(np.stack(confidence, axis=1), device=device(target.cache.lengths))
            lengths = host_array(stops.kept(got, stops.threshold)).astype(np.int64)
        if copy is not None and copied is not None:
            drafted[copy] = copied[copy]
            if lengths is not None:
                lengths[copy] = k
        target_keys = [_keys(out, active, depth, drafted[:, :j], cut) for j in range(k + 1)]
        if lengths is not None:
            target_keys = [[target_keys[min(j, int(lengths[b]))][b] for b in range(active.size)]
                           for j in range(k + 1)]
        target.fill(key for keys in target_keys for key in keys)
        for s in range(0, active.size, batch):
            rows = active[s:s + batch]
            q = xp.stack([draft.rows(keys[s:s + batch])[1] for keys in draft_keys], axis=1)
            p = xp.stack([target.rows(keys[s:s + batch])[0] for keys in target_keys], axis=1)
            tokens = xp.asarray(drafted[s:s + batch], dtype=xp.int64, device=device(p))
            if copy is not None:
                ids = xp.arange(int(q.shape[2]), dtype=xp.int64, device=device(q))
                one_hot = xp.astype(tokens[..., None] == ids, q.dtype)
                here = xp.asarray(copy[s:s + batch], device=device(q))[:, None, None]
                q = xp.where(here, one_hot, q)
            extra = {} if lengths is None else {
                "draft_lengths": xp.asarray(lengths[s:s + batch], dtype=xp.int64, device=device(p))}
            verdict = verifier(tokens, q, p, _on(u[s:s + batch, k:], p), check=False, **extra)
            _commit(out, depth, rows, verdict, length)
        step += 1


def _confidence(draft: PrefixLaws, keys: list[Key], tokens: NDArray[np.int64], batch: int
                ) -> NDArray[Any]:
    """The draft's confidence in each drafted token (`token_confidence`, in the logits' dtype),
    read from the logits after the prefix it was drafted after (the draft table's third
    array): [A]."""
    parts = []
    for s in range(0, len(keys), batch):
        logits = draft.column(keys[s:s + batch], 2)
        xp = namespace(logits)
        picked = xp.asarray(tokens[s:s + batch], dtype=xp.int64, device=device(logits))
        parts.append(host_array(token_confidence(logits, picked)))
    return np.concatenate(parts)


def _copier(lookup: Any, prompt: NDArray[np.int64], k: int, *, like: Array) -> Copier:
    """generated ids per row -> (rows for which prompt lookup copies all k ids, the copies
    [R, k]), from each row's whole context (prompt, then its ids), as `HybridDrafter.propose`
    reads it."""
    xp = namespace(like)

    def copies(generated: list[NDArray[np.int64]]) -> tuple[NDArray[np.bool_], NDArray[np.int64]]:
        width = int(prompt.shape[1]) + max(len(g) for g in generated)
        tokens = np.zeros((len(generated), width), dtype=np.int64)
        for i, g in enumerate(generated):
            tokens[i, : prompt.shape[1] + len(g)] = np.concatenate([prompt[0], g])
        lengths = np.array([prompt.shape[1] + len(g) for g in generated], dtype=np.int64)
        matched, copied = lookup.lengths_and_copies(xp.asarray(tokens, device=device(like)),
                                                    xp.asarray(lengths, device=device(like)), k)
        return host_array(matched) == k, host_array(copied.tokens).astype(np.int64)

    return copies


def _commit(out: NDArray[np.int64], depth: NDArray[np.int64], rows: NDArray[np.intp], verdict: Any,
            length: int) -> None:
    """Append each row's accepted tokens and final token to `out`, up to `length` tokens."""
    got, count = host_array(verdict.tokens), host_array(verdict.num_accepted) + 1
    for i, r in enumerate(rows):
        take = min(int(count[i]), length - int(depth[r]))
        out[r, depth[r]: depth[r] + take] = got[i, :take]
        depth[r] += take


def _node_keys(context: Key, tokens: NDArray[np.int64], parents: NDArray[np.int64], size: int,
               cut: int) -> list[Key]:
    """The prefixes whose laws a tree round reads: the context, then context + the path to
    each node (nodes past `size` repeat the context's), each cut to `cut` ids."""
    paths: list[Key] = []
    for i in range(len(tokens)):
        if i < size:
            parent = int(parents[i])
            paths.append((paths[parent] if parent >= 0 else ()) + (int(tokens[i]),))
        else:
            paths.append(())
    return [(context + path)[:cut] for path in [(), *paths]]


def _speculative_tree(target: PrefixLaws, drafter: Any, prompt: NDArray[np.int64],
                      out: NDArray[np.int64], *, length: int, cut: int, seed: int,
                      row_ids: NDArray[np.int64], verifier: Callable[..., Any], batch: int,
                      like: Array) -> None:
    """Fill `out` [R, length] with tree rounds: each row's deterministic tree from its own
    context (built once per distinct context, its ids on `like`'s library and device),
    verified as `tree_round_step` does.

    Round t of row b reads the verification columns of `round_uniforms(seed, t, ., N)` of
    that row, as `run_tree_rounds` lays them out: one test per node, then the final token.
    """
    xp = target.xp
    nodes, depth_max = int(drafter.nodes), int(drafter.depth)
    trees: dict[Key, tuple[NDArray[np.int64], NDArray[np.int64], int]] = {}
    depth = np.zeros(out.shape[0], dtype=np.int64)
    rows_per_call = max(1, batch * 5 // (nodes + 1))  # as many V-wide laws as a chain batch at K = 4
    step = 0
    while (active := np.flatnonzero(depth < length)).size:
        u = round_uniforms(seed, step, active.size, nodes, row_ids=row_ids[active])[:, nodes:]
        contexts = [tuple(int(t) for t in out[r, : depth[r]]) for r in active]
        _build_trees(drafter, prompt, [c for c in dict.fromkeys(contexts) if c not in trees],
                     nodes, depth_max, trees, like=like)
        keys = [_node_keys(c, *trees[c], cut) for c in contexts]
        target.fill(key for row in keys for key in row)
        for s in range(0, active.size, rows_per_call):
            rows, part = active[s:s + rows_per_call], contexts[s:s + rows_per_call]
            p = xp.stack([target.rows(row)[0] for row in keys[s:s + rows_per_call]])  # [b, N+1, V]
            where = device(p)
            tokens, parents = (xp.asarray(np.stack([trees[c][i] for c in part]), dtype=xp.int64,
                                          device=where) for i in (0, 1))
            sizes = xp.asarray([trees[c][2] for c in part], dtype=xp.int64, device=where)
            verdict = verifier(tokens, parents, None, p, _on(u[s:s + rows_per_call], p),
                               depth=depth_max, tree_sizes=sizes, check=False)
            _commit(out, depth, rows, verdict, length)
        step += 1


def _build_trees(drafter: Any, prompt: NDArray[np.int64], contexts: list[Key], nodes: int,
                 depth: int, trees: dict[Key, tuple[NDArray[np.int64], NDArray[np.int64], int]], *,
                 like: Array) -> None:
    """The drafter's tree after prompt + each context, in one call (ids on `like`'s library
    and device, as a drafter over a model reads them), into `trees`."""
    if not contexts:
        return
    width = prompt.shape[1] + max(len(c) for c in contexts)
    ids = np.zeros((len(contexts), width), dtype=np.int64)
    for i, c in enumerate(contexts):
        ids[i, : prompt.shape[1] + len(c)] = np.concatenate([prompt[0], np.asarray(c, dtype=np.int64)])
    lengths = np.array([prompt.shape[1] + len(c) for c in contexts], dtype=np.int64)
    # A drafter that keeps what it proposed (a suffix tree's memory) offers `trees`, which
    # changes nothing: these contexts are the sampler's, not a call's.
    xp = namespace(like)
    tree = getattr(drafter, "trees", drafter.propose_tree)(
        xp.asarray(ids, device=device(like)), xp.asarray(lengths, device=device(like)), nodes, depth)
    if tree.probs is not None:
        raise TypeError(f"drafter: the tree sampler verifies deterministic trees (probs None); "
                        f"{type(drafter).__name__} drew its tree from a law: sample through the engine")
    tokens, parents, sizes = host_array(tree.tokens), host_array(tree.parents), host_array(tree.sizes)
    for i, c in enumerate(contexts):
        trees[c] = (tokens[i].astype(np.int64), parents[i].astype(np.int64), int(sizes[i]))


def _plain(target: PrefixLaws, out: NDArray[np.int64], *, length: int, seed: int,
           row_ids: NDArray[np.int64], batch: int) -> None:
    """Fill `out` [R, length] token by token from p; token d of row b reads the plain stream's
    step d of that row (global index `row_ids[b]`)."""
    every = np.arange(out.shape[0])
    for d in range(length):
        keys = _keys(out, every, np.full(out.shape[0], d, dtype=np.int64), None, d)
        target.fill(keys)
        u = uniforms(seed, d, every.size, 1, stream=Stream.PLAIN, row_ids=row_ids)[:, 0]
        for start in range(0, every.size, batch):
            law, _ = target.rows(keys[start:start + batch])
            out[start:start + batch, d] = host_array(sample(law, _on(u[start:start + batch], law),
                                                        check=False))


def tree_samples(target: Model, drafter: Any, prompt: Array, *, n: int, k: int,
                 params: SamplingParams, seed: int, length: int = 3, first_row: int = 0,
                 verifier: Callable[..., Any] = verify, lookahead: int = 0,
                 chunk: int = 65_536, batch: int = 64,
                 progress: Callable[[int], None] | None = None
                 ) -> tuple[NDArray[np.int64], NDArray[np.int64], dict[str, int]]:
    """The first `length` tokens of n speculative and n plain generations after `prompt`.

    Args:
        target: the target Model.
        drafter: a model drafter: a `model` (a Model) and `laws(logits, params, check=)`,
            as `ModelDrafter` (with a `threshold`, each row keeps the drafts its `kept`
            rule keeps, as the engine does); a `hybrid` (`HybridDrafter` without a cost:
            prompt lookup's copies where the row's context repeats, that model drafter
            elsewhere); or a tree drafter of deterministic trees (`propose_tree`,
            `nodes`, `depth`, as `SuffixTreeDrafter`), whose rounds are verified by
            `verify_tree` (k is then unused: the budget is the drafter's).
        prompt: int64 [1, T] ids.
        n: rows per method, >= 1.
        k: draft tokens per round, >= 1.
        params: the sampling parameters of both methods.
        seed: the key of every uniform, drawn from `specsample.core.rng` per row: row b's draws
            depend only on (seed, stream, step, b), and the two methods use disjoint
            streams, so any split of the rows into calls gives the same samples.
        length: tokens per row, >= 1.
        first_row: the global index of the first row (the rows are first_row ..
            first_row + n - 1), for a call that computes one shard of a larger sample.
        verifier: the acceptance rule (for a tree drafter a tree rule; a chain rule of
            `specsample.core.verifiers.VERIFIERS` then means `verify_tree`, as in `generate`).
            A tree drafter's memory (a suffix tree's earlier calls) is used as it stands.
        lookahead: how many positions past its own the rule reads (0 for `verify`); laws
            after up to length - 1 + lookahead ids are then computed exactly.
        chunk: rows per block; the deepest laws are dropped between blocks.
        batch: rows per verify or sample call.
        progress: called with the number of rows finished (both methods), for a progress bar.

    Returns:
        (speculative [n, length], plain [n, length], counts): counts holds `laws` (laws
        computed, both models; far fewer than rows) and `forwarded` (tokens fed beyond the
        prompt).
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params: expected SamplingParams, got {type(params).__name__}")
    lookup = None
    if isinstance(drafter, HybridDrafter):
        if drafter.scheduler is not None:
            raise TypeError("drafter: an `auto` hybrid's gate reads each row's record and the "
                            "batch's widths, which the tree sampler does not model; sample "
                            "through the engine (or use `hybrid`)")
        lookup, drafter = drafter.lookup, drafter.model
    model = getattr(drafter, "model", None)
    tree = callable(getattr(drafter, "propose_tree", None))
    if reads_features(drafter):
        raise TypeError(f"drafter: a {type(drafter).__name__} reads the target's features of each "
                        f"round, which the tree sampler does not compute; sample through the engine")
    if getattr(drafter, "support", None) is not None:
        raise TypeError("drafter: its model drafts over a vocabulary subset (`support`), which the "
                        "tree sampler's draft laws do not model; sample through the engine")
    if not tree and (not isinstance(model, Model) or not callable(getattr(drafter, "laws", None))):
        raise TypeError(f"drafter: expected a model drafter (a `model` and `laws`) or a tree "
                        f"drafter (`propose_tree`), got {type(drafter).__name__}")
    n, k, length = check_int("n", n, 1), check_int("k", k, 1), check_int("length", length, 1)
    cut = length - 1 + check_int("lookahead", lookahead, 0)
    chunk, batch = check_int("chunk", chunk, 1), check_int("batch", batch, 1)
    check_int("seed", seed, 0, 2**64)
    first_row = check_int("first_row", first_row, 0, 2**32 - n + 1)

    def target_law(logits: Array) -> tuple[Array, Array]:
        p = warp(logits, params)
        return p, p

    threshold = None if tree else getattr(drafter, "threshold", None)

    def draft_law(logits: Array) -> tuple[Array, ...]:
        laws = drafter.laws(logits, params, check=True)
        return laws if threshold is None else (*laws, logits)  # logits: the confidence rule's

    copies = None if lookup is None else _copier(lookup, host_array(prompt).astype(np.int64), k, like=prompt)
    p = PrefixLaws(target, prompt, target_law, depth=cut)
    q = None if tree else PrefixLaws(model, prompt, draft_law, depth=cut)  # type: ignore[arg-type]
    if tree:
        check_int("drafter.nodes", drafter.nodes, 1)
        check_int("drafter.depth", drafter.depth, 1)
        chain = any(verifier is rule for rule in VERIFIERS.values())  # a tree has one rule
        rule = verify_tree if chain else tree_rule(verifier)
    spec = np.full((n, length), -1, dtype=np.int64)
    plain = np.full((n, length), -1, dtype=np.int64)
    for start in range(0, n, chunk):
        block = slice(start, min(n, start + chunk))
        ids = np.arange(first_row + block.start, first_row + block.stop, dtype=np.int64)
        if q is None:
            _speculative_tree(p, drafter, host_array(prompt).astype(np.int64), spec[block], length=length,
                              cut=cut, seed=seed, row_ids=ids, verifier=rule, batch=batch, like=prompt)
        else:
            _speculative(p, q, spec[block], k=k, length=length, cut=cut, seed=seed, row_ids=ids,
                         verifier=verifier, batch=batch, stops=None if threshold is None else drafter,
                         copies=copies)
        _plain(p, plain[block], length=length, seed=seed, row_ids=ids, batch=batch)
        if progress is not None:
            progress(2 * (block.stop - block.start))
        if cut > 0:
            p.forget(cut)
            if q is not None:
                q.forget(cut)
    drafts = (0, 0) if q is None else (q.computed, q.forwarded)
    return spec, plain, {"laws": p.computed + drafts[0], "forwarded": p.forwarded + drafts[1]}
