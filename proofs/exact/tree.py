"""Exact check that the implementation's `verify_tree` realises the target's law.

As in check.py, the code is a deterministic function of its uniforms and its decisions
are constant on cells of the uniforms whose end points are exact rationals. For a tree
verification those end points depend on the walk so far (the residual when a node is
tried), so the cells are enumerated along the walk: at each tried node, accept below
min(1, R(x) / Q(x)) and reject above, with R the residual of the proved rule (a node
not tried takes any uniform: 1/2); at the end, the CDF points of the residual. The
implementation is called once at the midpoint of every cell and each outcome is
weighted by the cell's exact length. A rule that decides elsewhere (a wrong residual,
a wrong ratio) emits other tokens on whole cells, and the law differs.

Tree drafts, per round, from the context c at the root:
- stochastic: each node's children are drawn i.i.d. (with replacement) from the draft
  law q(. | c + the path to the node), every assignment enumerated with its weight;
- deterministic: the j-th child of a node is the draft law's j-th most likely token
  there (distinct siblings, no randomness);
- grown by the draft's confidence: the implementation's `grow_tree` builds each round's
  tree from the draft laws after the round's context (its shape changes with the context),
  verified as deterministic candidates. The negative control grows the same tree but puts
  the token the target will draw with the round's final uniform first below the root (a
  tree that peeks at the target): the final uniform's cells are then cut at the target's
  CDF, each piece with its own tree, and the law must differ;
- grown and sized by a `RatedBudget` (levels and node count rated against a verify cost per
  width): trees of different sizes after different contexts, none at all after some (the
  round is then a plain step: the target's draw at the final uniform).

Run: python proofs/exact/tree.py  (exit status 0 when every case matches).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
from specsample_backends.reference import random_ngram

from specsample import verify_tree
from specsample.core.metrics import Costs
from specsample.core.sample import sample
from specsample.drafters.confidence import RatedBudget, grow_tree, node_path
from specsample.testing import autoregressive_law

Law = dict[tuple[int, ...], Fraction]
LawFn = Callable[[tuple[int, ...]], list[Fraction]]
Verifier = Callable[..., object]

# Tree shapes: parents (-1 the root), siblings in order. Depth <= 3, branching <= 2.
SHAPES: dict[str, tuple[int, ...]] = {
    "fork": (-1, -1),
    "fork, then chains": (-1, -1, 0, 1),
    "binary, depth 2": (-1, -1, 0, 0, 1),
    "chain of 3 with a side branch": (-1, 0, 0, 1),
}


def _cells(points: Sequence[Fraction]) -> list[tuple[Fraction, Fraction]]:
    cuts = sorted({Fraction(0), Fraction(1), *(x for x in points if 0 < x < 1)})
    return list(itertools.pairwise(cuts))


def _paths(parents: Sequence[int]) -> list[tuple[int, ...]]:
    """Node i's ancestors, root side first, i itself last."""
    out: list[tuple[int, ...]] = []
    for parent in parents:
        out.append(((*out[parent],) if parent >= 0 else ()) + (len(out),))
    return out


def _trees(q: LawFn, context: tuple[int, ...], parents: Sequence[int], deterministic: bool
           ) -> list[tuple[tuple[int, ...], Fraction]]:
    """(node tokens, probability) of every draft tree below `context`."""
    paths = _paths(parents)
    trees: list[tuple[tuple[int, ...], Fraction]] = [((), Fraction(1))]
    for i, parent in enumerate(parents):
        grown = []
        for tokens, weight in trees:
            law = q(context + tuple(tokens[j] for j in paths[i][:-1]))
            if deterministic:
                rank = sum(1 for j in range(i) if parents[j] == parent)
                order = sorted(range(len(law)), key=lambda t: (-law[t], t))
                grown.append(((*tokens, order[rank % len(order)]), weight))
            else:
                grown += [((*tokens, t), weight * w) for t, w in enumerate(law) if w]
        trees = grown
    return trees


# A round's tree: (tokens, parents, the final uniform's interval it is drawn on); a Grower
# gives a context's trees.
Grown = tuple[tuple[int, ...], tuple[int, ...], tuple[Fraction, Fraction]]
Grower = Callable[[tuple[int, ...]], list[Grown]]


