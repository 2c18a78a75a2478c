"""A compact forward for Llama-like decoders over preallocated K/V buffers.

One forward serves every architecture in `ARCHITECTURES`: each differs from
Llama by a few settings (`Architecture`), not by a copy of its forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, cast, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PretrainedConfig

from .parallel import TensorParallel, local

__all__ = [
    "ARCHITECTURES",
    "SMALL_ROWS",
    "Architecture",
    "DenseLinear",
    "LlamaStack",
    "PreparedLinear",
    "architecture",
    "attention_mask",
    "decoder_layer",
    "embed",
    "hf_config",
    "is_supported",
    "move_path",
    "rms_norm",
    "submodule",
    "tree_mask",
]

Linear = Callable[[Tensor], Tensor]


@runtime_checkable
class PreparedLinear(Protocol):
    """A linear whose input is first prepared (e.g. quantized), once for the linears that share it.

    `linear(x) == linear.apply(linear.prepare(x))`; linears of one layer that read the
    same input (q, k, v; gate, up) have the same `prepare`, so the forward prepares once.
    """

    def prepare(self, x: Tensor) -> Any:
        """The prepared input."""
        ...

    def apply(self, prepared: Any) -> Tensor:
        """The output for a prepared input."""
        ...

    def __call__(self, x: Tensor) -> Tensor:
        """`apply(prepare(x))`."""
        ...


def _packable(weight: Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]  # unannotated in torch
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


# The row counts (B*T) for which MKL's GEMV-like kernel on the plain weight may beat oneDNN's
# packed copy; from 4 rows on the packed copy is used. Which is faster at these counts
# depends on the machine: `kernels.choose_small_rows` measures it for each target.
SMALL_ROWS = (1, 2, 3)


class DenseLinear:
    """y = x W^T + b, reading W in place; on CPU float32 also a oneDNN-packed copy.

    MKL's float32 GEMM is slow for M = B*T >= 4 rows (the verify forward of K >= 3
    drafts, a batch) while oneDNN on a packed weight is not. For M <= 3 (decode, and a
    verify of one or two drafts) it depends on the machine: on some, MKL streams the
    plain weight as a GEMV-like kernel about 1.3x faster than the packed copy (with the
    decoder's weights cold in cache, as in a full forward); on others the packed copy is
    1.5x to 4x faster. `plain_rows` says which of these row counts read the plain
    weight: all of them until `kernels.choose_small_rows` has measured this machine. For
    the output head (49152 x 576) the packed copy is as fast or faster at every M, so the
    head is built with `one_row=True`.

    Args:
        weight, bias: [N, D] and [N] (or None), read in place.
        pack: keep a oneDNN-packed copy (CPU float32 only).
        one_row: use the packed copy for a single row too.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, *, pack: bool = True,
                 one_row: bool = False) -> None:
        self.weight, self.bias = weight, bias  # [N, D], [N]
        self.out_features = int(weight.shape[0])
        self.packed = (torch.ops.mkldnn._reorder_linear_weight(weight, None)
                       if pack and _packable(weight) else None)
        # Row counts that read the plain weight (every other count reads `packed`).
        self.plain_rows: frozenset[int] = frozenset() if one_row else frozenset(SMALL_ROWS)

    @classmethod
    def of(cls, module: nn.Linear, *, pack: bool = True, one_row: bool = False) -> DenseLinear:
        """Wrap an `nn.Linear` (weights shared, not copied)."""
        weight, bias = module.weight.detach(), module.bias
        return cls(local(weight), None if bias is None else local(bias.detach()), pack=pack,
                   one_row=one_row)

    def __call__(self, x: Tensor) -> Tensor:
        """x [B, T, D] -> [B, T, N]."""
        if self.packed is not None and x.shape[0] * x.shape[1] not in self.plain_rows:
            out: Tensor = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
            return out
        return F.linear(x, self.weight, self.bias)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaLayer:
    """One decoder layer's weights: two RMSNorm scales and seven linears."""

    input_norm: Tensor  # [D]
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    post_norm: Tensor  # [D]
    gate: Linear
    up: Linear
    down: Linear


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaStack:
    """The weights a Llama forward reads, taken from a Hugging Face module.

    Attributes:
        embed: [V, D] input embeddings.
        layers: the decoder layers used (a prefix of the model's for early exit).
        norm: [D] final RMSNorm scale.
        head: the output projection D -> V.
        rotary: the model's rotary-embedding module (any rope type it supports).
        embed_scale: the embeddings are multiplied by this (Gemma: sqrt(D) in the model dtype).
        norm_offset: RMSNorm scales by (norm_offset + weight) in float32 (Gemma: 1), or,
            when 0, by weight in the input dtype (Llama).
        window: a query attends the last `window` positions only (Mistral), or all when None.
        reduce: sums the row-parallel linears' (o, down) partial outputs over the ranks of a
            tensor-parallel target (then `heads` and `kv_heads` count this rank's heads);
            None on one device.
    """

    embed: Tensor
    layers: tuple[LlamaLayer, ...]
    norm: Tensor
    head: Linear
    rotary: nn.Module
    eps: float
    heads: int
    kv_heads: int
    head_dim: int
    act: Callable[[Tensor], Tensor]
    embed_scale: float = 1.0
    norm_offset: float = 0.0
    window: int | None = None
    reduce: Callable[[Tensor], Tensor] | None = None

    @classmethod
    def of(cls, model: nn.Module, *, pack: bool = True, parallel: TensorParallel | None = None
           ) -> LlamaStack:
        """Read the weights of a model of a supported architecture (shared, not copied).

        With `parallel`, the model's projections are DTensors sharded by `parallel.shard`
        and the stack reads this rank's shards.

        Raises:
            ValueError: the architecture is not in `ARCHITECTURES` (the message lists them).
        """
        arch = architecture(model)
        cfg, base = hf_config(model), submodule(model, "model")
        decoder = submodule(base, "layers")
        assert isinstance(decoder, nn.ModuleList)  # every supported architecture keeps its layers so
        # A decoder layer's submodules are typed by transformers per architecture; read as Any here.
        base_layers: list[Any] = list(decoder)
        dense = [[DenseLinear.of(m, pack=pack) for m in (
            layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
            layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)]
            for layer in base_layers]
        split = 1 if parallel is None else parallel.size
        if split > 1 and parallel is not None and parallel.rank:
            for row in dense:  # a row-parallel bias is added once, by rank 0, before the sum
                row[3].bias = row[6].bias = None
        layers = tuple(
            LlamaLayer(input_norm=layer.input_layernorm.weight.detach(), q=q, k=k, v=v, o=o,
                       post_norm=layer.post_attention_layernorm.weight.detach(), gate=g, up=u,
                       down=d)
            for layer, (q, k, v, o, g, u, d) in zip(base_layers, dense, strict=True))
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        embed_tokens, lm_head = submodule(base, "embed_tokens"), submodule(model, "lm_head")
        assert isinstance(lm_head, nn.Linear)
        return cls(embed=_weight(embed_tokens), layers=layers,
                   norm=_weight(submodule(base, "norm")),
                   head=DenseLinear.of(lm_head, pack=pack, one_row=True),
                   rotary=submodule(base, "rotary_emb"), eps=float(cfg.rms_norm_eps),
                   heads=cfg.num_attention_heads // split,
                   kv_heads=cfg.num_key_value_heads // split, head_dim=head_dim,
                   act=_activation(base_layers[0].mlp.act_fn),
                   embed_scale=_embed_scale(embed_tokens, cfg.hidden_size) if arch.embed_scale
                   else 1.0, norm_offset=arch.norm_offset,
                   window=int(cfg.sliding_window) if arch.windowed and cfg.sliding_window else None,
                   reduce=None if parallel is None else parallel.reduce)

    def derive(self, *, num_layers: int | None = None,
               linear: Callable[[DenseLinear], Linear] | None = None) -> LlamaStack:
        """The first `num_layers` layers, each linear mapped by `linear` (e.g. to int8)."""
        layers = self.layers if num_layers is None else self.layers[:num_layers]
        head: Any = self.head
        if linear is not None:
            names = ("q", "k", "v", "o", "gate", "up", "down")
            # replace() takes each field by its own type; the mapped fields are all `Linear`.
            layers = tuple(dataclasses.replace(layer, **cast(dict[str, Any], {
                n: linear(getattr(layer, n)) for n in names})) for layer in layers)
            head = linear(head)
        return dataclasses.replace(self, layers=layers, head=head)


