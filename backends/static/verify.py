"""`specsample.verify.verify` and the round's commit in plain torch, for graph capture.

The core functions go through array-api-compat, whose promotion of Python
scalars (`torch.result_type`) Dynamo cannot trace; these are the same
operations, in the same order, written against torch directly. The tests
check them token for token against the core (`tests/test_backend_static.py`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["commit", "sample_tensor", "verify_tensor"]


def sample_tensor(probs: Tensor, u: Tensor) -> Tensor:
    """`sample(probs, u, check=False)`: the first j with cumsum(probs)[j] > u * sum, int64 [...]."""
    cdf = probs.cumsum(dim=-1)  # [..., V]
    total = cdf[..., -1:]
    threshold = torch.minimum(u.to(cdf.dtype)[..., None] * total, torch.nextafter(total, 0 * total))
    return torch.searchsorted(cdf.contiguous(), threshold.contiguous(), right=True)[..., 0]


def verify_tensor(draft_tokens: Tensor, draft_probs: Tensor, target_probs: Tensor,
                  uniforms: Tensor) -> tuple[Tensor, Tensor]:
    """`verify(..., check=False)`: (tokens [B, K+1], num_accepted [B]).

    Args:
        draft_tokens: int64 [B, K].
        draft_probs: [B, K, V], the laws the drafts were sampled from.
        target_probs: [B, K+1, V].
        uniforms: [B, K+1] in [0, 1).
    """
    batch, k = draft_tokens.shape
    at = draft_tokens[..., None]  # [B, K, 1]
    p_x = target_probs[:, :k].gather(-1, at)[..., 0]  # [B, K]
    q_x = draft_probs.gather(-1, at)[..., 0].to(p_x.dtype)
    # Leviathan et al. (2023), Alg. 1: accept x iff u * q(x) < p(x) (strict, division-free).
    accept = uniforms[:, :k] * q_x < p_x
    steps = torch.arange(k, device=accept.device)
    n = torch.where(accept, k, steps[None, :]).amin(dim=1)  # the first rejection, or K
    rows = torch.arange(batch, device=n.device)
    p_n = target_probs[rows, n]  # [B, V]
    rejected = (n < k)[:, None]
    q_n = torch.where(rejected, draft_probs[rows, n.clamp(max=k - 1)].to(p_n.dtype), 0.0)
    residual = (p_n - q_n).clamp(min=0.0)  # max(0, p_n - q_n); q_K := 0 gives the bonus
    has_mass = residual.sum(dim=-1, keepdim=True) > 0
    final = sample_tensor(torch.where(has_mass, residual, p_n), uniforms[:, k])  # [B]
    slots = torch.arange(k + 1, device=n.device)[None, :]
    padded = torch.cat([draft_tokens, torch.zeros_like(draft_tokens[:, :1])], dim=1)  # [B, K+1]
    out = torch.where(slots < n[:, None], padded,
                      torch.where(slots == n[:, None], final[:, None], -1))
    return out, n


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