def grown(q: LawFn, *, nodes: int, depth: int, branch: int, budget: RatedBudget | None = None) -> Grower:
    """The implementation's confidence-grown tree after each context (one tree, every uniform),
    sized by `budget` where one is given."""

    def grow(context: tuple[int, ...]) -> list[Grown]:
        def expand(fed: np.ndarray, parents: np.ndarray) -> np.ndarray:
            return np.array([[[float(x) for x in q(context + node_path(fed, parents, 0, i))]
                              for i in range(fed.shape[1])]])

        root = np.array([[float(x) for x in q(context)]])
        tree = grow_tree(root, expand, nodes=nodes, depth=depth, branch=branch, budget=budget)
        size = int(tree.sizes[0])
        tokens = tuple(int(t) for t in tree.tokens[0, :size])
        return [(tokens, tuple(int(a) for a in tree.parents[0, :size]), (Fraction(0), Fraction(1)))]

    return grow


def peeking(grow: Grower, p: LawFn, *, peek: bool = True) -> Grower:
    """`grow`'s tree with the token the target draws with the final uniform (inverse CDF of
    p after the context) as the root's first child: a growth that reads the target. The
    final uniform is cut at p's CDF, one tree per piece. With `peek=False` every piece keeps
    `grow`'s own tree (the cutting alone, which changes nothing)."""

    def split(context: tuple[int, ...]) -> list[Grown]:
        out = []
        cdf = [Fraction(0), *itertools.accumulate(p(context))]
        for (tokens, parents, _), y in itertools.product(grow(context), range(len(cdf) - 1)):
            if cdf[y + 1] > cdf[y]:
                tree = ((y, *tokens), (-1, *(a + 1 if a >= 0 else -1 for a in parents))) if peek \
                    else (tokens, parents)
                out.append((*tree, (cdf[y], cdf[y + 1])))
        return out

    return split


def _walks(p_laws: list[list[Fraction]], q_laws: list[list[Fraction]], tokens: Sequence[int],
           parents: Sequence[int], final: tuple[Fraction, Fraction] = (Fraction(0), Fraction(1))
           ) -> list[tuple[list[Fraction], Fraction]]:
    """(uniforms at cell midpoints [N+1], cell length) along the proved rule's walk, the final
    uniform within `final`."""
    nodes, vocab = len(tokens), len(p_laws[0])
    out: list[tuple[list[Fraction], Fraction]] = []

    def walk(i: int, current: int, residual: list[Fraction], u: list[Fraction], weight: Fraction) -> None:
        if i == nodes:
            total = sum(residual)
            cdf = [x / total for x in itertools.accumulate(residual)]
            for a, b in _cells([*cdf, *final]):
                if final[0] <= a and b <= final[1]:
                    out.append(([*u, (a + b) / 2], weight * (b - a)))
            return
        if parents[i] != current:
            walk(i + 1, current, residual, [*u, Fraction(1, 2)], weight)
            return
        x, q = tokens[i], q_laws[i]
        cut = min(Fraction(1), residual[x] / (sum(residual) * q[x]))
        if cut > 0:
            walk(i + 1, i, p_laws[i + 1], [*u, cut / 2], weight * cut)
        if cut < 1:
            left = [max(Fraction(0), r - sum(residual) * b) for r, b in zip(residual, q, strict=True)]
            walk(i + 1, current, left, [*u, (1 + cut) / 2], weight * (1 - cut))

    walk(0, -1, p_laws[0], [], Fraction(1))
    assert all(len(u) == nodes + 1 for u, _ in out) and vocab
    return out


