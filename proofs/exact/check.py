"""Exact check that the implementation's `verify` and `verify_block` realise the proved law.

Speculative sampling is a deterministic function of its uniforms. For each
draft path, the implementation's decisions are constant on intervals of the
uniforms whose end points are exact rationals: u_i against p(x_i)/q(x_i) for
token-wise acceptance (eta_i against h_i for block verification, Sun et al.
2025), and the cumulative sums of every law the final token may come from.
This checker computes those end points with `fractions.Fraction`, calls the
implementation (the verifier and `specsample.sample`) once at the
midpoint of every cell, and weights each outcome by the exact length of its
cell. The result is the exact law the *code* emits (not a re-derivation of
the algorithm), composed across rounds, and it is compared with the target's
autoregressive law for context-dependent n-gram models.

Run: python proofs/exact/check.py  (exit status 0 when every case matches).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
from specsample_backends.reference import NGramModel, random_ngram

from specsample import sample, verify, verify_block
from specsample.drafters.model import confidence_lengths
from specsample.testing import autoregressive_law, block_thresholds

Law = dict[tuple[int, ...], Fraction]
LawFn = Callable[[tuple[int, ...]], list[Fraction]]


def _cells(points: Sequence[Fraction]) -> list[tuple[Fraction, Fraction]]:
    """The cells of [0, 1) cut at `points`: (start, end) with end > start."""
    cuts = sorted({Fraction(0), Fraction(1), *(x for x in points if 0 < x < 1)})
    return list(itertools.pairwise(cuts))


def _cdf_points(law: Sequence[Fraction]) -> list[Fraction]:
    total = sum(law)
    return [] if total == 0 else [x / total for x in itertools.accumulate(law)]


def _checked_draw(law: list[Fraction]) -> list[tuple[int, Fraction]]:
    """(token, probability) of drawing from `law`, asking `sample` on every CDF cell."""
    cells = _cells(_cdf_points(law))
    mids = np.array([float((a + b) / 2) for a, b in cells])
    probs = np.broadcast_to(np.array([float(x) for x in law]), (len(cells), len(law)))
    tokens = sample(probs, mids)
    out: dict[int, Fraction] = {}
    for (a, b), token in zip(cells, tokens, strict=True):
        out[int(token)] = out.get(int(token), Fraction(0)) + (b - a)
    return sorted(out.items())


Cuts = Callable[[list[list[Fraction]], list[list[Fraction]], Sequence[int], bool],
                tuple[list[list[Fraction]], list[Fraction]]]


def _one_hots(drafts: Sequence[int], vocab: int) -> list[list[Fraction]]:
    return [[Fraction(int(j == x)) for j in range(vocab)] for x in drafts]


def _excess(p: Sequence[Fraction], q: Sequence[Fraction], scale: Fraction = Fraction(1)) -> list[Fraction]:
    return [max(Fraction(0), scale * a - b) for a, b in zip(p, q, strict=True)]


def token_cuts(p_laws: list[list[Fraction]], q_laws: list[list[Fraction]], drafts: Sequence[int],
               deterministic: bool) -> tuple[list[list[Fraction]], list[Fraction]]:
    """Token-wise verification: u_i against p(x_i)/q(x_i); every p_n and residual CDF point."""
    q_used = _one_hots(drafts, len(p_laws[0])) if deterministic else q_laws
    accept = [[p_laws[i][x] / q_used[i][x]] for i, x in enumerate(drafts)]
    final: list[Fraction] = []
    for i, p in enumerate(p_laws):
        final += _cdf_points(p)
        if i < len(q_used):
            final += _cdf_points(_excess(p, q_used[i]))
    return accept, final


def block_cuts(p_laws: list[list[Fraction]], q_laws: list[list[Fraction]], drafts: Sequence[int],
               deterministic: bool) -> tuple[list[list[Fraction]], list[Fraction]]:
    """Block verification: eta_i against h_i and p_i; every P_{tau+1} and block residual CDF point."""
    q_used = _one_hots(drafts, len(p_laws[0])) if deterministic else q_laws
    weights, h = block_thresholds(p_laws, q_used, drafts)
    final: list[Fraction] = []
    for tau, p in enumerate(p_laws):
        final += _cdf_points(p)
        if tau < len(q_used):
            final += _cdf_points(_excess(p, q_used[tau], weights[tau - 1] if tau else Fraction(1)))
    return [[a, b] for a, b in zip(h, weights, strict=True)], final


def union(*rules: Cuts) -> Cuts:
    """Cells on which every rule in `rules` is constant."""
    def cuts(p_laws: list[list[Fraction]], q_laws: list[list[Fraction]], drafts: Sequence[int],
             deterministic: bool) -> tuple[list[list[Fraction]], list[Fraction]]:
        parts = [rule(p_laws, q_laws, drafts, deterministic) for rule in rules]
        accept = [[x for part in parts for x in part[0][i]] for i in range(len(drafts))]
        return accept, [x for part in parts for x in part[1]]

    return cuts


def one_hot_cuts(rule: Cuts) -> Cuts:
    """`rule`'s cells when the verifier treats every draft as deterministic (q = 1)."""
    return lambda p_laws, q_laws, drafts, _: rule(p_laws, q_laws, drafts, True)


