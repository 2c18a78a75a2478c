"""The graph pieces a static round is made of, each captured once per input shape.

A whole round (K draft forwards and the target forward, unrolled) is one
graph of ~150 Llama layers for a real model: too slow to compile. Instead
each piece is a small graph whose weights are *inputs*, not constants, so one
capture of `LayerStep` serves every layer of both models (all layers have the
same shapes), and the loops over layers and draft steps run in Python.

The linears enter a graph as keys of `specsample::linear` (see
`specsample_backends.torch.opaque`): the graph calls the eager path's own
linear (a oneDNN-packed float32 weight, or fbgemm int8 for the int8 draft),
and the compiler fuses the norms, rotary embedding and residuals around it.
K/V are written with `index_put_`, which the compiler does in place (a
`scatter_` into a graph input made it copy the whole buffer twice per layer).

- `EmbedStep`: embedding, rotary cos/sin, the write positions and the attention mask;
- `LayerStep`: one decoder layer, writing its K/V in place;
- `HeadStep`: final norm and output projection (logits in float32 or float64);
- `FeatureStep`: the target's features (the final norm's output), written into the slot's
  feature buffer, for a feature-level draft head;
- `HeadInputStep`, `HeadOutputStep`: a draft head's FC over [embedding; the previous
  position's feature], and its predicted features to draft logits (its decoder layer is
  a `LayerStep` like any other);
- `DraftSampleStep`: warp and inverse-CDF sampling of one draft token;
- `VerifyStep`: target warp, verify and commit, updating the slot's state in place.

The arithmetic is `llama_forward`'s, operation for operation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from specsample_backends.torch import opaque
from specsample_backends.torch._fast import (
    LlamaLayer,
    LlamaStack,
    attention_mask,
    decoder_layer,
    embed,
    rms_norm,
    rope_tables,
)
from torch import Tensor, nn

from .verify import (
    commit,
    confidence_tensor,
    kept_tensor,
    sample_tensor,
    verify_block_tensor,
    verify_tensor,
)
from .warp import warp_tensor

__all__ = ["RULES", "DraftSampleStep", "EmbedStep", "FeatureStep", "HeadInputStep", "HeadOutputStep",
           "HeadStep", "LayerStep", "VerifyStep", "layer_weights", "stack_config"]

LINEARS = ("q", "k", "v", "o", "gate", "up", "down")


def layer_weights(layer: LlamaLayer) -> tuple[Tensor, ...]:
    """A layer's graph inputs in `LayerStep`'s order: two norms, then one key per linear."""
    return (layer.input_norm, layer.post_norm,
            *(opaque.key_of(getattr(layer, name)) for name in LINEARS))


def stack_config(stack: LlamaStack) -> tuple[object, ...]:
    """What a piece's graph depends on besides shapes: two stacks with equal configs share graphs."""
    layer = stack.layers[0]
    return (id(stack.rotary), id(stack.act), stack.eps, stack.heads, stack.kv_heads, stack.head_dim,
            stack.embed_scale, stack.norm_offset, stack.window,
            tuple(opaque.out_features(getattr(layer, name)) for name in LINEARS),
            opaque.out_features(stack.head))