def _activation(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """The MLP activation: F.silu itself for transformers' SiLU modules (whose forward is
    that call), sparing a module call a layer; any other module as it is."""
    if isinstance(module, nn.SiLU) or type(module).__name__ == "SiLUActivation":
        return F.silu
    return module


@dataclasses.dataclass(frozen=True, kw_only=True)
class Architecture:
    """What sets a decoder apart from Llama; the rest is Llama's arithmetic.

    Attributes:
        model_type: the transformers config's model_type.
        embed_scale: embeddings times sqrt(hidden_size), rounded to the model dtype (Gemma).
        norm_offset: RMSNorm as (h * (offset + w)).to(dtype), computed in float32 (Gemma: 1).
        windowed: attention limited to `config.sliding_window` positions (Mistral).
    """

    model_type: str
    embed_scale: bool = False
    norm_offset: float = 0.0
    windowed: bool = False


# Biases on q/k/v (Qwen2, or Llama's attention_bias) need nothing here: DenseLinear keeps them.
ARCHITECTURES = {
    "LlamaForCausalLM": Architecture(model_type="llama"),
    "Qwen2ForCausalLM": Architecture(model_type="qwen2"),
    "MistralForCausalLM": Architecture(model_type="mistral", windowed=True),
    "GemmaForCausalLM": Architecture(model_type="gemma", embed_scale=True, norm_offset=1.0),
}


def hf_config(model: nn.Module) -> PretrainedConfig:
    """`model.config`, the transformers config every model these backends run carries."""
    cfg = model.config
    assert isinstance(cfg, PretrainedConfig), f"model.config: expected a PretrainedConfig, got {type(cfg)}"
    return cfg


def submodule(module: nn.Module, name: str) -> nn.Module:
    """`module.<name>`, a child module (a transformers model's `model`, `lm_head`, `layers`, ...)."""
    child = getattr(module, name)
    assert isinstance(child, nn.Module), f"{name}: expected a module, got {type(child)}"
    return child


def _weight(module: nn.Module) -> Tensor:
    """A module's `weight` parameter, detached (shared, not copied)."""
    weight = module.weight
    assert isinstance(weight, Tensor)
    return weight.detach()


def _embed_scale(embedding: nn.Module, hidden_size: int) -> float:
    """Gemma's embedding multiplier as its module applies it: its own `embed_scale` buffer
    (transformers 5) in the weight dtype, else sqrt(hidden_size) rounded to that dtype."""
    dtype = embedding.weight.dtype
    assert isinstance(dtype, torch.dtype)
    own = getattr(embedding, "embed_scale", None)
    scale = own.to(dtype) if isinstance(own, Tensor) else torch.tensor(hidden_size ** 0.5, dtype=dtype)
    return float(scale)


def _unsupported(model: nn.Module) -> str | None:
    """Why `llama_forward` does not compute `model` exactly, or None when it does."""
    name, cfg = type(model).__name__, getattr(model, "config", None)
    arch = ARCHITECTURES.get(name)
    if arch is None or getattr(cfg, "model_type", None) != arch.model_type:
        return (f"expected one of {sorted(ARCHITECTURES)}, got {name} (model_type "
                f"{getattr(cfg, 'model_type', None)!r})")
    tp = getattr(cfg, "pretraining_tp", 1)
    if tp > 1:
        return f"expected pretraining_tp 1, got {tp} ({name})"
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or ()) and not arch.windowed:
        return f"expected full attention in every layer, got layer_types with sliding_attention ({name})"
    return None


