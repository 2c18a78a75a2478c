"""Block verification (Sun et al., ICLR 2025, arXiv 2403.10444, Algorithm 2).

The drafts are judged as a block: the accepted length tau is the LAST position i
whose test eta_i < h_i passes, not the first failure. Paper notation, positions
i = 1..K (slot i - 1 here), P_i, Q_i the target and draft laws of draft i:

    p_0 = 1,  p_i = min(1, p_{i-1} P_i(x_i) / Q_i(x_i))
    Z_{i+1} = sum_y max(p_i P_{i+1}(y) - Q_{i+1}(y), 0)
    h_i = Z_{i+1} / (Z_{i+1} + 1 - p_i)  (i < K),   h_K = p_K
    Y ~ norm(max(p_tau P_{tau+1} - Q_{tau+1}, 0))  (tau < K),   Y ~ P_{K+1}  (tau = K)

The output law is the target's and E[tau] is never below token-wise
verification's (proofs/block_verification.md).
"""

from __future__ import annotations

from specsample._array import Array, device, namespace, rows_at
from specsample.core.sample import sample
from specsample.core.verify import Verdict, assemble, check_inputs, token_probs

__all__ = ["block_accepted", "block_final_token", "block_weights", "draft_laws", "last_passed",
           "verify_block"]


def verify_block(draft_tokens: Array, draft_probs: Array | None, target_probs: Array,
                 uniforms: Array, *, check: bool = True, draft_lengths: Array | None = None) -> Verdict:
    """Keep the drafts up to the last position whose block test passes, then a correction or bonus token.

    Same inputs, shapes and outputs as `specsample.verify`; static shapes and no
    host synchronisation (with check=False).

    Args:
        draft_tokens: int [B, K], the drafted ids.
        draft_probs: [B, K, V], the laws the drafts were actually sampled from,
            or None for a deterministic draft (q is one-hot).
        target_probs: [B, K+1, V], the target's laws after each prefix.
        uniforms: [B, K+1] in [0, 1): eta_1..eta_K, then one for the final token.
        check: validate the inputs (switch off inside graphs once validated).
        draft_lengths: int [B] in [0, K] or None (all K): row b verifies a block of its
            first L_b drafts; the final token comes from the residual at tau < L_b, or
            from P_{L_b + 1} (target_probs[b, L_b]) when all L_b are accepted.

    Returns:
        The Verdict (num_accepted = tau).
    """
    if check:
        check_inputs(draft_tokens, draft_probs, target_probs, uniforms, draft_lengths)
    xp = namespace(draft_tokens, target_probs)
    batch, k = (int(d) for d in draft_tokens.shape)
    if draft_lengths is None:
        lengths = xp.full((batch,), k, dtype=xp.int64, device=device(draft_tokens))
    else:
        lengths = xp.astype(draft_lengths, xp.int64)
    q = draft_laws(draft_tokens, draft_probs, target_probs)  # [B, K, V]
    weights = block_weights(*token_probs(draft_tokens, draft_probs, target_probs))  # [B, K]
    tau = block_accepted(weights, q, target_probs, uniforms[:, :k], lengths)  # [B]
    final = block_final_token(weights, q, target_probs, tau, lengths, uniforms[:, k])
    return assemble(draft_tokens, tau, final)


def draft_laws(draft_tokens: Array, draft_probs: Array | None, target_probs: Array) -> Array:
    """q [B, K, V] in the target's dtype: the given laws, or one-hots at the drafts."""
    xp = namespace(draft_tokens, target_probs)
    if draft_probs is not None:
        return xp.astype(draft_probs, target_probs.dtype)
    ids = xp.arange(int(target_probs.shape[-1]), dtype=xp.int64, device=device(target_probs))
    return xp.astype(xp.astype(draft_tokens, xp.int64)[..., None] == ids, target_probs.dtype)


