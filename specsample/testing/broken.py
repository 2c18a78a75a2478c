"""Known-wrong speculative samplers: negative controls that a sound test must reject.

Each is a drop-in for `specsample.verify` (same signature) or wraps a drafter.
They exist so that users (and our own suite) can show their statistical
checks bite: `goodness_of_fit` must fail on every one of them except
`never_accept`, which is slow but exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from specsample._array import Array, namespace
from specsample.core.params import SamplingParams
from specsample.core.protocols import Model
from specsample.core.sample import sample
from specsample.core.verifiers import register_tree_rule
from specsample.core.verify import Verdict, assemble, final_token, num_accepted, token_probs, verify
from specsample.core.verify_block import (
    block_accepted,
    block_final_token,
    block_weights,
    draft_laws,
    last_passed,
)
from specsample.core.verify_tree import TreeVerdict, check_parents, tree_depth, tree_walk
from specsample.core.warp import warp
from specsample.drafters.model import ModelDrafter, confidence_lengths

__all__ = ["DRAFTERS", "LOOKAHEAD", "TREE_VERIFIERS", "VERIFIERS", "DroppingDrafter", "MisreportingDrafter",
           "accept_if_le",
           "always_accept", "argmax_draft_softmax_q", "block_q_one", "block_without_correction",
           "bonus_from_wrong_position", "lenient", "never_accept", "p_shifted", "raw_logits_q",
           "resample_from_p", "temperature_in_verify_only", "tree_q_one", "tree_without_residual",
           "with_draft_lengths"]


def resample_from_p(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
                    uniforms: Array, *, check: bool = True) -> Verdict:
    """After a rejection, sample from p instead of the residual max(0, p - q)."""
    xp = namespace(target_probs)
    k = int(draft_tokens.shape[1])
    p_x, q_x = token_probs(draft_tokens, draft_probs, target_probs)
    n = num_accepted(uniforms[:, :k] * q_x < p_x)
    zeros = xp.zeros_like(target_probs[:, :k, :])
    return assemble(draft_tokens, n, final_token(draft_tokens, zeros, target_probs, n, uniforms[:, k]))


def _with_count(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
                uniforms: Array, n: Array) -> Verdict:
    k = int(draft_tokens.shape[1])
    return assemble(draft_tokens, n, final_token(draft_tokens, draft_probs, target_probs, n,
                                                 uniforms[:, k]))


def always_accept(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
                  uniforms: Array, *, check: bool = True) -> Verdict:
    """Accept every draft, then the bonus token."""
    xp = namespace(draft_tokens)
    n = xp.full((draft_tokens.shape[0],), draft_tokens.shape[1], dtype=xp.int64)
    return _with_count(draft_tokens, draft_probs, target_probs, uniforms, n)


def never_accept(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
                 uniforms: Array, *, check: bool = True) -> Verdict:
    """Reject the first draft always: exact but slow (the control that must PASS).

    Rejecting with certainty is only exact if the correction is drawn from p_0
    itself, so the first token is sampled from p_0.
    """
    xp = namespace(draft_tokens)
    n = xp.zeros((draft_tokens.shape[0],), dtype=xp.int64)
    k = int(draft_tokens.shape[1])
    return assemble(draft_tokens, n, sample(target_probs[:, 0, :], uniforms[:, k], check=False))


def bonus_from_wrong_position(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
                              uniforms: Array, *, check: bool = True) -> Verdict:
    """Draw the bonus token from p_{K-1} instead of p_K."""
    xp = namespace(target_probs)
    k = int(draft_tokens.shape[1])
    shifted = xp.concat([target_probs[:, :k, :], target_probs[:, k - 1 : k, :]], axis=1)
    p_x, q_x = token_probs(draft_tokens, draft_probs, target_probs)
    n = num_accepted(uniforms[:, :k] * q_x < p_x)
    return _with_count(draft_tokens, draft_probs, shifted, uniforms, n)


def p_shifted(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
              uniforms: Array, *, check: bool = True) -> Verdict:
    """Off by one: use the target's law of position i + 1 at position i."""
    xp = namespace(target_probs)
    shifted = xp.concat([target_probs[:, 1:, :], target_probs[:, -1:, :]], axis=1)
    return verify(draft_tokens, draft_probs, shifted, uniforms, check=check)


def accept_if_le(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
                 uniforms: Array, *, check: bool = True) -> Verdict:
    """Accept iff u * q(x) <= p(x): at u = 0 it accepts a token with p(x) = 0."""
    k = int(draft_tokens.shape[1])
    p_x, q_x = token_probs(draft_tokens, draft_probs, target_probs)
    n = num_accepted(uniforms[:, :k] * q_x <= p_x)
    return _with_count(draft_tokens, draft_probs, target_probs, uniforms, n)