def is_supported(model: nn.Module) -> bool:
    """True for the architectures `llama_forward` computes exactly (see `ARCHITECTURES`)."""
    return _unsupported(model) is None


def architecture(model: nn.Module) -> Architecture:
    """The model's entry in `ARCHITECTURES`.

    Raises:
        ValueError: an unsupported architecture or setting (the message names the supported ones).
    """
    why = _unsupported(model)
    if why is not None:
        raise ValueError(f"model: the fast path and the static engine need a supported architecture: {why}")
    return ARCHITECTURES[type(model).__name__]


def attention_mask(slots: Tensor, positions: Tensor, window: int | None) -> Tensor:
    """bool [B, 1, T, C]: query at positions [B, T] sees key slot c iff c <= position (and
    c > position - window with a sliding window, as transformers' sliding_window_overlay)."""
    visible = slots <= positions[:, :, None]  # [B, T, C]
    if window is not None:
        visible = visible & (slots > positions[:, :, None] - window)
    return visible[:, None]


def tree_mask(lengths: Tensor, parents: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
    """Positions [B, T] (length + depth - 1) and the mask [B, 1, T, S] of a token tree whose
    token t sits at slot length + t: the committed slots, then t's ancestors and t."""
    batch, width = parents.shape
    eye = torch.eye(width, dtype=torch.bool, device=parents.device).expand(batch, width, width)
    seen = eye.clone()  # seen[b, t, j]: j is t or an ancestor of t
    depth = torch.zeros_like(parents)
    for t in range(width):
        parent = parents[:, t]
        has = parent >= 0
        above = seen.gather(1, parent.clamp(min=0)[:, None, None].expand(batch, 1, width))[:, 0]
        seen[:, t] |= above & has[:, None]
        depth[:, t] = torch.where(has, depth.gather(1, parent.clamp(min=0)[:, None])[:, 0] + 1, 0)
    offset = slots[None, :] - lengths[:, None]  # [B, S]: the tree index of each slot
    inside = (offset >= 0) & (offset < width)
    tree = seen.gather(2, offset.clamp(0, width - 1)[:, None, :].expand(batch, width, -1))
    mask = (offset < 0)[:, None, :] | (inside[:, None, :] & tree)
    return lengths[:, None] + depth, mask[:, None]


def move_path(keys: Tensor, values: Tensor, first: Tensor, path: Tensor) -> None:
    """Move an accepted tree path's K/V into place in one layer's buffers [B, H_kv, C, hd]:
    the entries at slots first + path[b, j] go to first + j (j with path[b, j] >= 0; the
    others stay), every source read before any write (`HFModel.commit_path`, and the
    static engine's captured piece)."""
    capacity = keys.shape[2]
    dst = first[:, None] + torch.arange(path.shape[1], device=path.device)[None, :]  # [B, D]
    src = torch.where(path >= 0, first[:, None] + path, dst).clamp(max=capacity - 1)
    dst = dst.clamp(max=capacity - 1)
    rows = torch.arange(keys.shape[0], device=keys.device)[:, None, None]  # [B, 1, 1]
    heads = torch.arange(keys.shape[1], device=keys.device)[None, :, None]  # [1, H_kv, 1]
    for buffer in (keys, values):
        moved = buffer[rows, heads, src[:, None, :]]  # [B, H_kv, D, hd], a copy
        buffer.index_put_((rows, heads, dst[:, None, :]), moved)


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    # As LlamaRMSNorm: normalise in float32, scale in the input dtype; with an offset as
    # GemmaRMSNorm: scale by (offset + weight) in float32, then cast.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (h * (offset + weight.float())).to(x.dtype)
    return weight * h.to(x.dtype)


def embed(tokens: Tensor, weight: Tensor, scale: float) -> Tensor:
    """Token embeddings [B, T, D], times `scale` unless it is 1."""
    x = F.embedding(tokens, weight)
    return x * scale if scale != 1.0 else x


def rope_tables(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """The rotary tables `decoder_layer` reads, made once a forward from the model's (cos,
    sin) [..., hd]: cos, and sin with its first half negated."""
    half = sin.shape[-1] // 2
    return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    # transformers' x * cos + rotate_half(x) * sin, bit for bit in fewer operations:
    # rotate_half(x) = (-x2, x1) and roll(x, half) = (x2, x1), and (-a) * b == a * (-b).
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


def decoder_layer(x: Tensor, cos: Tensor, sin: Tensor, group_mask: Tensor,
                  norms: tuple[Tensor, Tensor], linear: Callable[[str, Tensor], Tensor],
                  write: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], *, heads: int,
                  kv_heads: int, hd: int, eps: float, act: Callable[[Tensor], Tensor],
                  norm_offset: float = 0.0) -> Tensor:
    """One Llama decoder layer: x [B, T, D] -> x, for the eager path and the compiled pieces.

    Args:
        cos, sin: rotary tables [B, 1, T, hd], sin as `rope_tables` makes it.
        group_mask: bool [B, 1, rep*T, C] (see `llama_forward`).
        norms: the input and post-attention RMSNorm scales.
        linear: linear(name, h) applies the layer's linear `name` (q, k, v, o, gate, up, down).
        write: write(k, v) stores the new K/V [B, H_kv, T, hd] in place and returns the
            whole (keys, values) buffers [B, H_kv, C, hd].
        heads, kv_heads, hd, eps, act, norm_offset: the stack's query and K/V heads, head
            size, RMSNorm epsilon, MLP activation and RMSNorm offset.
    """
    batch, width = x.shape[0], x.shape[1]
    rep = heads // kv_heads
    h = rms_norm(x, norms[0], eps, norm_offset)
    q = _rope(linear("q", h).view(batch, width, heads, hd).transpose(1, 2), cos, sin)  # [B, H, T, hd]
    k = _rope(linear("k", h).view(batch, width, kv_heads, hd).transpose(1, 2), cos, sin)
    v = linear("v", h).view(batch, width, kv_heads, hd).transpose(1, 2)  # [B, H_kv, T, hd]
    keys, values = write(k, v)
    q = q.reshape(batch, kv_heads, rep * width, hd)
    a = F.scaled_dot_product_attention(q, keys, values, attn_mask=group_mask)
    a = a.reshape(batch, heads, width, hd).transpose(1, 2).reshape(batch, width, heads * hd)
    x = x + linear("o", a)
    h = rms_norm(x, norms[1], eps, norm_offset)
    return x + linear("down", act(linear("gate", h)) * linear("up", h))