def first(length: int, rule: Cuts) -> Cuts:
    """`rule`'s cells for a block of the first `length` drafts (the rest never decide)."""
    def cuts(p_laws: list[list[Fraction]], q_laws: list[list[Fraction]], drafts: Sequence[int],
             deterministic: bool) -> tuple[list[list[Fraction]], list[Fraction]]:
        accept, final = rule(p_laws[: length + 1], q_laws[:length], drafts[:length], deterministic)
        return accept + [[] for _ in drafts[length:]], final

    return cuts


def round_law(p: LawFn, q: LawFn, context: tuple[int, ...], *, k: int, vocab: int,
              verifier: Callable[..., object] = verify, deterministic: bool = False,
              cuts: Cuts = token_cuts) -> Law:
    """The exact law of one round's emitted tokens, as the implementation emits them.

    `cuts` gives the points where the verifier's decisions can change (per acceptance
    uniform, and for the final one); the verifier is called once inside every cell.
    """
    law: Law = {}
    paths: list[tuple[tuple[int, ...], Fraction, list[list[Fraction]]]] = [((), Fraction(1), [])]
    for _ in range(k):  # draft paths: tokens, their probability, the laws q they came from
        grown = []
        for drafts, weight, q_laws in paths:
            q_law = q(context + drafts)
            for token, mass in _checked_draw(q_law):
                grown.append(((*drafts, token), weight * mass, [*q_laws, q_law]))
        paths = grown
    for drafts, weight, q_laws in paths:
        p_laws = [p(context + drafts[:i]) for i in range(k + 1)]
        accept_points, final_points = cuts(p_laws, q_laws, drafts, deterministic)
        combos = list(itertools.product(*(_cells(points) for points in accept_points), _cells(final_points)))
        u = np.array([[float((a + b) / 2) for a, b in combo] for combo in combos])  # [rows, K+1]
        rows = len(combos)
        verdict = verifier(np.tile(np.array(drafts), (rows, 1)),
                           None if deterministic else np.broadcast_to(_floats(q_laws), (rows, k, vocab)),
                           np.broadcast_to(_floats(p_laws), (rows, k + 1, vocab)), u)
        for combo, tokens, n in zip(combos, verdict.tokens, verdict.num_accepted, strict=True):  # type: ignore[attr-defined]
            cell = weight
            for a, b in combo:
                cell *= b - a
            emitted = tuple(int(t) for t in tokens[: int(n) + 1])
            law[emitted] = law.get(emitted, Fraction(0)) + cell
    return law


def _floats(laws: list[list[Fraction]]) -> np.ndarray:
    return np.array([[float(x) for x in law] for law in laws])


def sequence_law(p: LawFn, q: LawFn, prefix: tuple[int, ...], *, k: int, vocab: int, length: int,
                 verifier: Callable[..., object] = verify, deterministic: bool = False,
                 rounds: dict[tuple[int, ...], Law] | None = None, cuts: Cuts = token_cuts) -> Law:
    """The exact law of the first `length` emitted tokens, composing rounds.

    `rounds` memoises the round law per context (pass {} to share it).
    """
    if length == 0:
        return {(): Fraction(1)}
    rounds = {} if rounds is None else rounds
    if prefix not in rounds:
        rounds[prefix] = round_law(p, q, prefix, k=k, vocab=vocab, verifier=verifier,
                                   deterministic=deterministic, cuts=cuts)
    out: Law = {}
    for emitted, weight in rounds[prefix].items():
        head = emitted[:length]
        rest = sequence_law(p, q, prefix + head, k=k, vocab=vocab, length=length - len(head),
                            verifier=verifier, deterministic=deterministic, rounds=rounds, cuts=cuts)
        for tail, w in rest.items():
            out[head + tail] = out.get(head + tail, Fraction(0)) + weight * w
    return {s: w for s, w in out.items() if w}


def argmax_law(model: NGramModel) -> LawFn:
    """A deterministic draft: the one-hot at the model's most likely next token."""
    def law(context: tuple[int, ...]) -> list[Fraction]:
        row = model.law(context)
        best = max(range(len(row)), key=lambda j: (row[j], -j))
        return [Fraction(int(j == best)) for j in range(len(row))]

    return law


PREFIX = (1, 0)
CASES = [  # (vocab, order, k, length, deterministic)
    (2, 2, 1, 3, False), (3, 2, 2, 4, False), (4, 1, 3, 4, False), (3, 2, 3, 5, False),
    (4, 2, 2, 4, True), (3, 2, 3, 5, True),
]


