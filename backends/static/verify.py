"""`verify`, `verify_block` and the round's commit in plain torch, for graph capture.

The core functions go through array-api-compat, whose promotion of Python
scalars (`torch.result_type`) Dynamo cannot trace; these are the same
operations, in the same order, written against torch directly. The tests
check them token for token against the core (`tests/test_backend_static.py`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["commit", "confidence_tensor", "kept_tensor", "sample_tensor", "verify_block_tensor",
           "verify_tensor"]


def sample_tensor(probs: Tensor, u: Tensor) -> Tensor:
    """`sample(probs, u, check=False)`: the first j with cumsum(probs)[j] > u * sum, int64 [...]."""
    cdf = probs.cumsum(dim=-1)  # [..., V]
    total = cdf[..., -1:]
    threshold = torch.minimum(u.to(cdf.dtype)[..., None] * total, torch.nextafter(total, 0 * total))
    return torch.searchsorted(cdf.contiguous(), threshold.contiguous(), right=True)[..., 0]


def confidence_tensor(logits: Tensor, x: Tensor) -> Tensor:
    """softmax(logits)[b, x[b]] at temperature 1, [B]: `ModelDrafter`'s confidence, the same
    operations in the same order."""
    top = logits.amax(dim=-1, keepdim=True)
    log_total = (logits - top).exp().sum(dim=-1).log()
    picked = logits.gather(-1, x[:, None])[:, 0] - top[:, 0]
    return (picked - log_total).exp()


def kept_tensor(confidence: Tensor, threshold: Tensor) -> Tensor:
    """`confidence_lengths(confidence, threshold)` int64 [B]; a threshold of 0 keeps all K."""
    k = int(confidence.shape[1])
    slots = torch.arange(k, device=confidence.device)[None, :]
    return torch.where(confidence < threshold, slots + 1, k).amin(dim=1)


def verify_tensor(draft_tokens: Tensor, draft_probs: Tensor, target_probs: Tensor,
                  uniforms: Tensor, draft_lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`verify(..., check=False)`: (tokens [B, K+1], num_accepted [B]).

    Args:
        draft_tokens: int64 [B, K].
        draft_probs: [B, K, V], the laws the drafts were sampled from.
        target_probs: [B, K+1, V].
        uniforms: [B, K+1] in [0, 1).
        draft_lengths: int64 [B] in [0, K], or None for K: row b verifies its first L_b
            drafts as a round of K = L_b would.
    """
    batch, k = draft_tokens.shape
    at = draft_tokens[..., None]  # [B, K, 1]
    p_x = target_probs[:, :k].gather(-1, at)[..., 0]  # [B, K]
    q_x = draft_probs.gather(-1, at)[..., 0].to(p_x.dtype)
    # Leviathan et al. (2023), Alg. 1: accept x iff u * q(x) < p(x) (strict, division-free).
    accept = uniforms[:, :k] * q_x < p_x
    steps = torch.arange(k, device=accept.device)
    if draft_lengths is not None:
        accept = accept & (steps[None, :] < draft_lengths[:, None])
    n = torch.where(accept, k, steps[None, :]).amin(dim=1)  # the first rejection, or K
    rows = torch.arange(batch, device=n.device)
    p_n = target_probs[rows, n]  # [B, V]
    rejected = (n < (k if draft_lengths is None else draft_lengths))[:, None]
    q_n = torch.where(rejected, draft_probs[rows, n.clamp(max=k - 1)].to(p_n.dtype), 0.0)
    residual = (p_n - q_n).clamp(min=0.0)  # max(0, p_n - q_n); q_K := 0 gives the bonus
    has_mass = residual.sum(dim=-1, keepdim=True) > 0
    final = sample_tensor(torch.where(has_mass, residual, p_n), uniforms[:, k])  # [B]
    slots = torch.arange(k + 1, device=n.device)[None, :]
    padded = torch.cat([draft_tokens, torch.zeros_like(draft_tokens[:, :1])], dim=1)  # [B, K+1]
    out = torch.where(slots < n[:, None], padded,
                      torch.where(slots == n[:, None], final[:, None], -1))
    return out, n