class EmbedStep(nn.Module):
    """tokens, positions [B, T] -> (x [B, T, D], cos, sin [B, 1, T, hd], positions, group mask)."""

    def __init__(self, stack: LlamaStack) -> None:
        super().__init__()
        self.rotary, self.scale, self.window = stack.rotary, stack.embed_scale, stack.window
        self.heads, self.kv_heads, self.hd = stack.heads, stack.kv_heads, stack.head_dim

    def forward(self, tokens: Tensor, positions: Tensor, weight: Tensor,
                keys: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """`keys` (any layer's K buffer [B, H_kv, C, hd]) only gives C."""
        slots = torch.arange(keys.shape[2], device=tokens.device)  # [C]
        mask = attention_mask(slots, positions, self.window)  # [B, 1, T, C]
        return self.embedded(tokens, positions, positions, mask, weight)

    def embedded(self, tokens: Tensor, positions: Tensor, write: Tensor, mask: Tensor,
                 weight: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(x, cos, sin, write slots [B, 1, T], the mask per query head group) for tokens at
        `positions` (rotary), written at slots `write`, attending under `mask` [B, 1, T, C]."""
        batch, width = tokens.shape
        rep = self.heads // self.kv_heads
        x = embed(tokens, weight, self.scale)  # [B, T, D]
        cos, sin = rope_tables(*self.rotary(x, positions))  # [B, T, hd]
        group_mask = mask[:, :, None].expand(batch, 1, rep, width, mask.shape[-1]).reshape(
            batch, 1, rep * width, mask.shape[-1])  # [B, 1, rep*T, C]
        return x, cos[:, None], sin[:, None], write[:, None, :].contiguous(), group_mask.contiguous()


class LayerStep(nn.Module):
    """One decoder layer: x [B, T, D] -> x, writing K/V at `positions` into (keys, values) in place."""

    def __init__(self, stack: LlamaStack) -> None:
        super().__init__()
        self.eps, self.heads, self.kv_heads, self.hd = stack.eps, stack.heads, stack.kv_heads, \
            stack.head_dim
        self.norm_offset = stack.norm_offset
        self.act: Callable[[Tensor], Tensor] = stack.act
        self.out = {name: opaque.out_features(getattr(stack.layers[0], name)) for name in LINEARS}

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, group_mask: Tensor,
                keys: Tensor, values: Tensor, input_norm: Tensor, post_norm: Tensor,
                q_key: Tensor, k_key: Tensor, v_key: Tensor, o_key: Tensor,
                gate_key: Tensor, up_key: Tensor, down_key: Tensor) -> Tensor:
        """The layer's output [B, T, D]; `positions` is [B, 1, T]."""
        batch, out = x.shape[0], self.out
        keys_of = {"q": q_key, "k": k_key, "v": v_key, "o": o_key, "gate": gate_key, "up": up_key,
                   "down": down_key}
        rows = torch.arange(batch, device=x.device)[:, None, None]  # [B, 1, 1]
        kv_rows = torch.arange(self.kv_heads, device=x.device)[None, :, None]  # [1, H_kv, 1]

        def linear(name: str, h: Tensor) -> Tensor:
            y: Tensor = opaque.call(h, keys_of[name], out[name])
            return y

        def write(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            keys.index_put_((rows, kv_rows, positions), k)  # in place under the compiler too
            values.index_put_((rows, kv_rows, positions), v)
            return keys, values

        hidden: Tensor = decoder_layer(x, cos, sin, group_mask, (input_norm, post_norm), linear, write,
                                       heads=self.heads, kv_heads=self.kv_heads, hd=self.hd,
                                       eps=self.eps, act=self.act, norm_offset=self.norm_offset)
        return hidden


class HeadStep(nn.Module):
    """x [B, T, D] -> logits [B, T, V] in float32 (float64 for a float64 model)."""

    def __init__(self, stack: LlamaStack) -> None:
        super().__init__()
        self.eps, self.vocab = stack.eps, opaque.out_features(stack.head)
        self.norm_offset = stack.norm_offset

    def forward(self, x: Tensor, norm: Tensor, head_key: Tensor) -> Tensor:
        """The logits."""
        logits: Tensor = opaque.call(rms_norm(x, norm, self.eps, self.norm_offset), head_key, self.vocab)
        return logits if logits.dtype == torch.float64 else logits.float()


def _rows(x: Tensor) -> Tensor:
    """[B, T] row indices for x [B, T, ...] (an `index_put_` by (row, position))."""
    return torch.arange(x.shape[0], device=x.device)[:, None].expand(x.shape[0], x.shape[1])


class FeatureStep(nn.Module):
    """The target's features (the final norm's output) of its last hidden states x [B, T, D],
    written into a feature buffer [B, C, D] at `positions` [B, T] in place; returns them."""

    def __init__(self, stack: LlamaStack) -> None:
        super().__init__()
        self.eps, self.norm_offset = stack.eps, stack.norm_offset

    def forward(self, x: Tensor, norm: Tensor, positions: Tensor, features: Tensor) -> Tensor:
        """The features [B, T, D]."""
        f: Tensor = rms_norm(x, norm, self.eps, self.norm_offset)
        features.index_put_((_rows(x), positions), f.to(features.dtype))
        return f


class HeadInputStep(nn.Module):
    """A draft head's input: its FC over [embedding x [B, T, D]; the feature of each position's
    predecessor, read from the feature buffer (zeros at position 0)]."""

    def __init__(self, stack: LlamaStack) -> None:
        super().__init__()
        self.width = int(stack.embed.shape[1])

    def forward(self, x: Tensor, positions: Tensor, features: Tensor, fc_key: Tensor) -> Tensor:
        """The FC's output [B, T, D]."""
        before = (positions - 1).clamp(min=0)
        previous = features.gather(1, before[:, :, None].expand(-1, -1, features.shape[2]))
        previous = previous * (positions > 0)[:, :, None]
        out: Tensor = opaque.call(torch.cat([x, previous], dim=-1), fc_key, self.width)
        return out


class HeadOutputStep(nn.Module):
    """A draft head's predicted features h [B, T, D] -> its logits [B, T, V] (float32, float64
    for a float64 head), -inf outside its `size` ids; h is written into the feature buffer at
    the positions not known to be the target's (positions >= known[b]), so the next draft
    step reads it back.

    Args:
        stack: the head's stack (V from its output head).
        size: how many ids the head proposes (S <= V; its output projection has S rows).
    """

    def __init__(self, stack: LlamaStack, size: int) -> None:
        super().__init__()
        self.vocab, self.size = opaque.out_features(stack.head), size

    def forward(self, h: Tensor, positions: Tensor, features: Tensor, known: Tensor, out_key: Tensor,
                ids: Tensor) -> Tensor:
        """The draft logits."""
        index = positions[:, :, None].expand(-1, -1, features.shape[2])
        guess = (positions >= known[:, None])[:, :, None]
        features.index_put_((_rows(h), positions), torch.where(guess, h, features.gather(1, index)))
        logits: Tensor = opaque.call(h, out_key, self.size)
        if self.size < self.vocab:
            logits = logits.new_full((*h.shape[:2], self.vocab), float("-inf")).index_copy(-1, ids, logits)
        return logits if logits.dtype == torch.float64 else logits.float()


class DraftSampleStep(nn.Module):
    """logits [B, V] -> (token [B], its law q [B, V], the draft's confidence in it [B]) under
    the knobs and uniforms u [B]."""

    def forward(self, logits: Tensor, knob: Tensor, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The sampled draft token, the law it was sampled from, its temperature-1 probability."""
        q = warp_tensor(logits, knob)
        x = sample_tensor(q, u)
        return x, q, confidence_tensor(logits, x)


RULES = {"token": verify_tensor, "block": verify_block_tensor}  # the verifiers a graph can hold


class VerifyStep(nn.Module):
    """Target logits -> verdict, commit into the slot's tokens/lengths/done in place.

    Args:
        rule: the acceptance rule by name ("token" or "block"), fixed per graph.
    """

    def __init__(self, rule: str = "token") -> None:
        super().__init__()
        if rule not in RULES:
            raise ValueError(f"verifier: the static engine compiles {sorted(RULES)}, got {rule!r}")
        self.rule = rule

    def forward(self, logits: Tensor, drafted: Tensor, q: Tensor, confidence: Tensor, u: Tensor,
                knob: Tensor, eos: Tensor, tokens: Tensor, lengths: Tensor, stop: Tensor,
                done: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(verdict tokens [B, K+1], num_accepted [B], emitted [B], active [B], drafts kept [B])."""
        kept = kept_tensor(confidence, knob[4])  # knob[4] = 0: every row keeps all K
        verdict, n = RULES[self.rule](drafted, q, warp_tensor(logits, knob), u, kept)
        active = ~done
        emitted, new, ended, finished = commit(verdict, n, tokens, lengths, stop, done, eos)
        tokens.copy_(new)
        lengths.copy_(ended)
        done.copy_(finished)
        return verdict, n, emitted, active, kept