def lenient(lenience: float) -> Callable[..., Verdict]:
    """Accept with probability min(1, p / (lenience * q)), lenience < 1: not exact."""
    def verifier(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
                 uniforms: Array, *, check: bool = True) -> Verdict:
        k = int(draft_tokens.shape[1])
        p_x, q_x = token_probs(draft_tokens, draft_probs, target_probs)
        n = num_accepted(uniforms[:, :k] * q_x * lenience < p_x)
        return _with_count(draft_tokens, draft_probs, target_probs, uniforms, n)

    return verifier


def block_without_correction(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
                             uniforms: Array, *, check: bool = True) -> Verdict:
    """Block verification with h_i = p_i: no residual-mass correction Z_{i+1} / (Z_{i+1} + 1 - p_i)."""
    xp = namespace(target_probs)
    batch, k = (int(d) for d in draft_tokens.shape)
    weights = block_weights(*token_probs(draft_tokens, draft_probs, target_probs))  # [B, K]
    tau = last_passed(uniforms[:, :k] < weights)
    lengths = xp.full((batch,), k, dtype=xp.int64)
    final = block_final_token(weights, draft_laws(draft_tokens, draft_probs, target_probs), target_probs,
                              tau, lengths, uniforms[:, k])
    return assemble(draft_tokens, tau, final)


def block_q_one(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
                uniforms: Array, *, check: bool = True) -> Verdict:
    """Block verification whose weights read q(x_i) = 1, as for a deterministic draft, while
    Z_{i+1} and the residual use the laws the drafts were sampled from."""
    xp = namespace(target_probs)
    batch, k = (int(d) for d in draft_tokens.shape)
    p_x, _ = token_probs(draft_tokens, draft_probs, target_probs)
    weights = block_weights(p_x, xp.ones_like(p_x))  # [B, K]
    q = draft_laws(draft_tokens, draft_probs, target_probs)  # [B, K, V]
    lengths = xp.full((batch,), k, dtype=xp.int64)
    tau = block_accepted(weights, q, target_probs, uniforms[:, :k], lengths)
    final = block_final_token(weights, q, target_probs, tau, lengths, uniforms[:, k])
    return assemble(draft_tokens, tau, final)


def _tree(broken_law: Callable[[Array, Array], tuple[Array, Array]]) -> Callable[..., TreeVerdict]:
    """`verify_tree`'s walk with node laws (test, residual) = broken_law(q, one-hot at x)."""
    def verifier(draft_tokens: Array, parents: Array, draft_probs: Array | None, target_probs: Array,
                 uniforms: Array, *, depth: int | None = None, tree_sizes: Array | None = None,
                 check: bool = True) -> TreeVerdict:
        xp = namespace(target_probs)
        batch, nodes = (int(d) for d in draft_tokens.shape)
        tokens = xp.astype(draft_tokens, xp.int64)
        ids = xp.arange(int(target_probs.shape[-1]), dtype=xp.int64)[None, :]

        def laws(i: int) -> tuple[Array, Array]:
            one_hot = xp.astype(ids == tokens[:, i:i + 1], target_probs.dtype)
            q = one_hot if draft_probs is None else xp.astype(draft_probs[:, i, :], target_probs.dtype)
            return broken_law(q, one_hot)

        full = check_parents(parents, batch, nodes)
        return tree_walk(tokens, full, laws, target_probs, uniforms,
                         depth=tree_depth(parents) if depth is None else depth, tree_sizes=tree_sizes)

    return verifier


# Recursive rejection sampling that re-normalises the residual without removing a rejected
# sibling's mass: the next sibling is tested against the same law again.
tree_without_residual = _tree(lambda q, one_hot: (q, 0 * q))
# The acceptance ratio reads q(x) = 1, as for a deterministic candidate, while rejections
# remove the law the sibling was sampled from.
tree_q_one = _tree(lambda q, one_hot: (one_hot, q))

TREE_VERIFIERS: dict[str, Callable[..., TreeVerdict]] = {
    "tree-without-residual": tree_without_residual, "tree-q-one": tree_q_one}
for _name, _rule in TREE_VERIFIERS.items():
    register_tree_rule(_name, _rule)  # a run may name them as its verifier (negative controls)


