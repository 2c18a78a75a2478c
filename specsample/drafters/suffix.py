"""A suffix-tree drafter: a tree of candidate continuations from the context itself.

Prompt lookup copies what followed the latest earlier occurrence of the context's last
n-gram; the context often holds several occurrences, followed by different text. This
drafter gathers the continuations after *every* occurrence of the longest matching
suffix (n = ngram_max down to ngram_min; the latest `max_matches` of them), merges them
into a trie, and keeps the `nodes` most likely nodes, where a node's estimated
probability is the product, along its path, of the fraction of the matches through its
parent that continue with it (as SuffixDecoding, arXiv 2411.04975, scores its trees).
Nodes come best first, so a parent always precedes its children and siblings are tried
most frequent first.

A continuation that runs into the end of the context is extended by assuming the text
repeats with the match's period, as `PromptLookupDrafter` does. The candidates are
deterministic (verified with one-hot q, without replacement) and read only committed
tokens: any tree is lossless, a good one is merely accepted more often.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from specsample._array import Array, check_int, check_shape, device, host_ints, namespace
from specsample.core.protocols import TreeProposal

__all__ = ["SuffixTreeDrafter", "is_suffix_tree_name", "suffix_tree"]


class SuffixTreeDrafter:
    """Trees of continuations after every earlier occurrence of the context's suffix.

    Args:
        nodes: the node budget per tree (N, the verify's width less one), >= 1.
        depth: the deepest level, >= 1.
        ngram_max: the longest suffix tried, >= ngram_min.
        ngram_min: the shortest suffix tried, >= 1.
        max_matches: the most recent occurrences used, >= 1.
        confident: the shortest matching suffix that earns the whole budget; after a
            shorter match the tree is one node (a wide verify is not free on a CPU, and a
            one-token match is a weak guess), as prompt lookup's `confident` does; clipped
            to [ngram_min, ngram_max].
        remember: how many sequences of earlier calls to match against as well (0: none).
            The drafter keeps each row's latest context of a call, and a call's `start`
            adds those of the call before it (the latest call first, its rows in order,
            each distinct sequence once), so a repeated
            or similar request drafts from what was generated before. The memory is fixed
            for the whole of a call: a row's trees read only its own context and earlier
            calls, never its neighbours' tokens in this call.
    """

    def __init__(self, nodes: int = 8, depth: int = 4, ngram_max: int = 3, ngram_min: int = 1,
                 max_matches: int = 64, confident: int = 2, remember: int = 0) -> None:
        check_int("nodes", nodes, 1)
        check_int("depth", depth, 1)
        check_int("ngram_max", ngram_max, 1)
        check_int("ngram_min", ngram_min, 1)
        check_int("max_matches", max_matches, 1)
        check_int("confident", confident, 1)
        check_int("remember", remember, 0)
        if ngram_min > ngram_max:
            raise ValueError(f"ngram_min: expected <= ngram_max = {ngram_max}, got {ngram_min}")
        self.nodes, self.depth = nodes, depth
        self.ngram_max, self.ngram_min, self.max_matches = ngram_max, ngram_min, max_matches
        self.confident = min(max(confident, ngram_min), ngram_max)
        self.remember = remember
        self.memory: list[np.ndarray] = []  # earlier calls' sequences, latest first
        self._latest: dict[int, np.ndarray] = {}  # this call's latest context per row

    def __repr__(self) -> str:
        extra = f", remember={self.remember}" if self.remember else ""
        return f"SuffixTreeDrafter(nodes={self.nodes}, depth={self.depth}{extra})"

    def start(self, tokens: Array, lengths: Array, capacity: int) -> None:
        """No state (every tree is built from the committed tokens); with `remember`, the
        previous call's sequences join the memory."""
        if self.remember:
            latest = [self._latest[row] for row in sorted(self._latest)]
            fresh = {seq.tobytes() for seq in latest}
            older = [m for m in self.memory if m.tobytes() not in fresh]  # a repeat moves up
            unique = list({seq.tobytes(): seq for seq in latest}.values())  # rows in order, once
            self.memory = (unique + older)[:self.remember]
            self._latest = {}
        return None

    def advance(self, state: Any, lengths: Array) -> None:
        """No state to move."""
        return None

    def propose_tree(self, tokens: Array, lengths: Array, nodes: int, depth: int) -> TreeProposal:
        """A tree of at most `nodes` nodes and `depth` levels per row (`trees`); with
        `remember`, each row's context is also kept for the memory of later calls."""
        contexts = _contexts(tokens, lengths)
        if self.remember:
            self._latest.update((b, context.copy()) for b, context in enumerate(contexts))
        return self._propose(contexts, nodes, depth, tokens)

    def trees(self, tokens: Array, lengths: Array, nodes: int, depth: int) -> TreeProposal:
        """A tree of at most `nodes` nodes and `depth` levels per row, from each row's context
        and the memory, changing nothing (the tree sampler of `specsample check` builds
        trees for many contexts this way).

        Args:
            tokens: int [B, C] committed ids, row b valid on [0, lengths[b]).
            lengths: int [B], each >= 1.
            nodes: N, nodes per row (static), >= 1.
            depth: the deepest level, >= 1.

        Returns:
            A TreeProposal (probs None); a row without any match has size 0.
        """
        return self._propose(_contexts(tokens, lengths), nodes, depth, tokens)

    def _propose(self, contexts: list[np.ndarray], nodes: int, depth: int, like: Array) -> TreeProposal:
        """The trees after each context, as arrays of `like`'s library and device."""
        check_int("nodes", nodes, 1)
        check_int("depth", depth, 1)
        out_tokens = np.zeros((len(contexts), nodes), dtype=np.int64)
        out_parents = np.full((len(contexts), nodes), -1, dtype=np.int64)
        sizes = np.zeros(len(contexts), dtype=np.int64)
        built: dict[bytes, list[tuple[int, int]]] = {}  # rows with one context share its tree
        for b, context in enumerate(contexts):
            key = context.tobytes()
            if key not in built:
                built[key] = self._tree(context, nodes, depth)
            chosen = built[key]
            sizes[b] = len(chosen)
            for i, (token, parent) in enumerate(chosen):
                out_tokens[b, i], out_parents[b, i] = token, parent
        xp, where = namespace(like), device(like)
        return TreeProposal(tokens=xp.asarray(out_tokens, device=where),
                            parents=xp.asarray(out_parents, device=where),
                            sizes=xp.asarray(sizes, device=where))

    def _matches(self, context: np.ndarray) -> tuple[int, list[tuple[int, int]]]:
        """The longest matching suffix's length n and its earlier occurrences as (source,
        end): source -1 is the context (ends e <= L-2), i >= 0 the memory's i-th sequence;
        the context's latest first, then the memory's ((0, []) without a match)."""
        length = len(context)
        for n in range(min(self.ngram_max, length - 1), self.ngram_min - 1, -1):
            suffix = context[length - n:]
            found: list[tuple[int, int]] = []
            for source, seq in enumerate([context, *self.memory], start=-1):
                # The context's own last n tokens are the suffix itself, not an occurrence.
                ends = np.arange(n - 1, len(seq) - 1)
                hit = np.ones(len(ends), dtype=bool)
                for j in range(n):
                    hit &= seq[ends - j] == suffix[n - 1 - j]
                found += [(source, int(e)) for e in ends[hit][::-1]]
                if len(found) >= self.max_matches:
                    break
            if found:
                return n, found[:self.max_matches]
        return 0, []

    def _tree(self, context: np.ndarray, nodes: int, depth: int) -> list[tuple[int, int]]:
        """(token, parent index) of the chosen nodes, best first."""
        matched, ends = self._matches(context)
        if not ends:
            return []
        if matched < self.confident:
            nodes = 1
        length = len(context)
        trie: dict[tuple[int, ...], int] = {}  # path of tokens -> matches through it
        for source, end in ends:
            path: tuple[int, ...] = ()
            if source < 0:  # the context: a continuation that runs into its end repeats
                steps = [int(context[end + 1 + step % (length - 1 - end)]) for step in range(depth)]
            else:  # an earlier sequence: its continuation, as far as it goes
                steps = [int(t) for t in self.memory[source][end + 1: end + 1 + depth]]
            for token in steps:
                path = (*path, token)
                trie[path] = trie.get(path, 0) + 1
        children: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for path in trie:
            children.setdefault(path[:-1], []).append(path)
        # Best first by estimated probability; ties: more matches, then the latest match's
        # order of insertion (dicts keep it), so the result is deterministic.
        order = {path: i for i, path in enumerate(trie)}
        frontier = [(-trie[c] / len(ends), order[c], c, -1) for c in children.get((), [])]
        heapq.heapify(frontier)
        chosen: list[tuple[int, int]] = []
        while frontier and len(chosen) < nodes:
            score, _, path, parent = heapq.heappop(frontier)
            index = len(chosen)
            chosen.append((path[-1], parent))
            for child in children.get(path, []):
                heapq.heappush(frontier, (score * trie[child] / trie[path], order[child], child, index))
        return chosen


def _contexts(tokens: Array, lengths: Array) -> list[np.ndarray]:
    """Each row's committed ids on the host (one read of `tokens`): tokens int [B, C],
    lengths int [B] in [1, C]."""
    xp = namespace(tokens, lengths)
    check_shape("tokens", tokens, (None, None))
    check_shape("lengths", lengths, (int(tokens.shape[0]),))
    rows = np.asarray(host_ints(xp.reshape(xp.astype(tokens, xp.int64), (-1,)))).reshape(tokens.shape)
    contexts = []
    for b, length in enumerate(host_ints(lengths)):
        if not 1 <= length <= rows.shape[1]:
            raise ValueError(f"lengths: expected values in [1, {rows.shape[1]}], got {length}")
        contexts.append(rows[b, :length])
    return contexts


REMEMBER = 64  # sequences a "+memory" suffix tree keeps from earlier calls


def is_suffix_tree_name(name: object) -> bool:
    """Whether a drafter name asks for a suffix tree ("suffix-tree", "suffix-tree:...",
    optionally ending in "+memory"); `suffix_tree` then parses it."""
    if not isinstance(name, str):
        return False
    base = name.removesuffix("+memory")
    return base == "suffix-tree" or base.startswith("suffix-tree:")


def suffix_tree(name: str) -> SuffixTreeDrafter:
    """A SuffixTreeDrafter by name: "suffix-tree" (the defaults), "suffix-tree:N" (N nodes)
    or "suffix-tree:NxD" (N nodes, D levels); "+memory" at the end also matches the latest
    64 sequences of earlier calls (e.g. "suffix-tree:8x4+memory")."""
    base = name.removesuffix("+memory") if isinstance(name, str) else ""
    budget = base.removeprefix("suffix-tree").removeprefix(":")
    parts = budget.split("x") if budget else []
    if not is_suffix_tree_name(name) or len(parts) > 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"draft: expected 'suffix-tree', 'suffix-tree:N' or 'suffix-tree:NxD' with "
                         f"N, D ints >= 1, optionally ending in '+memory', got {name!r}")
    sizes = dict(zip(("nodes", "depth"), (int(p) for p in parts), strict=False))
    return SuffixTreeDrafter(**sizes, remember=REMEMBER if base != name else 0)
