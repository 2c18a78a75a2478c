"""Exact laws (fractions.Fraction) of speculative sampling, by enumerating every branch.

A round (Leviathan et al. 2023, Algorithm 1; block verification, Sun et al. 2025, is the
alternative rule `verifier="block"`): the draft samples d_1..d_K autoregressively
from q; draft token d_i is accepted with probability min(1, p(d_i) / q(d_i)) if every earlier
one was; on the first rejection, with n tokens accepted, one token is drawn from the
normalised residual max(0, p_n - q_n) (from p_n if the residual has no mass); if all K are
accepted, a bonus token is drawn from p_K. The emitted tokens should follow p's
autoregressive law; these functions give both sides exactly, to compare.
"""

from __future__ import annotations

import itertools
import math
import numbers
import operator
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction

from specsample._array import check_int
from specsample.core.metrics import expected_tokens_per_round as tokens_per_round

__all__ = ["accepted_length_law", "autoregressive_law", "block_thresholds", "exact_round_law",
           "exact_sequence_law", "expected_tokens_per_round"]

Prob = Fraction | int | float
DistFn = Callable[[tuple[int, ...]], Iterable[Prob]]
Law = dict[tuple[int, ...], Fraction]
RULES = ("token", "block")


def _fraction(value: object, where: str) -> Fraction:
    """`value` as an exact Fraction (floats convert exactly)."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Rational, float)):
        raise TypeError(f"{where}: expected Fractions, ints or floats, got {type(value).__name__}")
    try:
        return Fraction(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{where}: expected finite probabilities, got {value!r}") from None


class _Model:
    """A distribution callable whose outputs are checked and memoised, per context."""

    def __init__(self, fn: DistFn, name: str, vocab_size: int, *, one_hot: bool = False):
        self._fn, self._name, self._vocab_size, self._one_hot = fn, name, vocab_size, one_hot
        self._memo: dict[tuple[int, ...], tuple[Fraction, ...]] = {}

    def __call__(self, context: tuple[int, ...]) -> tuple[Fraction, ...]:
        """The checked distribution [V] at `context`."""
        if context not in self._memo:
            self._memo[context] = self._check(context, self._fn(context))
        return self._memo[context]

    def _check(self, context: tuple[int, ...], raw: Iterable[Prob]) -> tuple[Fraction, ...]:
        where = f"{self._name}(context={context})"
        dist = tuple(_fraction(v, where) for v in raw)
        if len(dist) != self._vocab_size:
            raise ValueError(f"{where}: expected {self._vocab_size} probabilities, got {len(dist)}")
        if min(dist) < 0:
            raise ValueError(f"{where}: expected non-negative probabilities, got {min(dist)}")
        if sum(dist) != 1:
            raise ValueError(f"{where}: expected probabilities summing exactly to 1, "
                             f"got {sum(dist)}")
        if self._one_hot and max(dist) != 1:
            raise ValueError(f"{where}: expected a one-hot distribution (deterministic=True), "
                             f"got max {max(dist)}")
        return dist


def _add(law: Law, tokens: tuple[int, ...], weight: Fraction) -> None:
    if weight:
        law[tokens] = law.get(tokens, Fraction(0)) + weight


def _residual(p_n: Sequence[Fraction], q_n: Sequence[Fraction],
              fallback: Sequence[Fraction] | None = None) -> tuple[Fraction, ...]:
    """norm(max(0, p_n - q_n)); `fallback` (default p_n) when that has no mass (p_n == q_n)."""
    excess = tuple(max(Fraction(0), a - b) for a, b in zip(p_n, q_n, strict=True))
    mass = sum(excess)
    return tuple(e / mass for e in excess) if mass else tuple(p_n if fallback is None else fallback)


def _round_from(p: _Model, q: _Model, context: tuple[int, ...], drafts_left: int) -> Law:
    """Law of the tokens a round still emits once the tokens in `context` are accepted."""
    p_n = p(context)
    if drafts_left == 0:  # all K accepted: the bonus token comes from p_K
        return {(t,): w for t, w in enumerate(p_n) if w}
    q_n = q(context)
    residual = _residual(p_n, q_n)
    law: Law = {}
    for d, q_d in enumerate(q_n):
        if not q_d:
            continue
        accept = min(Fraction(1), p_n[d] / q_d)  # Leviathan: accept d with min(1, p(d)/q(d))
        if accept:
            for tail, w in _round_from(p, q, (*context, d), drafts_left - 1).items():
                _add(law, (d, *tail), q_d * accept * w)
        for t, r in enumerate(residual):  # rejected: the final token from the residual
            _add(law, (t,), q_d * (1 - accept) * r)
    return law


def block_thresholds(p_laws: Sequence[Sequence[Fraction]], q_laws: Sequence[Sequence[Fraction]],
                     drafts: Sequence[int]) -> tuple[list[Fraction], list[Fraction]]:
    """Block verification's weights p_1..p_K and thresholds h_1..h_K for one draft path.

    Sun et al. (2025), Algorithm 2: p_i = min(1, p_{i-1} P_i(x_i) / Q_i(x_i)),
    h_i = Z_{i+1} / (Z_{i+1} + 1 - p_i) with Z_{i+1} = sum_y max(p_i P_{i+1}(y) - Q_{i+1}(y), 0)
    for i < K, h_K = p_K. `p_laws` holds P_1..P_{K+1}, `q_laws` Q_1..Q_K. A 0/0 threshold
    (p_i = 1, P_{i+1} = Q_{i+1}) is 0, as the strict implementation reads it; any value
    gives the same law there.
    """
    weights: list[Fraction] = []
    weight = Fraction(1)
    for i, x in enumerate(drafts):
        mass = weight * p_laws[i][x]
        weight = Fraction(1) if mass >= q_laws[i][x] else mass / q_laws[i][x]
        weights.append(weight)
    thresholds = []
    for i, w in enumerate(weights[:-1]):
        z = sum((max(Fraction(0), w * a - b) for a, b in zip(p_laws[i + 1], q_laws[i + 1], strict=True)),
                Fraction(0))
        thresholds.append(z / (z + 1 - w) if z + 1 - w else Fraction(0))
    return weights, [*thresholds, *weights[-1:]]


def _block_round_from(p: _Model, q: _Model, context: tuple[int, ...], k: int) -> Law:
    """Law of the tokens one block-verification round emits after `context`."""
    law: Law = {}
    for drafts in itertools.product(range(len(p(context))), repeat=k):
        q_laws = [q(context + drafts[:i]) for i in range(k)]
        weight = math.prod((q_laws[i][x] for i, x in enumerate(drafts)), start=Fraction(1))
        if not weight:
            continue
        p_laws = [p(context + drafts[:i]) for i in range(k + 1)]
        weights, h = block_thresholds(p_laws, q_laws, drafts)
        stop_above = Fraction(1)  # P(eta_j >= h_j for every j > tau)
        for tau in range(k, -1, -1):
            chance = stop_above * (h[tau - 1] if tau else Fraction(1))  # P(this tau | drafts)
            stop_above *= 1 - h[tau - 1] if tau else 1
            if tau == k:
                final = p_laws[k]
            else:
                prior = weights[tau - 1] if tau else Fraction(1)
                final = _residual(tuple(prior * a for a in p_laws[tau]), q_laws[tau], p_laws[tau])
            for t, r in enumerate(final):
                _add(law, (*drafts[:tau], t), weight * chance * r)
    return law


def _one_round(p: _Model, q: _Model, context: tuple[int, ...], k: int, verifier: str) -> Law:
    return _block_round_from(p, q, context, k) if verifier == "block" else _round_from(p, q, context, k)


def _sequence_from(p: _Model, q: _Model, context: tuple[int, ...], k: int, length: int,
                   verifier: str = "token") -> Law:
    """Law of the first `length` tokens emitted by rounds run one after another from `context`."""
    law: Law = {}
    for emitted, w in _one_round(p, q, context, k, verifier).items():
        if len(emitted) >= length:
            _add(law, emitted[:length], w)
            continue
        rest = _sequence_from(p, q, context + emitted, k, length - len(emitted), verifier)
        for tail, w_tail in rest.items():
            _add(law, emitted + tail, w * w_tail)
    return law


def _autoregressive_from(p: _Model, context: tuple[int, ...], length: int) -> Law:
    """Law of `length` tokens sampled one at a time from p after `context`."""
    if length == 0:
        return {(): Fraction(1)}
    law: Law = {}
    for t, w in enumerate(p(context)):
        if w:
            for tail, w_tail in _autoregressive_from(p, (*context, t), length - 1).items():
                _add(law, (t, *tail), w * w_tail)
    return law


def _prefix(prefix: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(operator.index(t) for t in prefix)
    except TypeError:
        raise TypeError(f"prefix: expected a sequence of token ids (ints), "
                        f"got {[type(t).__name__ for t in prefix]}") from None


def _models(p: DistFn, q: DistFn, vocab_size: int, deterministic: bool) -> tuple[_Model, _Model]:
    vocab_size = check_int("vocab_size", vocab_size, 1)
    return _Model(p, "p", vocab_size), _Model(q, "q", vocab_size, one_hot=deterministic)


def _rule(verifier: str) -> str:
    if verifier not in RULES:
        raise ValueError(f"verifier: expected one of {', '.join(RULES)}, got {verifier!r}")
    return verifier


def exact_round_law(p: DistFn, q: DistFn, prefix: Sequence[int], *, k: int, vocab_size: int,
                    deterministic: bool = False, verifier: str = "token") -> Law:
    """The exact law of the tokens one speculative round emits after `prefix`.

    Args:
        p: target: context (tuple of token ids) -> V probabilities (Fractions, ints or floats,
            converted exactly; they must sum exactly to 1).
        q: draft, the same way; with `deterministic`, it must return one-hots.
        prefix: the tokens before the round.
        k: draft tokens per round, >= 1.
        vocab_size: V, >= 1.
        deterministic: the draft is deterministic (one-hot q).
        verifier: "token" (Leviathan et al. 2023) or "block" (Sun et al. 2025).

    Returns:
        {emitted tokens (n accepted, then the final one; length 1..k+1): probability > 0}.
    """
    models = _models(p, q, vocab_size, deterministic)
    return _one_round(*models, _prefix(prefix), check_int("k", k, 1), _rule(verifier))


def exact_sequence_law(p: DistFn, q: DistFn, prefix: Sequence[int], *, k: int, vocab_size: int,
                       length: int, deterministic: bool = False, verifier: str = "token") -> Law:
    """The exact law of the first `length` tokens emitted by consecutive speculative rounds.

    Each round starts from the prefix plus everything emitted so far; the output is truncated
    to `length` tokens, so bonus tokens and round boundaries are covered.

    Args:
        p: target, as in `exact_round_law`.
        q: draft, as in `exact_round_law`.
        prefix: the tokens before the first round.
        k: draft tokens per round, >= 1.
        vocab_size: V, >= 1.
        length: tokens to keep, >= 1.
        deterministic: the draft is deterministic (one-hot q).
        verifier: "token" or "block", as in `exact_round_law`.

    Returns:
        {tokens (length `length`): probability > 0}.
    """
    models = _models(p, q, vocab_size, deterministic)
    return _sequence_from(*models, _prefix(prefix), check_int("k", k, 1),
                          check_int("length", length, 1), _rule(verifier))


def autoregressive_law(p: DistFn, prefix: Sequence[int], *, length: int,
                       vocab_size: int) -> Law:
    """The exact law of `length` tokens sampled one at a time from p after `prefix`.

    Args:
        p: target, as in `exact_round_law`.
        prefix: the tokens before the first sampled one.
        length: tokens to sample, >= 1.
        vocab_size: V, >= 1.

    Returns:
        {tokens (length `length`): probability > 0}.
    """
    model = _Model(p, "p", check_int("vocab_size", vocab_size, 1))
    return _autoregressive_from(model, _prefix(prefix), check_int("length", length, 1))


def _acceptance(alpha: Prob) -> Fraction:
    rate = _fraction(alpha, "alpha")
    if not 0 <= rate <= 1:
        raise ValueError(f"alpha: expected an acceptance rate in [0, 1], got {rate}")
    return rate


def accepted_length_law(alpha: Prob, k: int) -> list[Fraction]:
    """The law of the number of accepted drafts when each is accepted with probability alpha.

    For context-free p, q, alpha = sum_x min(p(x), q(x)) (Leviathan et al., Definition 3.1).

    Args:
        alpha: acceptance rate in [0, 1] (converted exactly).
        k: draft tokens per round, >= 1.

    Returns:
        [P(n = 0), ..., P(n = k)]: alpha^i (1 - alpha) for i < k, alpha^k for i = k.
    """
    rate, k = _acceptance(alpha), check_int("k", k, 1)
    return [rate**i * (1 - rate) for i in range(k)] + [rate**k]


def expected_tokens_per_round(alpha: Prob, k: int) -> Fraction:
    """Expected tokens emitted per round (Leviathan et al., Equation 1).

    Args:
        alpha: acceptance rate in [0, 1] (converted exactly).
        k: draft tokens per round, >= 1.

    Returns:
        (1 - alpha^(k+1)) / (1 - alpha), or k + 1 when alpha = 1.
    """
    return tokens_per_round(_acceptance(alpha), check_int("k", k, 1))