def with_draft_lengths(rule: Callable[..., Verdict]) -> Callable[..., Verdict]:
    """`rule` taking `draft_lengths` as `verify` does: row b is decided as a round of K = L_b
    (its first L_b drafts, their acceptance draws and the final draw); L_b = 0 samples p_0."""
    def verifier(draft_tokens: Array, draft_probs: Array | None, target_probs: Array, uniforms: Array,
                 *, check: bool = True, draft_lengths: Array | None = None) -> Verdict:
        if draft_lengths is None:
            return rule(draft_tokens, draft_probs, target_probs, uniforms, check=check)
        xp = namespace(target_probs)
        k = int(draft_tokens.shape[1])
        tokens = xp.full((int(draft_tokens.shape[0]), k + 1), -1, dtype=xp.int64)
        n = xp.zeros((int(draft_tokens.shape[0]),), dtype=xp.int64)
        for ell in sorted({int(v) for v in draft_lengths}):
            rows = xp.nonzero(draft_lengths == ell)[0]
            u, p = xp.take(uniforms, rows, axis=0), xp.take(target_probs, rows, axis=0)
            if ell == 0:
                one = Verdict(tokens=sample(p[:, 0, :], u[:, k], check=False)[:, None],
                              num_accepted=xp.zeros_like(rows))
            else:
                q = None if draft_probs is None else xp.take(draft_probs, rows, axis=0)[:, :ell]
                one = rule(xp.take(draft_tokens, rows, axis=0)[:, :ell], q, p[:, :ell + 1],
                           xp.concat([u[:, :ell], u[:, k:]], axis=1), check=check)
            width = int(one.tokens.shape[1])
            rest = xp.full((int(rows.shape[0]), k + 1 - width), -1, dtype=xp.int64)
            tokens[rows, :] = xp.concat([one.tokens, rest], axis=1)
            n[rows] = one.num_accepted
        return Verdict(tokens=tokens, num_accepted=n)

    return verifier


VERIFIERS: dict[str, Callable[..., Verdict]] = {
    name: with_draft_lengths(rule) for name, rule in {
        "resample-from-p": resample_from_p,
        "always-accept": always_accept,
        "never-accept": never_accept,
        "bonus-wrong-position": bonus_from_wrong_position,
        "p-shifted": p_shifted,
        "accept-if-le": accept_if_le,
        "lenient-0.5": lenient(0.5),
        "block-without-correction": block_without_correction,
        "block-q-one": block_q_one,
    }.items()}

# Positions past its own that a rule reads to decide a position (0 unless listed); samplers
# that leave out laws nothing needs, as `tree_samples` does, must compute these too.
LOOKAHEAD: dict[str, int] = {"p-shifted": 1}


class MisreportingDrafter(ModelDrafter):
    """A draft model that samples with one set of parameters and reports q for another.

    Args:
        model: the draft model.
        sample_with: maps the run's params to the ones the draft samples with.
        report_with: maps them to the ones the reported q is computed with.
    """

    def __init__(self, model: Model, *, sample_with: Callable[[SamplingParams], SamplingParams],
                 report_with: Callable[[SamplingParams], SamplingParams]) -> None:
        super().__init__(model)
        self.sample_with = sample_with
        self.report_with = report_with

    def laws(self, logits: Array, params: SamplingParams, *, check: bool) -> tuple[Array, Array]:
        """warp(logits, sample_with(params)) to sample, warp(logits, report_with(params)) as q."""
        return (warp(logits, self.sample_with(params), check=check),
                warp(logits, self.report_with(params), check=False))


def raw_logits_q(model: Model) -> MisreportingDrafter:
    """Samples from the top-k/top-p/min-p-processed law, reports the raw softmax (temperature only)."""
    return MisreportingDrafter(model, sample_with=lambda p: p,
                               report_with=lambda p: SamplingParams(temperature=p.temperature))


def argmax_draft_softmax_q(model: Model) -> MisreportingDrafter:
    """Drafts the argmax (greedy) but reports the softmax law q."""
    return MisreportingDrafter(model, sample_with=lambda p: SamplingParams(temperature=0),
                               report_with=lambda p: p)


def temperature_in_verify_only(model: Model) -> MisreportingDrafter:
    """The draft samples at temperature 1 but reports its tempered law as q."""
    return MisreportingDrafter(
        model, sample_with=lambda p: dataclasses.replace(p, temperature=1.0), report_with=lambda p: p)


class DroppingDrafter(ModelDrafter):
    """A confidence threshold that drops the first draft below it instead of keeping it.

    Whether a draft is kept then depends on that draft itself, so the kept drafts no longer
    follow the q they are verified against (the right rule keeps it: a stopping time).
    """

    def kept(self, confidence: Array, threshold: float) -> Array:
        """One fewer than `confidence_lengths` where some draft is below `threshold`."""
        xp = namespace(confidence)
        low = xp.any(confidence < threshold, axis=1)
        return xp.where(low, confidence_lengths(confidence, threshold) - 1, confidence.shape[1])


DRAFTERS: dict[str, Callable[[Model], ModelDrafter]] = {
    "raw-logits-q": raw_logits_q,
    "argmax-draft-softmax-q": argmax_draft_softmax_q,
    "temperature-in-verify-only": temperature_in_verify_only,
    "drop-low-confidence": lambda model: DroppingDrafter(model, threshold=0.5),
}
