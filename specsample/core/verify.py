"""Verification: keep a prefix of the draft so the output law is exactly p's."""

from __future__ import annotations

import dataclasses

from specsample._array import (
    Array,
    check_probs,
    check_shape,
    check_tokens,
    check_uniforms,
    device,
    namespace,
    rows_at,
)
from specsample.core.sample import sample

__all__ = ["Verdict", "assemble", "check_inputs", "check_lengths", "final_token", "num_accepted",
           "token_probs", "verify"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """The outcome of one verification.

    Attributes:
        tokens: int64 [B, K+1]: the accepted drafts, the final token at index
            `num_accepted`, then -1.
        num_accepted: int64 [B], in [0, K].
    """

    tokens: Array
    num_accepted: Array


def check_inputs(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
                 uniforms: Array, draft_lengths: Array | None = None) -> None:
    """Validate a verifier's inputs (shapes, ranges, q(x) > 0, draft lengths in [0, K])."""
    namespace(draft_tokens, target_probs, uniforms,
              *(a for a in (draft_probs, draft_lengths) if a is not None))
    check_shape("target_probs", target_probs, (None, None, None))
    batch, k1, vocab = (int(d) for d in target_probs.shape)
    if k1 < 2:
        raise ValueError(f"target_probs: expected shape [B, K+1, V] with K >= 1, got {[batch, k1, vocab]}")
    check_shape("draft_tokens", draft_tokens, (batch, k1 - 1))
    check_tokens("draft_tokens", draft_tokens, vocab)
    check_shape("uniforms", uniforms, (batch, k1))
    check_uniforms("uniforms", uniforms)
    check_probs("target_probs", target_probs)
    if draft_probs is not None:
        check_shape("draft_probs", draft_probs, (batch, k1 - 1, vocab))
        check_probs("draft_probs", draft_probs)
        xp = namespace(draft_probs)
        q_x = xp.take_along_axis(draft_probs, draft_tokens[..., None], axis=-1)
        if bool(xp.any(q_x <= 0)):
            raise ValueError("draft_probs: expected q(x) > 0 for every drafted token x (the law it "
                             "was sampled from), got q(x) = 0 for some draft token")
    if draft_lengths is not None:
        check_lengths("draft_lengths", draft_lengths, batch, k1 - 1)


def check_lengths(name: str, lengths: Array, batch: int, k: int) -> None:
    """Raise unless `lengths` is an integer array [batch] with values in [0, k]."""
    xp = namespace(lengths)
    check_shape(name, lengths, (batch,))
    if not xp.isdtype(lengths.dtype, "integral"):
        raise TypeError(f"{name}: expected an integer array, got dtype {lengths.dtype}")
    if batch and (bool(xp.any(lengths < 0)) or bool(xp.any(lengths > k))):
        raise ValueError(f"{name}: expected values in [0, {k}], got range "
                         f"[{int(xp.min(lengths))}, {int(xp.max(lengths))}]")


def verify(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
           uniforms: Array, *, check: bool = True, draft_lengths: Array | None = None) -> Verdict:
    """Accept a prefix of the drafts, then emit a correction or bonus token.

    Static shapes and no host synchronisation (with check=False).

    Args:
        draft_tokens: int [B, K], the drafted ids.
        draft_probs: [B, K, V], the laws the drafts were actually sampled from,
            or None for a deterministic draft (q is one-hot).
        target_probs: [B, K+1, V], the target's laws after each prefix.
        uniforms: [B, K+1] in [0, 1): K acceptance draws, then one for the final token.
        check: validate the inputs (switch off inside graphs once validated).
        draft_lengths: int [B] in [0, K], or None (all K): row b uses only its first
            L_b drafts. Slots at or beyond L_b are never accepted and q is taken as 0
            at slot L_b, so a row that accepts all L_b drafts draws its bonus token
            from p at L_b: the row is verified exactly as a round of K = L_b would be.

    Returns:
        The Verdict.
    """
    if check:
        check_inputs(draft_tokens, draft_probs, target_probs, uniforms, draft_lengths)
    k = int(draft_tokens.shape[1])
    p_x, q_x = token_probs(draft_tokens, draft_probs, target_probs)
    # Leviathan et al. (2023), Alg. 1: accept x with probability min(1, p(x)/q(x)),
    # written u * q(x) < p(x): strict and division-free, so p(x) = 0 is never accepted.
    accept = uniforms[:, :k] * q_x < p_x  # [B, K]
    if draft_lengths is not None:
        accept = accept & (_slots(accept) < draft_lengths[:, None])
    n = num_accepted(accept)
    final = final_token(draft_tokens, draft_probs, target_probs, n, uniforms[:, k],
                        draft_lengths=draft_lengths)
    return assemble(draft_tokens, n, final)


def _slots(x: Array) -> Array:
    """int64 [1, K]: the slot index of each column of x [B, K]."""
    xp = namespace(x)
    return xp.arange(int(x.shape[1]), dtype=xp.int64, device=device(x))[None, :]


def token_probs(draft_tokens: Array, draft_probs: Array | None,
                target_probs: Array) -> tuple[Array, Array]:
    """p(x_i) and q(x_i) of each draft token: two [B, K] arrays (q = 1 if deterministic)."""
    xp = namespace(draft_tokens, target_probs)
    k = int(draft_tokens.shape[1])
    at = xp.astype(draft_tokens, xp.int64)[..., None]  # [B, K, 1]
    p_x = xp.take_along_axis(target_probs[:, :k, :], at, axis=-1)[..., 0]
    if draft_probs is None:
        return p_x, xp.ones_like(p_x)
    return p_x, xp.astype(xp.take_along_axis(draft_probs, at, axis=-1)[..., 0], p_x.dtype)


def num_accepted(accept: Array) -> Array:
    """The length of the all-True prefix of `accept` [B, K]: int64 [B] in [0, K]."""
    xp = namespace(accept)
    k = int(accept.shape[1])
    steps = xp.arange(k, dtype=xp.int64, device=device(accept))
    return xp.min(xp.where(accept, k, steps[None, :]), axis=1)  # the first rejection, or K


def final_token(draft_tokens: Array, draft_probs: Array | None, target_probs: Array, n: Array,
                u: Array, *, draft_lengths: Array | None = None) -> Array:
    """The token after n accepted drafts: int64 [B].

    From max(0, p_n - q_n) after a rejection (n < L, L = K or the row's draft
    length); from p_L after L acceptances (the bonus token): setting q_L := 0
    makes both one formula.
    """
    xp = namespace(draft_tokens, target_probs)
    k = int(draft_tokens.shape[1])
    p = target_probs
    at = xp.minimum(n, k - 1)  # [B]
    p_n = rows_at(p, n)  # [B, V]
    rejected = (n < (k if draft_lengths is None else draft_lengths))[:, None]  # [B, 1]
    if draft_probs is None:
        x_n = rows_at(xp.astype(draft_tokens, xp.int64), at)[:, None]  # [B, 1]
        ids = xp.arange(int(p.shape[-1]), dtype=xp.int64, device=device(p))
        q_n = xp.astype((ids[None, :] == x_n) & rejected, p.dtype)
    else:
        q_n = xp.where(rejected, xp.astype(rows_at(draft_probs, at), p.dtype), 0.0)
    residual = xp.clip(p_n - q_n, min=0.0)  # [B, V]
    # p ~= q in floating point can leave no residual mass: sample from p_n instead.
    has_mass = xp.sum(residual, axis=-1, keepdims=True) > 0
    return sample(xp.where(has_mass, residual, p_n), u, check=False)


def assemble(draft_tokens: Array, n: Array, final: Array) -> Verdict:
    """Verdict tokens [B, K+1]: n accepted drafts, the final token, then -1."""
    xp = namespace(draft_tokens, n)
    tokens = xp.astype(draft_tokens, xp.int64)
    slots = xp.arange(int(tokens.shape[1]) + 1, dtype=xp.int64, device=device(tokens))[None, :]
    padded = xp.concat([tokens, xp.zeros_like(tokens[:, :1])], axis=1)  # [B, K+1]
    out = xp.where(slots < n[:, None], padded, xp.where(slots == n[:, None], final[:, None], -1))
    return Verdict(tokens=out, num_accepted=n)