def round_law(p: LawFn, q: LawFn, context: tuple[int, ...], parents: Sequence[int] | Grower, *,
              vocab: int, deterministic: bool, verifier: Verifier = verify_tree, one_hot: bool = False
              ) -> Law:
    """The exact law of one tree round's emitted tokens, as `verifier` emits them.

    `parents`: a fixed shape, or a Grower (the round's deterministic trees after the context).
    `one_hot`: pass draft_probs=None for stochastic trees (the verifier then treats the
    sampled nodes as deterministic candidates).
    """
    if callable(parents):
        law: Law = {}
        for tokens, shape, final in parents(context):
            if not tokens:  # no tree: a plain step, the target's draw at the final uniform
                _plain(law, p(context), final)
                continue
            p_laws = [p(context)] + [p(context + tuple(tokens[j] for j in path)) for path in _paths(shape)]
            q_laws = [[Fraction(int(t == x)) for t in range(vocab)] for x in tokens]
            _emit(law, verifier, tokens, shape, p_laws, _walks(p_laws, q_laws, tokens, shape, final),
                  Fraction(1), vocab)
        return law
    paths = _paths(parents)
    law = {}
    for tokens, weight in _trees(q, context, parents, deterministic):
        before = [context + tuple(tokens[j] for j in path[:-1]) for path in paths]
        p_laws = [p(context)] + [p(context + tuple(tokens[j] for j in path)) for path in paths]
        q_laws = [q(c) for c in before]
        if deterministic or one_hot:
            q_laws = [[Fraction(int(t == x)) for t in range(vocab)] for x in tokens]
        walks = _walks(p_laws, q_laws, tokens, parents)
        q_given = None if deterministic or one_hot else q_laws
        _emit(law, verifier, tokens, parents, p_laws, walks, weight, vocab, q_given)
    return law


def _plain(law: Law, p_law: list[Fraction], final: tuple[Fraction, Fraction]) -> None:
    """Add a plain step's law to `law`: the implementation's `sample` at the midpoint of each
    cell of the final uniform's interval `final` cut at p's CDF, weighted by its length."""
    cdf = [Fraction(0), *itertools.accumulate(p_law)]
    for a, b in itertools.pairwise(cdf):
        lo, hi = max(a, final[0]), min(b, final[1])
        if hi > lo:
            token = int(sample(np.array([[float(x) for x in p_law]]), np.array([float((lo + hi) / 2)]))[0])
            law[(token,)] = law.get((token,), Fraction(0)) + hi - lo


def _emit(law: Law, verifier: Verifier, tokens: Sequence[int], parents: Sequence[int],
          p_laws: list[list[Fraction]], walks: list[tuple[list[Fraction], Fraction]], weight: Fraction,
          vocab: int, q_laws: list[list[Fraction]] | None = None) -> None:
    """Call `verifier` once per cell of `walks` and add each emitted sequence's weight to `law`."""
    rows = len(walks)
    q_given = None if q_laws is None else np.broadcast_to(_floats(q_laws), (rows, len(tokens), vocab))
    verdict = verifier(
        np.tile(np.array(tokens), (rows, 1)), np.array(parents), q_given,
        np.broadcast_to(_floats(p_laws), (rows, len(tokens) + 1, vocab)),
        np.array([[float(x) for x in u] for u, _ in walks]))
    for (_, cell), out, n in zip(walks, verdict.tokens, verdict.num_accepted, strict=True):  # type: ignore[attr-defined]
        emitted = tuple(int(t) for t in out[: int(n) + 1])
        law[emitted] = law.get(emitted, Fraction(0)) + weight * cell


def _floats(laws: list[list[Fraction]]) -> np.ndarray:
    return np.array([[float(x) for x in law] for law in laws])


def sequence_law(p: LawFn, q: LawFn, prefix: tuple[int, ...], parents: Sequence[int] | Grower, *, vocab: int,
                 length: int, deterministic: bool, rounds: dict[tuple[int, ...], Law] | None = None,
                 **kwargs: object) -> Law:
    """The exact law of the first `length` emitted tokens, composing tree rounds."""
    if length == 0:
        return {(): Fraction(1)}
    rounds = {} if rounds is None else rounds
    if prefix not in rounds:
        rounds[prefix] = round_law(p, q, prefix, parents, vocab=vocab, deterministic=deterministic,
                                   **kwargs)  # type: ignore[arg-type]
    out: Law = {}
    for emitted, weight in rounds[prefix].items():
        head = emitted[:length]
        rest = sequence_law(p, q, prefix + head, parents, vocab=vocab, length=length - len(head),
                            deterministic=deterministic, rounds=rounds, **kwargs)
        for tail, w in rest.items():
            out[head + tail] = out.get(head + tail, Fraction(0)) + weight * w
    return {s: w for s, w in out.items() if w}