def block_weights(p_x: Array, q_x: Array) -> Array:
    """p_1..p_K [B, K] from p(x_i), q(x_i) [B, K]: p_i = min(1, p_{i-1} P_i(x_i) / Q_i(x_i)).

    Algorithm 2, line 4. The division is taken only where the ratio is below 1,
    hence where q(x_i) > p_{i-1} p(x_i) >= 0: a zero q never yields NaN or inf.
    """
    xp = namespace(p_x, q_x)
    weight = xp.ones_like(p_x[:, 0])  # p_0 = 1, [B]
    out = []
    for i in range(int(p_x.shape[1])):
        mass = weight * p_x[:, i]  # p_{i-1} P_i(x_i)
        full = mass >= q_x[:, i]  # the ratio is >= 1
        weight = xp.where(full, 1.0, mass / xp.where(full, 1.0, q_x[:, i]))
        out.append(weight)
    return xp.stack(out, axis=1)


def block_accepted(weights: Array, q: Array, target_probs: Array, eta: Array, lengths: Array) -> Array:
    """tau [B]: the largest i <= L with eta_i < h_i, 0 if none (Algorithm 2, lines 5-6).

    eta_i < h_i is tested as eta_i (Z_{i+1} + 1 - p_i) < Z_{i+1}: division-free, and
    strict, so a draft with P_i(x_i) = 0 (p_i = 0, Z_{i+1} = 0) never passes, even at
    eta = 0. At i = L (the block's end) h_L = p_L, i.e. Z := p_L and the sum := 1.
    """
    xp = namespace(weights)
    k = int(weights.shape[1])
    excess = xp.clip(weights[:, :-1, None] * target_probs[:, 1:k, :] - q[:, 1:, :], min=0.0)  # [B, K-1, V]
    z = xp.concat([xp.sum(excess, axis=-1), weights[:, -1:]], axis=1)  # Z_2..Z_K, then p_K: [B, K]
    i = xp.arange(1, k + 1, dtype=xp.int64, device=device(weights))[None, :]  # [1, K]
    at_end = i == lengths[:, None]  # [B, K]
    z = xp.where(at_end, weights, z)
    total = xp.where(at_end, 1.0, z + 1.0 - weights)
    return last_passed((eta * total < z) & (i <= lengths[:, None]))


def last_passed(passed: Array) -> Array:
    """tau int64 [B]: the largest i in 1..K with `passed[:, i - 1]` (passed: [B, K]), else 0."""
    xp = namespace(passed)
    i = xp.arange(1, int(passed.shape[1]) + 1, dtype=xp.int64, device=device(passed))
    return xp.max(xp.where(passed, i[None, :], 0), axis=1)


def block_final_token(weights: Array, q: Array, target_probs: Array, tau: Array, lengths: Array,
                      u: Array) -> Array:
    """The token after tau accepted drafts, int64 [B] (Algorithm 2, line 7).

    From norm(max(p_tau P_{tau+1} - Q_{tau+1}, 0)) when tau < L; from P_{L+1} when
    tau = L (weight 1, q := 0); from P_{tau+1} when the residual has no mass, as `verify`.
    """
    xp = namespace(weights, target_probs)
    k = int(weights.shape[1])
    inside = (tau < lengths)[:, None]  # [B, 1]
    at = xp.minimum(tau, k - 1)  # [B]
    prior = xp.concat([xp.ones_like(weights[:, :1]), weights[:, :-1]], axis=1)  # p_0..p_{K-1}: [B, K]
    weight = xp.where(inside, rows_at(prior, at)[:, None], 1.0)  # [B, 1]
    p_next = rows_at(target_probs, tau)  # P_{tau+1}: [B, V]
    q_next = xp.where(inside, rows_at(q, at), 0.0)  # [B, V]
    residual = xp.clip(weight * p_next - q_next, min=0.0)  # [B, V]
    has_mass = xp.sum(residual, axis=-1, keepdims=True) > 0
    return sample(xp.where(has_mass, residual, p_next), u, check=False)