def verify_block_tensor(draft_tokens: Tensor, draft_probs: Tensor, target_probs: Tensor, uniforms: Tensor,
                        draft_lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`verify_block(..., check=False)`: (tokens [B, K+1], num_accepted [B]).

    Sun et al. (2025), Algorithm 2, the same operations in the same order as
    `specsample.verify_block`; see that module for the rule.

    Args:
        draft_tokens: int64 [B, K].
        draft_probs: [B, K, V], the laws the drafts were sampled from.
        target_probs: [B, K+1, V].
        uniforms: [B, K+1] in [0, 1).
        draft_lengths: int64 [B] in [0, K], or None for K.
    """
    batch, k = draft_tokens.shape
    at = draft_tokens[..., None]  # [B, K, 1]
    p_x = target_probs[:, :k].gather(-1, at)[..., 0]  # [B, K]
    q = draft_probs.to(target_probs.dtype)  # [B, K, V]
    q_x = q.gather(-1, at)[..., 0]
    lengths = torch.full_like(draft_tokens[:, 0], k) if draft_lengths is None else draft_lengths
    weight, out = torch.ones_like(p_x[:, 0]), []
    for i in range(k):  # p_i = min(1, p_{i-1} P_i(x_i) / Q_i(x_i)), divided only below 1
        mass = weight * p_x[:, i]
        full = mass >= q_x[:, i]
        weight = torch.where(full, 1.0, mass / torch.where(full, 1.0, q_x[:, i]))
        out.append(weight)
    weights = torch.stack(out, dim=1)  # [B, K]
    excess = (weights[:, :-1, None] * target_probs[:, 1:k] - q[:, 1:]).clamp(min=0.0)  # [B, K-1, V]
    z = torch.cat([excess.sum(dim=-1), weights[:, -1:]], dim=1)  # Z_2..Z_K, then p_K
    steps = torch.arange(1, k + 1, device=lengths.device)[None, :]  # [1, K]
    at_end = steps == lengths[:, None]
    z = torch.where(at_end, weights, z)
    total = torch.where(at_end, 1.0, z + 1.0 - weights)
    passed = (uniforms[:, :k] * total < z) & (steps <= lengths[:, None])  # eta_i < h_i, division-free
    n = torch.where(passed, steps, 0).amax(dim=1)  # tau: the last i that passed, or 0
    rows = torch.arange(batch, device=n.device)
    inside = (n < lengths)[:, None]
    prior = torch.cat([torch.ones_like(weights[:, :1]), weights[:, :-1]], dim=1)  # p_0..p_{K-1}
    at_n = n.clamp(max=k - 1)
    p_n = target_probs[rows, n]  # P_{tau+1}: [B, V]
    residual = (torch.where(inside, prior[rows, at_n][:, None], 1.0) * p_n
                - torch.where(inside, q[rows, at_n], 0.0)).clamp(min=0.0)
    has_mass = residual.sum(dim=-1, keepdim=True) > 0
    final = sample_tensor(torch.where(has_mass, residual, p_n), uniforms[:, k])  # [B]
    slots = torch.arange(k + 1, device=n.device)[None, :]
    padded = torch.cat([draft_tokens, torch.zeros_like(draft_tokens[:, :1])], dim=1)  # [B, K+1]
    tokens = torch.where(slots < n[:, None], padded, torch.where(slots == n[:, None], final[:, None], -1))
    return tokens, n


def commit(verdict: Tensor, n: Tensor, tokens: Tensor, lengths: Tensor, stop: Tensor, done: Tensor,
           eos: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The core round's bookkeeping: (emitted [B], tokens [B, C], lengths [B], done [B]).

    A row commits its accepted drafts and final token, up to its first EOS and
    its stop length; done rows commit nothing. `eos` is a 0-d int64 tensor,
    -1 for none (no committed token is -1).

    Args:
        verdict: int64 [B, K+1] and n int64 [B], from `verify_tensor`.
        tokens: int64 [B, C] committed ids; lengths, stop int64 [B]; done bool [B].
    """
    slots = torch.arange(verdict.shape[1], device=verdict.device)[None, :]  # [1, K+1]
    count = n + 1
    hit = (verdict == eos) & (slots < count[:, None])
    first = torch.where(hit, slots, verdict.shape[1]).amin(dim=1)
    count = torch.minimum(torch.minimum(count, first + 1), stop - lengths)
    emitted = torch.where(done, 0, count)  # [B]
    pos = torch.arange(tokens.shape[1], device=tokens.device)[None, :]  # [1, C]
    offset = pos - lengths[:, None]  # [B, C]
    window = (offset >= 0) & (offset < emitted[:, None])
    new = torch.where(window, verdict.gather(1, offset.clamp(0, verdict.shape[1] - 1)), tokens)
    ended = lengths + emitted
    finished = done | (ended >= stop) | ((new == eos) & window).any(dim=1)
    return emitted, new, ended, finished
