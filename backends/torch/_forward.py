"""The decoder forward over a `LlamaStack`: logits, the features the head reads, the layers.

One forward serves the eager path (`HFModel`), the compiled pieces of the static engine
and the draft head (`head.HeadModel`, which feeds its own inputs to `llama_layers`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ._fast import LlamaLayer, LlamaStack, PreparedLinear, decoder_layer, embed, rms_norm, rope_tables

__all__ = ["llama_features", "llama_forward", "llama_layers"]

_ROW_PARALLEL = ("o", "down")  # the linears whose outputs a tensor-parallel stack sums


def llama_forward(stack: LlamaStack, tokens: Tensor, positions: Tensor, mask: Tensor,
                  buffers: tuple[tuple[Tensor, Tensor], ...]) -> Tensor:
    """Logits [B, T, V] in the model dtype, writing K/V at `positions` into `buffers` in place.

    Args:
        tokens: int64 [B, T].
        positions: int64 [B, T], absolute positions (= cache lengths + t).
        mask: bool [B, 1, T, S], True where a query may attend a key: attention reads the
            first S <= C slots of each buffer (S = C attends them all).
        buffers: per layer (K, V), each [B, H_kv, C, hd].
    """
    return stack.head(llama_features(stack, tokens, positions, mask, buffers))


def llama_features(stack: LlamaStack, tokens: Tensor, positions: Tensor, mask: Tensor,
                   buffers: tuple[tuple[Tensor, Tensor], ...], slots: Tensor | None = None,
                   taps: tuple[int, ...] = (), kept: list[Tensor] | None = None) -> Tensor:
    """The features [B, T, D] the output head reads (the final norm's output); see
    `llama_forward` and `llama_layers` for the arguments (`taps`, `kept`: `llama_layers`')."""
    x = embed(tokens, stack.embed, stack.embed_scale)  # [B, T, D]
    x = llama_layers(stack, x, positions, mask, buffers, slots, taps, kept)
    return rms_norm(x, stack.norm, stack.eps, stack.norm_offset)


def llama_layers(stack: LlamaStack, x: Tensor, positions: Tensor, mask: Tensor,
                 buffers: tuple[tuple[Tensor, Tensor], ...], slots: Tensor | None = None,
                 taps: tuple[int, ...] = (), kept: list[Tensor] | None = None) -> Tensor:
    """The stack's decoder layers over inputs x [B, T, D] (no embedding, no final norm); see
    `llama_forward` for the other arguments. `slots` [B, T]: the buffer slots K/V are
    written at, when they are not the positions (a draft tree: positions are depths,
    slots are consecutive). `taps`: layer indices whose outputs (the residual stream after
    the layer) are appended to `kept`, in the order of `taps`."""
    if taps and kept is None:
        raise ValueError("kept: expected a list to append the tapped layers' outputs to, got None")
    batch, width = x.shape[0], x.shape[1]
    heads, kv_heads, hd = stack.heads, stack.kv_heads, stack.head_dim
    rep = heads // kv_heads
    cos, sin = rope_tables(*stack.rotary(x, positions))  # [B, T, hd]
    cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, hd]
    index = (positions if slots is None else slots)[:, None, :, None].expand(batch, kv_heads, width, hd)
    # Grouped-query attention without repeating K/V: the rep query heads that
    # share a K/V head become rep*T query rows of that head.
    group_mask = mask[:, :, None].expand(batch, 1, rep, width, mask.shape[-1]).reshape(
        batch, 1, rep * width, mask.shape[-1])  # [B, 1, rep*T, C]
    prepared = isinstance(stack.layers[0].q, PreparedLinear)
    span = mask.shape[-1]
    tapped: dict[int, Tensor] = {}
    for i, (layer, (keys, values)) in enumerate(zip(stack.layers, buffers, strict=True)):
        def write(k: Tensor, v: Tensor, keys: Tensor = keys, values: Tensor = values
                  ) -> tuple[Tensor, Tensor]:
            keys.scatter_(2, index, k)
            values.scatter_(2, index, v)
            return keys[:, :, :span], values[:, :, :span]

        # The input last prepared and its preparation: decoder_layer passes one unmodified
        # tensor to the linears that share it, so identity finds it again within a layer.
        last: list[Any] = [None, None]

        def linear(name: str, h: Tensor, layer: LlamaLayer = layer, last: list[Any] = last
                   ) -> Tensor:
            lin = getattr(layer, name)
            if not prepared:
                out: Tensor = lin(h)
            else:
                if last[0] is not h:
                    last[:] = [h, lin.prepare(h)]
                out = lin.apply(last[1])
            # A tensor-parallel stack's o and down give partial sums: one all-reduce each.
            return stack.reduce(out) if stack.reduce is not None and name in _ROW_PARALLEL else out

        x = decoder_layer(x, cos, sin, group_mask, (layer.input_norm, layer.post_norm), linear,
                          write, heads=heads, kv_heads=kv_heads, hd=hd, eps=stack.eps,
                          act=stack.act, norm_offset=stack.norm_offset)
        if i in taps:
            tapped[i] = x
    if taps:
        assert kept is not None
        kept.extend(tapped[i] for i in taps)
    return x
