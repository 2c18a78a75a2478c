"""A feature-level draft head for a Llama-like target (EAGLE-1's shape, with EAGLE-3's fused taps).

`DraftHead` holds the trainable weights: an FC over [embedding(x_t); f_{t-1}] and one
decoder layer of the target's architecture; its output imitates the target's feature
f_t (the final norm's output), and the draft logits are the target's own output head
applied to it, over the whole vocabulary or a subset of frequent tokens (q is then a law
over that subset, and exactness is untouched). `HeadModel` runs it as a
`specsample.drafters.head.FeatureHead` over preallocated K/V and feature buffers, through the
same `llama_layers` the target uses; training (`DraftHead.features`) runs the same
function with autograd. Its file format (safetensors and a card) is `head_file`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from specsample.core.cache import Cache, check_live, consume

from ._fast import DenseLinear, LlamaLayer, LlamaStack, attention_mask, embed, move_path, tree_mask
from ._forward import llama_layers
from .model import NO_LOGITS, HFModel, selected_columns

__all__ = ["DraftHead", "HeadModel"]

_LINEARS = ("q", "k", "v", "o", "gate", "up", "down")


class DraftHead(nn.Module):
    """FC [2D -> D] and `layers` decoder layers shaped like the target's (each initialised
    from its last, with its residual branches at zero, so that an untrained head predicts
    f_t = f_{t-1}).

    Args:
        target: the target (fast path) whose embeddings, rotary table and output head the
            head reads, frozen.
        vocab: the token ids the draft may propose (None: all).
        taps: the target's layers whose outputs the head fuses with its top feature (EAGLE-3's
            low, middle and high features; `HFModel.tap`): the feature it reads at a position
            the target computed is fuse([f; rms(h_i) for each tap i]), fuse a linear
            [D * (1 + taps) -> D] that starts as "f alone". () reads f alone (EAGLE-1's input).
        layers: its decoder layers (1, EAGLE's; more raise its capacity and its cost per
            draft step alike). The first keeps the names a one-layer head's file has
            (`input_norm`, `post_norm`, `linears`); the others are `more`.
    """

    vocab: Tensor  # int64 [S]: the ids the draft may propose, sorted
    taps: Tensor  # int64 [n]: the target's layers fused with f (empty: none)

    def __init__(self, target: HFModel, vocab: Tensor | None = None, taps: tuple[int, ...] = (),
                 layers: int = 1) -> None:
        super().__init__()
        if target.stack is None:
            raise ValueError(f"target: a draft head needs the fast path (a Llama-like target), "
                             f"got a {type(target.module).__name__}")
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise ValueError(f"layers: expected an int >= 1 (the head's decoder layers), got {layers!r}")
        stack, width = target.stack, int(target.stack.embed.shape[1])
        decoder: Any = target.module.get_submodule("model.layers")
        last = decoder[-1]
        dtype, device = stack.embed.dtype, stack.embed.device  # the target's, GPU or CPU
        self.fc = nn.Linear(2 * width, width, bias=True, dtype=dtype, device=device)
        with torch.no_grad():  # start from "the feature of the previous position"
            self.fc.weight.zero_()
            self.fc.bias.zero_()
            self.fc.weight[:, width:].copy_(torch.eye(width, dtype=dtype, device=device))
        first = _HeadLayer(last)
        self.input_norm: nn.Parameter = first.input_norm
        self.post_norm: nn.Parameter = first.post_norm
        self.linears: nn.ModuleDict = first.linears
        self.more = nn.ModuleList(_HeadLayer(last) for _ in range(layers - 1))
        self.register_buffer("vocab", _vocab(vocab, target.vocab_size).to(stack.embed.device),
                             persistent=True)
        try:
            target.tap(taps)  # validates them against the target
        except ValueError as err:
            raise ValueError(f"taps: {err}") from err
        self.register_buffer("taps", torch.tensor(taps, dtype=torch.int64, device=device), persistent=True)
        self.width = width
        self.fuse: nn.Linear | None = None
        if taps:
            self.fuse = nn.Linear(width * (1 + len(taps)), width, bias=False, dtype=dtype, device=device)
            with torch.no_grad():  # start from f alone
                self.fuse.weight.zero_()
                self.fuse.weight[:, :width].copy_(torch.eye(width, dtype=dtype, device=device))
        self.target_stack = stack  # frozen, not a parameter

    def fused(self, features: Tensor) -> Tensor:
        """The feature [..., D] the head reads from the target's features [..., D * (1 + k)]
        (k: the target's taps, `HFModel.tap`): f alone without taps of its own, else its fuse
        over f and its taps' outputs, each of these scaled to unit root mean square."""
        taps, width = int(self.taps.numel()), self.width
        if self.fuse is None:
            if features.shape[-1] < width or features.shape[-1] % width:
                raise ValueError(f"features: expected the target's features, D = {width} wide (or D times "
                                 f"1 + its taps), got {list(features.shape)}")
            return features[..., :width]
        if features.shape[-1] != width * (1 + taps):
            raise ValueError(f"features: this head fuses the target's layers {self.taps.tolist()} with "
                             f"its top feature, expected [..., {width * (1 + taps)}] (the target tapped "
                             f"at those layers, HFModel.tap), got {list(features.shape)}")
        parts = columns(features, width)
        # In float32, as the target's own norms: a half-precision square may overflow.
        scaled = [parts[0]] + [(p.float() * torch.rsqrt(p.float().pow(2).mean(-1, keepdim=True) + 1e-6)
                                ).to(p.dtype) for p in parts[1:]]
        out: Tensor = self.fuse(torch.cat(scaled, dim=-1))
        return out

    @property
    def layers(self) -> int:
        """Its decoder layers."""
        return 1 + len(self.more)

    def stack(self, *, pack: bool) -> LlamaStack:
        """The head's layers as a LlamaStack over the target's settings."""
        mine = self.target_stack.layers[0].q
        layers = []
        # The first layer's weights are the head's own attributes, named as a `_HeadLayer`'s.
        parts: list[Any] = [self, *self.more]
        for part in parts:
            modules: dict[str, Any] = dict(part.linears.items())
            dense = {n: DenseLinear(m.weight.detach() if pack else m.weight, m.bias, pack=pack)
                     for n, m in modules.items()}
            for linear in dense.values():  # the kernels measured for the target's small forwards
                linear.plain_rows = getattr(mine, "plain_rows", linear.plain_rows)
            layers.append(LlamaLayer(input_norm=part.input_norm, post_norm=part.post_norm, **dense))
        return dataclasses.replace(self.target_stack, layers=tuple(layers), reduce=None)

    def features(self, tokens: Tensor, previous: Tensor) -> Tensor:
        """Training: predicted features [B, T, D] from tokens [B, T] at positions 0..T-1 and
        the target's features of the positions before them ([B, T, D], or wider with taps:
        see `fused`; causal, autograd on)."""
        batch, width = tokens.shape
        stack = self.stack(pack=False)
        previous = self.fused(previous)
        x = self.fc(torch.cat([embed(tokens, stack.embed, stack.embed_scale), previous], dim=-1))
        positions = torch.arange(width, device=tokens.device).expand(batch, width)
        mask = attention_mask(torch.arange(width, device=tokens.device), positions, stack.window)
        shape = (batch, stack.kv_heads, width, stack.head_dim)
        buffers = tuple((x.new_zeros(shape), x.new_zeros(shape)) for _ in stack.layers)
        return llama_layers(stack, x, positions, mask, buffers)

    def unrolled(self, tokens: Tensor, previous: Tensor, steps: int) -> list[Tensor]:
        """Training-time test (EAGLE-3): the head's predicted features [B, T, D] after `steps`
        unrolled draft steps, as drafting computes them (autograd on).

        Step 0 is `features` (the target's features of t - 1 as input, `fused`). Step j reads at
        position t its own step j - 1 prediction for t - 1, and attends as a j-th draft does:
        the step-0 keys of positions <= t - j (what the target's features gave), then the key
        its own chain wrote at each later step (step i at position t - (j - i)), itself last.
        Step j's prediction at t is what a draft j + 1 deep reads from (meaningful for t >= j).
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps: expected an int >= 1, got {steps!r}")
        batch, width = tokens.shape
        stack = self.stack(pack=False)
        token_part = embed(tokens, stack.embed, stack.embed_scale)
        t = torch.arange(width, device=tokens.device)
        positions = t.expand(batch, width)
        key_step = torch.arange(steps, device=tokens.device).repeat_interleave(width)  # [S * T]
        key_at = t.repeat(steps)  # [S * T]
        shape = (batch, stack.kv_heads, steps * width, stack.head_dim)
        previous = self.fused(previous)
        buffers = tuple((previous.new_zeros(shape), previous.new_zeros(shape)) for _ in stack.layers)
        out: list[Tensor] = []
        for j in range(steps):
            x = self.fc(torch.cat([token_part, previous], dim=-1))
            chained = key_at[None, :] == t[:, None] - (j - key_step[None, :])
            seen = torch.where(key_step[None, :] == 0, key_at[None, :] <= t[:, None] - j,
                               (key_step[None, :] <= j) & chained)
            mask = seen[None, None].expand(batch, 1, width, steps * width)
            # A fresh copy per step: the earlier steps' graph keeps the keys it read.
            buffers = tuple((k.clone(), v.clone()) for k, v in buffers) if j else buffers
            h = llama_layers(stack, x, positions, mask, buffers, (j * width + t).expand(batch, width))
            out.append(h)
            previous = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)
        return out

    def logits(self, features: Tensor) -> Tensor:
        """Draft logits [..., V]: the target's head over the vocabulary subset, -inf elsewhere."""
        rows, size = self.vocab, int(self.target_stack.embed.shape[0])
        if rows.numel() == size:
            return features @ _head_weight(self.target_stack.head).T
        out = features.new_full((*features.shape[:-1], size), float("-inf"))
        return out.index_copy(-1, rows, features @ _head_weight(self.target_stack.head)[rows].T)


class _HeadLayer(nn.Module):
    """One decoder layer's weights, copied from the target's `layer` with its residual
    branches (o, down) at zero: it starts as the identity."""

    def __init__(self, layer: Any) -> None:
        super().__init__()
        self.input_norm = nn.Parameter(layer.input_layernorm.weight.detach().clone())
        self.post_norm = nn.Parameter(layer.post_attention_layernorm.weight.detach().clone())
        modules = (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                   layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)
        self.linears = nn.ModuleDict({n: _copy(m) for n, m in zip(_LINEARS, modules, strict=True)})
        with torch.no_grad():
            for name in ("o", "down"):
                branch: Any = self.linears[name]
                branch.weight.zero_()


def columns(x: Tensor, width: int) -> list[Tensor]:
    """x [..., n * width] as n tensors [..., width] (views), in order."""
    return [x[..., i:i + width] for i in range(0, int(x.shape[-1]), width)]


def _copy(module: nn.Module) -> nn.Linear:
    weight: Any = module.weight
    bias: Any = module.bias
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype,
                    device=weight.device)
    with torch.no_grad():
        out.weight.copy_(weight)
        if bias is not None:
            out.bias.copy_(bias)
    return out


def _vocab(vocab: Tensor | None, size: int) -> Tensor:
    if vocab is None:
        return torch.arange(size)
    ids = torch.as_tensor(vocab, dtype=torch.int64)
    if ids.ndim != 1 or ids.numel() < 1 or int(ids.min()) < 0 or int(ids.max()) >= size or \
            len(set(ids.tolist())) != ids.numel():
        raise ValueError(f"vocab: expected a non-empty 1-D set of distinct token ids in [0, {size}), "
                         f"got {ids.numel()} ids with shape {list(ids.shape)}")
    return ids.sort().values


def _head_weight(head: Any) -> Tensor:
    weight: Tensor = head.weight
    return weight


class HeadModel:
    """A `DraftHead` as a `FeatureHead`: K/V [B, H_kv, C, hd] per layer, features F [B, C, D]
    and the per-row count of positions whose feature is the target's.

    A forward at positions t reads F[t - 1] (zeros at t = 0), and writes its predicted
    feature at every position t >= known[b], so the next draft step reads it back.
    """

    def __init__(self, head: DraftHead) -> None:
        if not isinstance(head, DraftHead):
            raise TypeError(f"head: expected a DraftHead, got {type(head).__name__}")
        self.head = head.eval()
        self.stack = head.stack(pack=True)
        self.vocab = int(head.target_stack.embed.shape[0])
        rows = head.vocab
        # The subset's rows of the output head, packed once: a draft step reads only those.
        self._subset = None if rows.numel() == self.vocab else DenseLinear(
            _head_weight(head.target_stack.head)[rows].contiguous(), None, one_row=True)
        self.device = head.fc.weight.device
        self._slots = torch.arange(1 << 16, device=self.device)

    @property
    def vocab_size(self) -> int:
        """V, the target's vocabulary (the draft's q is 0 outside its subset)."""
        return self.vocab

    @property
    def support(self) -> Tensor | None:
        """The ids the head can propose (ascending; its logits are -inf elsewhere), or None for
        all: a `ModelDrafter` warps and samples over these only."""
        return None if self._subset is None else self.head.vocab

    @property
    def projection(self) -> tuple[Any, Tensor]:
        """(the linear from a predicted feature to the head's logits over its ids, those ids:
        int64 [S], ascending), for an engine that runs the head from its own pieces."""
        return (self.stack.head if self._subset is None else self._subset), self.head.vocab

    def new_cache(self, batch: int, capacity: int) -> Cache:
        """Empty K/V and feature buffers; no feature known."""
        stack, dtype = self.stack, self.head.fc.weight.dtype
        if capacity > self._slots.shape[0]:
            self._slots = torch.arange(capacity, device=self.device)
        shape = (batch, stack.kv_heads, capacity, stack.head_dim)
        with torch.inference_mode():
            kv = tuple((torch.zeros(shape, dtype=dtype, device=self.device),
                        torch.zeros(shape, dtype=dtype, device=self.device)) for _ in stack.layers)
            feats = torch.zeros((batch, capacity, int(stack.embed.shape[1])), dtype=dtype,
                                device=self.device)
            known = torch.zeros(batch, dtype=torch.int64, device=self.device)
            lengths = torch.zeros(batch, dtype=torch.int64, device=self.device)
        return Cache(lengths=lengths, capacity=capacity, buffers=(kv, feats, known))

    def with_features(self, cache: Cache, features: Tensor, first: Tensor, known: Tensor) -> Cache:
        """Write the target's features [B, W, D] (wider with taps: written `DraftHead.fused`)
        at positions first[b] + j; mark < known[b]."""
        check_live(cache)
        kv, feats, old = cache.buffers
        width = int(features.shape[1])
        with torch.inference_mode():
            features = self.head.fused(features.to(feats.dtype))
            at = (first[:, None] + self._slots[:width]).clamp(max=cache.capacity - 1)
            feats.scatter_(1, at[:, :, None].expand(-1, -1, feats.shape[2]), features.to(feats.dtype))
            old.copy_(known)
        return consume(cache, lengths=cache.lengths, buffers=(kv, feats, old))

    def forward(self, tokens: Tensor, cache: Cache) -> tuple[Tensor, Cache]:
        """Draft logits [B, T, V] (float32, float64 for a float64 head) for tokens [B, T] at
        positions lengths + t."""
        logits, cache = self._run(tokens, cache, None)
        assert logits is not None
        return logits, cache

    def forward_select(self, tokens: Tensor, cache: Cache, columns: Tensor | None, *,
                       features: bool = False) -> tuple[Tensor | None, Tensor | None, Cache]:
        """`forward` with the logits of one column per row only ([B, V]: row b's at
        columns[b]), or none for `columns` None (a prefill); the head has no features to give
        (`features` must be False). See `specsample.core.protocols.SelectiveModel`."""
        if features:
            raise ValueError("features: a draft head gives no features of its own; expected False")
        if not isinstance(tokens, Tensor) or tokens.ndim != 2:
            raise TypeError(f"tokens: expected a torch tensor [B, T], got {type(tokens).__name__} "
                            f"{list(getattr(tokens, 'shape', []))}")
        select = NO_LOGITS if columns is None else selected_columns(columns, tokens)
        logits, cache = self._run(tokens, cache, select)
        return logits, None, cache

    def forward_tree(self, tokens: Tensor, parents: Tensor, cache: Cache) -> tuple[Tensor, Cache]:
        """Draft logits [B, T, V] for a tree of tokens [B, T] in one pass (EAGLE-2's tree
        drafting): token t's parent is parents[b, t] (-1: the last committed position), its
        position the cache length plus its number of ancestors; it attends the committed
        positions, its ancestors and itself, and reads its parent's feature from the cache
        (the prediction an earlier forward wrote at the parent's slot). K/V and the predicted
        features are written at slots lengths + t; the lengths advance by T."""
        if not isinstance(tokens, Tensor) or tokens.ndim != 2:
            raise TypeError(f"tokens: expected a torch tensor [B, T], got {type(tokens).__name__} "
                            f"{list(getattr(tokens, 'shape', []))}")
        if not isinstance(parents, Tensor) or parents.shape != tokens.shape or parents.dtype != torch.int64:
            raise TypeError(f"parents: expected an int64 tensor shaped like tokens {list(tokens.shape)}, "
                            f"got {type(parents).__name__} {getattr(parents, 'dtype', '')} "
                            f"{list(getattr(parents, 'shape', []))}")
        if bool(((parents < -1) | (parents >= self._slots[:tokens.shape[1]][None, :])).any()):
            raise ValueError("parents: expected -1 or an earlier token's index for every token")
        if self.stack.window is not None:
            raise ValueError(f"tokens: a tree forward needs full attention, got a sliding window "
                             f"of {self.stack.window}")
        logits, cache = self._run(tokens, cache, None, parents=parents)
        assert logits is not None
        return logits, cache

    def commit_path(self, cache: Cache, first: Tensor, path: Tensor) -> Cache:
        """Move an accepted path's K/V and features into place: slots first + path[b, j] go to
        first + j (see `HFModel.commit_path`)."""
        check_live(cache)
        kv, feats, known = cache.buffers
        with torch.inference_mode():
            for keys, values in kv:
                move_path(keys, values, first, path)
            rows = torch.arange(feats.shape[0], device=feats.device)[:, None]
            dst = first[:, None] + self._slots[:path.shape[1]][None, :]
            src = torch.where(path >= 0, first[:, None] + path, dst).clamp(max=cache.capacity - 1)
            feats[rows, dst.clamp(max=cache.capacity - 1)] = feats[rows, src]
        return consume(cache, lengths=cache.lengths, buffers=(kv, feats, known))

    def _run(self, tokens: Tensor, cache: Cache, select: Tensor | object, *, parents: Tensor | None = None
             ) -> tuple[Tensor | None, Cache]:
        """The forward; `select`: None (every column's logits), `NO_LOGITS`, or int64 [B]
        columns whose logits alone are computed ([B, V]); `parents`: a tree's (see
        `forward_tree`), or None for a chain."""
        check_live(cache)
        kv, feats, known = cache.buffers
        width = tokens.shape[1]
        with torch.inference_mode():
            slots = cache.lengths[:, None] + self._slots[:width]  # [B, T]
            span = int(slots.max()) + 1
            stack = self.stack
            if parents is None:
                positions, before = slots, slots - 1
                mask = attention_mask(self._slots[:span], positions, stack.window)
            else:
                positions, mask = tree_mask(cache.lengths, parents, self._slots[:span])
                start = cache.lengths[:, None]
                before = torch.where(parents >= 0, start + parents, start - 1)
            previous = feats.gather(1, before.clamp(min=0)[:, :, None].expand(-1, -1, feats.shape[2]))
            previous = previous * (before >= 0)[:, :, None]
            x = self.head.fc(torch.cat([embed(tokens, stack.embed, stack.embed_scale), previous], -1))
            h = llama_layers(stack, x, positions, mask, kv, None if parents is None else slots)
            guess = slots >= known[:, None]  # not the target's: keep the prediction
            index = slots.clamp(max=cache.capacity - 1)[:, :, None].expand(-1, -1, feats.shape[2])
            feats.scatter_(1, index, torch.where(guess[:, :, None], h, feats.gather(1, index)))
            logits: Tensor | None = None
            if select is None or isinstance(select, Tensor):
                if isinstance(select, Tensor):  # [B, 1, D]
                    h = h.gather(1, select[:, None, None].expand(-1, 1, h.shape[2]))
                if self._subset is None:
                    logits = self.stack.head(h)
                else:
                    logits = h.new_full((*h.shape[:2], self.vocab), float("-inf")).index_copy_(
                        -1, self.head.vocab, self._subset(h))
                if isinstance(select, Tensor):
                    logits = logits[:, 0]
                if logits.dtype != torch.float64:  # float32 logits, as HFModel gives
                    logits = logits.float()
        return logits, consume(cache, lengths=cache.lengths + width, buffers=(kv, feats, known))
