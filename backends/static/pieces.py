"""The graph pieces a static round is made of, each captured once per input shape.

A whole round (K draft forwards and the target forward, unrolled) is one
graph of ~150 Llama layers for a real model: too slow to compile. Instead
each piece is a small graph whose weights are *inputs*, not constants, so one
capture of `LayerStep` serves every layer of both models (all layers have the
same shapes), and the loops over layers and draft steps run in Python:

- `EmbedStep`: embedding, rotary cos/sin, the scatter index and the attention mask;
- `LayerStep`: one decoder layer, writing its K/V in place;
- `HeadStep`: final norm and output projection (logits in float32 or float64);
- `DraftSampleStep`: warp and inverse-CDF sampling of one draft token;
- `VerifyStep`: target warp, verify and commit, updating the slot's state in place.

The arithmetic is `llama_forward`'s, operation for operation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from specsample_backends.torch._fast import LlamaLayer, LlamaStack, _rms, _rope
from torch import Tensor, nn

from .verify import commit, sample_tensor, verify_tensor
from .warp import warp_tensor

__all__ = ["DraftSampleStep", "EmbedStep", "HeadStep", "LayerStep", "VerifyStep", "layer_weights"]

LINEARS = ("q", "k", "v", "o", "gate", "up", "down")


def layer_weights(layer: LlamaLayer) -> tuple[Tensor | None, ...]:
    """A layer's tensors in `LayerStep`'s order: two norms, then (weight, bias) per linear."""
    out: list[Tensor | None] = [layer.input_norm, layer.post_norm]
    for name in LINEARS:
        linear = getattr(layer, name)
        out += [linear.weight, linear.bias]
    return tuple(out)


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return F.linear(x, weight, bias)


class EmbedStep(nn.Module):
    """tokens, positions [B, T] -> (x [B, T, D], cos, sin [B, 1, T, hd], index, group mask)."""

    def __init__(self, stack: LlamaStack) -> None:
        super().__init__()
        self.rotary = stack.rotary
        self.heads, self.kv_heads, self.hd = stack.heads, stack.kv_heads, stack.head_dim

    def forward(self, tokens: Tensor, positions: Tensor, embed: Tensor,
                keys: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """`keys` (any layer's K buffer [B, H_kv, C, hd]) only gives C."""
        batch, width = tokens.shape
        rep = self.heads // self.kv_heads
        slots = torch.arange(keys.shape[2], device=tokens.device)  # [C]
        mask = (slots <= positions[:, :, None])[:, None]  # [B, 1, T, C]
        x = F.embedding(tokens, embed)  # [B, T, D]
        cos, sin = self.rotary(x, positions)  # [B, T, hd]
        index = positions[:, None, :, None].expand(batch, self.kv_heads, width, self.hd)
        group_mask = mask[:, :, None].expand(batch, 1, rep, width, mask.shape[-1]).reshape(
            batch, 1, rep * width, mask.shape[-1])  # [B, 1, rep*T, C]
        return x, cos[:, None], sin[:, None], index.contiguous(), group_mask.contiguous()


class LayerStep(nn.Module):
    """One decoder layer: x [B, T, D] -> x, writing K/V at `index` into (keys, values) in place."""

    def __init__(self, stack: LlamaStack) -> None:
        super().__init__()
        self.eps, self.heads, self.kv_heads, self.hd = stack.eps, stack.heads, stack.kv_heads, \
            stack.head_dim
        self.act: Callable[[Tensor], Tensor] = stack.act

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, index: Tensor, group_mask: Tensor,
                keys: Tensor, values: Tensor, input_norm: Tensor, post_norm: Tensor,
                wq: Tensor, bq: Tensor | None, wk: Tensor, bk: Tensor | None,
                wv: Tensor, bv: Tensor | None, wo: Tensor, bo: Tensor | None,
                wg: Tensor, bg: Tensor | None, wu: Tensor, bu: Tensor | None,
                wd: Tensor, bd: Tensor | None) -> Tensor:
        """The layer's output [B, T, D]."""
        batch, width = x.shape[0], x.shape[1]
        heads, kv_heads, hd = self.heads, self.kv_heads, self.hd
        rep = heads // kv_heads
        h = _rms(x, input_norm, self.eps)
        q = _rope(_linear(h, wq, bq).view(batch, width, heads, hd).transpose(1, 2), cos, sin)
        k = _rope(_linear(h, wk, bk).view(batch, width, kv_heads, hd).transpose(1, 2), cos, sin)
        v = _linear(h, wv, bv).view(batch, width, kv_heads, hd).transpose(1, 2)
        keys.scatter_(2, index, k)
        values.scatter_(2, index, v)
        q = q.reshape(batch, kv_heads, rep * width, hd)
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=group_mask)
        a = a.reshape(batch, heads, width, hd).transpose(1, 2).reshape(batch, width, heads * hd)
        x = x + _linear(a, wo, bo)
        h = _rms(x, post_norm, self.eps)
        return x + _linear(self.act(_linear(h, wg, bg)) * _linear(h, wu, bu), wd, bd)


class HeadStep(nn.Module):
    """x [B, T, D] -> logits [B, T, V] in float32 (float64 for a float64 model)."""

    def __init__(self, stack: LlamaStack) -> None:
        super().__init__()
        self.eps = stack.eps

    def forward(self, x: Tensor, norm: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """The logits."""
        logits = _linear(_rms(x, norm, self.eps), weight, bias)
        return logits if logits.dtype == torch.float64 else logits.float()


class DraftSampleStep(nn.Module):
    """logits [B, V] -> (token [B], its law q [B, V]) under the knobs and uniforms u [B]."""

    def forward(self, logits: Tensor, knob: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
        """The sampled draft token and the law it was sampled from."""
        q = warp_tensor(logits, knob)
        return sample_tensor(q, u), q


class VerifyStep(nn.Module):
    """Target logits -> verdict, commit into the slot's tokens/lengths/done in place."""

    def forward(self, logits: Tensor, drafted: Tensor, q: Tensor, u: Tensor, knob: Tensor,
                eos: Tensor, tokens: Tensor, lengths: Tensor, stop: Tensor,
                done: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(verdict tokens [B, K+1], num_accepted [B], emitted [B], active [B])."""
        verdict, n = verify_tensor(drafted, q, warp_tensor(logits, knob), u)
        active = ~done
        emitted, new, ended, finished = commit(verdict, n, tokens, lengths, stop, done, eos)
        tokens.copy_(new)
        lengths.copy_(ended)
        done.copy_(finished)
        return verdict, n, emitted, active