PREFIX = (1, 0)
CASES = [  # (shape, vocab, order, length, deterministic): lengths cover at least two rounds
    ("fork", 3, 2, 3, False), ("fork", 4, 2, 3, True),
    ("fork, then chains", 3, 2, 4, False), ("fork, then chains", 4, 2, 4, True),
    ("binary, depth 2", 3, 1, 4, False), ("binary, depth 2", 3, 2, 4, True),
    ("chain of 3 with a side branch", 2, 2, 5, False), ("chain of 3 with a side branch", 4, 2, 5, True),
]


def models(vocab: int, order: int) -> tuple[LawFn, LawFn]:
    """The case's context-dependent target and draft laws (with zeros)."""
    target = random_ngram(vocab, order=order, seed=vocab * 10 + order, concentration=0.8, zeros=0.25)
    draft = random_ngram(vocab, order=order, seed=vocab * 10 + order + 1, concentration=0.8, zeros=0.25)
    return target.law, draft.law


def check(shape: str, vocab: int, order: int, length: int, deterministic: bool, **kwargs: object) -> bool:
    """Whether the implementation's law equals the target's, for one case."""
    p, q = models(vocab, order)
    got = sequence_law(p, q, PREFIX, SHAPES[shape], vocab=vocab, length=length,
                       deterministic=deterministic, **kwargs)
    return got == autoregressive_law(p, PREFIX, length=length, vocab_size=vocab)


GROWN_CASES = [  # (nodes, depth, branch, vocab, order, length)
    (3, 2, 2, 3, 2, 3), (4, 3, 2, 4, 2, 4), (5, 3, 3, 4, 1, 4),
]


# A budget whose rating keeps trees of several sizes and shapes, and none after some contexts:
# a verify whose second position costs a whole forward and each further one a fifth of one,
# the draft's confidence taken at face value (kappa 1).
RATED = RatedBudget(costs=Costs(c=0.15, width=lambda batch, positions: 1.0 if positions == 1 else
                                1.8 + 0.2 * positions))
RATED_CASES = [  # (nodes, depth, branch, vocab, order, length)
    (4, 3, 2, 3, 2, 4), (5, 3, 2, 4, 1, 4),
]


def check_grown(nodes: int, depth: int, branch: int, vocab: int, order: int, length: int, *,
                peek: bool | None = None, budget: RatedBudget | None = None, **kwargs: object) -> bool:
    """Whether confidence-grown trees (`grow_tree` on the draft's laws) keep the target's law;
    with `peek` (see `peeking`), trees that also hold what the target will draw (True) or
    the same trees with the final uniform cut at the target's CDF (False)."""
    p, q = models(vocab, order)
    grow = grown(q, nodes=nodes, depth=depth, branch=branch, budget=budget)
    got = sequence_law(p, q, PREFIX, grow if peek is None else peeking(grow, p, peek=peek), vocab=vocab,
                       length=length, deterministic=True, **kwargs)
    return got == autoregressive_law(p, PREFIX, length=length, vocab_size=vocab)


def main() -> int:
    ok = True
    for case in CASES:
        passed = check(*case)
        ok &= passed
        shape, vocab, order, length, det = case
        kind = "deterministic" if det else "stochastic i.i.d."
        print(f"tree ({shape}): V={vocab} order={order} first {length} tokens {kind} siblings: "
              f"{'exact' if passed else 'MISMATCH'}")
    for case in GROWN_CASES:
        passed = check_grown(*case)
        ok &= passed
        nodes, depth, branch, vocab, order, length = case
        print(f"tree grown by the draft's confidence ({nodes} nodes, depth {depth}, branch {branch}): "
              f"V={vocab} order={order} first {length} tokens: {'exact' if passed else 'MISMATCH'}")
    for case in RATED_CASES:
        passed = check_grown(*case, budget=RATED)
        ok &= passed
        nodes, depth, branch, vocab, order, length = case
        print(f"tree grown and sized by a rated budget (at most {nodes} nodes, depth {depth}, branch "
              f"{branch}): V={vocab} order={order} first {length} tokens: "
              f"{'exact' if passed else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