def models(vocab: int, order: int, deterministic: bool) -> tuple[LawFn, LawFn]:
    """The case's context-dependent target and draft laws (argmax draft when deterministic)."""
    target = random_ngram(vocab, order=order, seed=vocab * 10 + order, concentration=0.8, zeros=0.25)
    draft = random_ngram(vocab, order=order, seed=vocab * 10 + order + 1, concentration=0.8, zeros=0.25)
    return target.law, argmax_law(draft) if deterministic else draft.law


def check(vocab: int, order: int, k: int, length: int, deterministic: bool, *,
          verifier: Callable[..., object] = verify, cuts: Cuts = token_cuts) -> bool:
    """Whether the implementation's law equals the target's, for one case."""
    p, q = models(vocab, order, deterministic)
    got = sequence_law(p, q, PREFIX, k=k, vocab=vocab, length=length, verifier=verifier,
                       deterministic=deterministic, cuts=cuts)
    return got == autoregressive_law(p, PREFIX, length=length, vocab_size=vocab)


def expected_accepted(vocab: int, order: int, k: int, deterministic: bool, *,
                      verifier: Callable[..., object] = verify, cuts: Cuts = token_cuts) -> Fraction:
    """The exact expected number of accepted drafts in the case's first round, as implemented."""
    p, q = models(vocab, order, deterministic)
    law = round_law(p, q, PREFIX, k=k, vocab=vocab, verifier=verifier, deterministic=deterministic,
                    cuts=cuts)
    return sum((w * (len(tokens) - 1) for tokens, w in law.items()), Fraction(0))


Rule = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def stopping(rule: Rule, verifier: Callable[..., object] = verify) -> Callable[..., object]:
    """`verifier` with per-row draft lengths from `rule(drafts [R, K], q [R, K, V], p [R, K+1, V])`.

    Cells stay those of the full-K rule: a shorter block decides on a subset of the same
    points (its acceptances, and the p_n and residual CDFs it may draw from).
    """
    def run(drafts: np.ndarray, q: np.ndarray, p: np.ndarray, u: np.ndarray) -> object:
        return verifier(drafts, q, p, u, draft_lengths=rule(drafts, q, p))

    return run


def _confidence(drafts: np.ndarray, q: np.ndarray) -> np.ndarray:
    """q(x_i) for each draft: the toy draft's law is its temperature-1 softmax, which is what
    `ModelDrafter` reads as confidence."""
    return np.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]


def confidence_rule(threshold: float) -> Rule:
    """The implementation's rule (`confidence_lengths`): keep drafts up to the first one below
    `threshold`, that one included: a stopping time of the draft process."""
    return lambda drafts, q, p: confidence_lengths(_confidence(drafts, q), threshold)


def dropping_rule(threshold: float) -> Rule:
    """Broken: stop *before* the first draft below `threshold` (the decision reads a draft
    that is then thrown away, so the kept drafts no longer follow q)."""
    def rule(drafts: np.ndarray, q: np.ndarray, p: np.ndarray) -> np.ndarray:
        conf = _confidence(drafts, q)
        return np.where((conf < threshold).any(axis=1), confidence_lengths(conf, threshold) - 1,
                        drafts.shape[1])

    return rule


def peeking_rule(drafts: np.ndarray, q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Broken: drop every draft from the first one the target likes less than the draft,
    p(x_i) < q(x_i) (the length reads the target)."""
    p_x = np.take_along_axis(p[:, :-1], drafts[..., None], axis=-1)[..., 0]
    worse = p_x < _confidence(drafts, q)
    slots = np.arange(drafts.shape[1])[None, :]
    return np.where(worse, slots, drafts.shape[1]).min(axis=1)


THRESHOLD = 0.45  # splits the toy drafts' probabilities: rounds stop after 1, 2 or 3 drafts

RULES: dict[str, tuple[Callable[..., object], Cuts]] = {
    "token": (verify, token_cuts), "block": (verify_block, block_cuts),
    "token, confidence threshold": (stopping(confidence_rule(THRESHOLD)), token_cuts),
    "block, confidence threshold": (stopping(confidence_rule(THRESHOLD), verify_block), block_cuts)}


def main() -> int:
    ok = True
    for name, (verifier, cuts) in RULES.items():
        for case in CASES:
            if "threshold" in name and case[4]:
                continue  # one-hot drafts are always confident: nothing stops
            passed = check(*case, verifier=verifier, cuts=cuts)
            ok &= passed
            vocab, order, k, length, det = case
            print(f"{name}: V={vocab} order={order} K={k} first {length} tokens "
                  f"{'deterministic' if det else 'stochastic'} draft: {'exact' if passed else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
