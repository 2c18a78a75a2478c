"""A slot's buffers and the steps that run over them: whole-round graphs and captured pieces.

`RoundStep` and `PrefillStep` are one function each (captured whole); `PiecewiseRound`
and `PiecewisePrefill` compute the same tokens from separately captured pieces (embed,
layer, head, sample, verify) with the loops in Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch
from specsample_backends.torch import opaque
from specsample_backends.torch._fast import LlamaStack, attention_mask
from specsample_backends.torch._forward import llama_forward
from torch import Tensor, nn

from specsample.core.cache import Lineage

from .pieces import DraftSampleStep, VerifyStep, layer_weights

__all__ = ["KV", "HeadLinears", "HeadPieces", "Model", "PieceSource", "PiecewisePrefill", "PiecewiseRound",
           "PrefillStep", "RoundStep", "Slot"]

KV = tuple[tuple[Tensor, Tensor], ...]  # per layer (K, V), each [B, H_kv, C, hd]


class PieceSource(Protocol):
    """What a step reads of its engine (`engine.Engine`): the stacks and the captured pieces."""

    target: LlamaStack
    draft: LlamaStack | None
    head: HeadLinears | None

    def piece(self, kind: str, stack: LlamaStack | None, width: int, kv: KV) -> Callable[..., Any]:
        """The captured piece `kind` for a stack's configuration, a width and a K/V shape."""
        ...


def _forward(stack: LlamaStack, tokens: Tensor, positions: Tensor, kv: KV) -> Tensor:
    """Logits [B, T, V] (float32 or float64) for tokens [B, T] at positions [B, T]."""
    slots = torch.arange(kv[0][0].shape[2], device=tokens.device)  # [C]
    mask = attention_mask(slots, positions, stack.window)  # [B, 1, T, C]
    logits: Tensor = llama_forward(stack, tokens, positions, mask, kv)
    return logits if logits.dtype == torch.float64 else logits.float()


@dataclasses.dataclass(eq=False, kw_only=True)
class Slot:
    """Everything one (batch, capacity) keeps between runs; allocated once.

    Attributes:
        tokens: int64 [B, C]; lengths, stop: int64 [B]; done: bool [B].
        target_kv, draft_kv: K/V buffers [B, H_kv, C, hd] per layer.
        knob: [4] sampling knobs; eos: int64 [] (-1: none).
        lineage: the generation counter of the K/V buffers (bumped by every round).
        uniforms: K -> float64 [B, 2K+1], the round graph's random input.
        rounds: (K, rule) -> the captured round; prefill: the captured prefill.
        trees: (width, D) -> the captured tree round of that width and its input buffers
            (nodes, parents [B, width], sizes, uniforms [B, width+1]).
        features: a draft head's feature buffer [B, C, D] (None without a head): the
            target's features of committed positions, the head's predictions after them.
        head_k: the K of the slot's last head round (0 before the first): the next round's
            first draft forward feeds at least that many tokens plus one.
    """

    tokens: Tensor
    lengths: Tensor
    stop: Tensor
    done: Tensor
    target_kv: KV
    draft_kv: KV
    knob: Tensor
    eos: Tensor
    lineage: Lineage = dataclasses.field(default_factory=Lineage)
    uniforms: dict[int, Tensor] = dataclasses.field(default_factory=dict)
    rounds: dict[tuple[int, str], Callable[..., Any]] = dataclasses.field(default_factory=dict)
    prefill: Callable[..., Any] | None = None
    trees: dict[tuple[int, int], tuple[Callable[..., Any], tuple[Tensor, ...]]] = \
        dataclasses.field(default_factory=dict)
    features: Tensor | None = None
    head_k: int = 0

    @property
    def capacity(self) -> int:
        """C, positions per row."""
        return int(self.tokens.shape[1])

    def pointers(self) -> list[int]:
        """data_ptr of every state buffer (to show they never move)."""
        flat = [self.tokens, self.lengths, self.stop, self.done, self.knob, self.eos,
                *(t for kv in (self.target_kv, self.draft_kv) for pair in kv for t in pair),
                *([] if self.features is None else [self.features])]
        return [t.data_ptr() for t in flat]


class PrefillStep(nn.Module):
    """Write K/V of a [B, P] chunk at given positions into both caches (no output)."""

    def __init__(self, engine: PieceSource, slot: Slot) -> None:
        super().__init__()
        self.engine, self.slot = engine, slot

    def mutable(self) -> tuple[Tensor, ...]:
        """State tensors a call changes besides K/V beyond the valid lengths: none."""
        return ()

    def forward(self, chunk: Tensor, positions: Tensor) -> Tensor:
        """chunk, positions int64 [B, P]; returns the target's last logits [B, V]."""
        if self.engine.draft is not None:
            _forward(self.engine.draft, chunk, positions, self.slot.draft_kv)
        return _forward(self.engine.target, chunk, positions, self.slot.target_kv)[:, -1]


class RoundStep(nn.Module):
    """One speculative round over a slot's buffers, updating them in place (`rule`: a RULES name)."""

    def __init__(self, engine: PieceSource, slot: Slot, k: int, rule: str = "token") -> None:
        super().__init__()
        self.engine, self.slot, self.k, self.rule = engine, slot, k, rule
        # The same draft-sampling and verify-and-commit code the piecewise round captures.
        self.sample, self.verify = DraftSampleStep(), VerifyStep(rule)

    def mutable(self) -> tuple[Tensor, ...]:
        """State tensors a call changes besides K/V beyond the valid lengths (a capture that
        runs warm-up calls restores them)."""
        return self.slot.tokens, self.slot.lengths, self.slot.done

    def draft(self, u: Tensor, knob: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """K draft tokens [B, K], their laws q [B, K, V] and the draft's confidence in each
        [B, K] (`ModelDrafter.propose`; every row drafts K, a threshold only shortens the
        block each row verifies).

        The draft cache holds L - 2 entries: the first forward feeds the last two
        committed tokens (positions clipped at 0 for a one-token prompt).
        """
        s, lengths = self.slot, self.slot.lengths
        pos = (lengths[:, None] + torch.arange(2, device=lengths.device) - 2).clamp(min=0)  # [B, 2]
        feed = s.tokens.gather(1, pos)
        drafted, laws, sure = [], [], []
        for i in range(self.k):
            logits = _forward(self.engine.draft, feed, pos, s.draft_kv)[:, -1]  # [B, V]
            x, q, confidence = self.sample(logits, knob, u[:, i])
            drafted.append(x)
            laws.append(q)
            sure.append(confidence)
            feed, pos = x[:, None], (lengths + i)[:, None]
        return torch.stack(drafted, dim=1), torch.stack(laws, dim=1), torch.stack(sure, dim=1)

    def forward(self, u: Tensor, knob: Tensor, eos: Tensor) -> tuple[Tensor, ...]:
        """Run the round; returns (verdict tokens [B, K+1], num_accepted, emitted, active,
        drafts kept [B])."""
        s, k = self.slot, self.k
        drafted, q, sure = self.draft(u[:, :k], knob)
        last = s.tokens.gather(1, (s.lengths - 1)[:, None])  # [B, 1]
        pos = s.lengths[:, None] - 1 + torch.arange(k + 1, device=last.device)  # [B, K+1]
        logits = _forward(self.engine.target, torch.cat([last, drafted], dim=1), pos, s.target_kv)
        out: tuple[Tensor, ...] = self.verify(logits, drafted, q, sure, u[:, k:], knob, eos, s.tokens,
                                              s.lengths, s.stop, s.done)
        return out


class Model:
    """One model's captured pieces for one slot, shared by every call of the same shape.

    Args:
        engine: the engine (its capture and piece cache).
        stack: the model's weights.
        kv: the model's K/V buffers in the slot.
    """

    def __init__(self, engine: PieceSource, stack: LlamaStack, kv: KV) -> None:
        self.engine, self.stack, self.kv = engine, stack, kv
        self.layers = [(keys, values, layer_weights(layer))
                       for layer, (keys, values) in zip(stack.layers, kv, strict=True)]
        self.head_weights = (stack.norm, opaque.key_of(stack.head))  # type: ignore[arg-type,unused-ignore]

    def hidden(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Run the layers over tokens/positions [B, T] (K/V written); the last hidden states."""
        width = int(tokens.shape[1])
        embed = self.engine.piece("embed", self.stack, width, self.kv)
        layer = self.engine.piece("layer", self.stack, width, self.kv)
        x, cos, sin, where, mask = embed(tokens, positions, self.stack.embed, self.kv[0][0])
        for keys, values, weights in self.layers:
            x = layer(x, cos, sin, where, mask, keys, values, *weights)
        return x  # type: ignore[no-any-return]

    def logits(self, tokens: Tensor, positions: Tensor, *, last: bool = False,
               features: Tensor | None = None) -> Tensor:
        """Logits [B, T, V] (float32/float64), or [B, 1, V] of the last position when `last`;
        with a `features` buffer [B, C, D], the forward's features are written there too."""
        x = self.hidden(tokens, positions)
        if features is not None:
            self.features(x, positions, features)
        if last:
            # T = 1 and T = 2 forwards share one head graph: the same strides (also for B = 1).
            x = x[:, -1:].clone(memory_format=torch.contiguous_format)
        head = self.engine.piece("head", self.stack, int(x.shape[1]), self.kv)
        return head(x, *self.head_weights)  # type: ignore[no-any-return]

    def features(self, x: Tensor, positions: Tensor, features: Tensor) -> None:
        """Write the features (the final norm's output) of hidden states x [B, T, D] at
        `positions` [B, T] into `features` [B, C, D]."""
        piece = self.engine.piece("features", self.stack, int(x.shape[1]), self.kv)
        piece(x, self.stack.norm, positions, features)


@dataclasses.dataclass(frozen=True)
class HeadLinears:
    """What the engine reads of a feature-level draft head besides its decoder layer (its
    stack's one layer): its FC [2D -> D], its output projection over its S ids, and the
    ids (int64 [S], ascending; all V for a head over the whole vocabulary)."""

    fc: Any
    out: Any
    ids: Tensor


class HeadPieces:
    """A feature-level draft head's forward from captured pieces, over a slot's head K/V and
    feature buffer: the embedding and decoder-layer pieces the target uses (the head's
    layer has the target's shapes, so they share graphs), its FC and its output piece.

    A forward at positions t reads the feature of t - 1 (zeros at t = 0) and writes its
    prediction at the positions not known to be the target's (`HeadModel`'s semantics).
    """

    def __init__(self, engine: PieceSource, slot: Slot) -> None:
        assert engine.draft is not None and engine.head is not None and slot.features is not None
        self.engine, self.stack, self.kv, self.features = engine, engine.draft, slot.draft_kv, slot.features
        # The head's norms are trainable Parameters; its graphs take plain tensors, as the target's.
        self.weights = tuple(w.detach() for w in layer_weights(self.stack.layers[0]))
        self.fc, self.out = opaque.key_of(engine.head.fc), opaque.key_of(engine.head.out)
        self.ids = engine.head.ids
        self.output = f"head-out-{int(self.ids.shape[0])}"

    def layers(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """The head's predicted features [B, T, D] for tokens at positions [B, T] (K/V written)."""
        width = int(tokens.shape[1])
        embed = self.engine.piece("embed", self.stack, width, self.kv)
        feed = self.engine.piece("head-in", self.stack, width, self.kv)
        layer = self.engine.piece("layer", self.stack, width, self.kv)
        x, cos, sin, where, mask = embed(tokens, positions, self.stack.embed, self.kv[0][0])
        x = feed(x, positions, self.features, self.fc)
        keys, values = self.kv[0]
        return layer(x, cos, sin, where, mask, keys, values, *self.weights)  # type: ignore[no-any-return]

    def logits(self, tokens: Tensor, positions: Tensor, known: Tensor) -> Tensor:
        """Draft logits [B, V] after the last of tokens [B, T] at positions [B, T], whose
        prediction is written where its position >= known[b]. Only the last position can be:
        every earlier one is below it, and the last committed position is at most known[b]
        (positions clipped at 0 repeat the same token, with the same prediction)."""
        h = self.layers(tokens, positions)[:, -1:].clone(memory_format=torch.contiguous_format)
        last = positions[:, -1:].clone(memory_format=torch.contiguous_format)  # strides of any B
        out = self.engine.piece(self.output, self.stack, 1, self.kv)
        return out(h, last, self.features, known, self.out, self.ids)[:, 0]  # type: ignore[no-any-return]


class PiecewiseRound:
    """`RoundStep` with each piece captured on its own and the loops in Python (same tokens)."""

    def __init__(self, engine: PieceSource, slot: Slot, k: int, rule: str = "token") -> None:
        self.engine, self.slot, self.k = engine, slot, k
        self.target = Model(engine, engine.target, slot.target_kv)
        self.head = None if engine.head is None else HeadPieces(engine, slot)
        self.draft = Model(engine, engine.draft, slot.draft_kv) if self.head is None else None
        self.sample = engine.piece("sample", None, 1, slot.draft_kv)
        self.verify = engine.piece(f"verify-{rule}", None, k + 1, slot.target_kv)
        # The first draft forward feeds the last two committed tokens (the draft model's
        # cache holds L - 2), or a head's last max(K, K') + 1, K' the slot's last round's K:
        # every position after the last one whose head K/V came from the target's features
        # alone (the last round committed at most K' + 1 tokens, drafted from predictions).
        self.two = torch.arange(2, device=slot.tokens.device) - 2
        self.windows: dict[int, Tensor] = {}  # a head's first-forward offsets, by width
        self.span = torch.arange(k + 1, device=slot.tokens.device) - 1

    def _draft(self, feed: Tensor, pos: Tensor, known: Tensor) -> Tensor:
        """The draft's logits [B, V] after the last of tokens `feed` at positions `pos` [B, T]."""
        if self.head is not None:
            return self.head.logits(feed, pos, known)
        assert self.draft is not None
        return self.draft.logits(feed, pos, last=True)[:, 0]

    def __call__(self, u: Tensor, knob: Tensor, eos: Tensor) -> tuple[Tensor, ...]:
        """Run the round; returns (verdict tokens [B, K+1], num_accepted, emitted, active,
        drafts kept [B])."""
        s, k = self.slot, self.k
        lengths = s.lengths
        known = lengths - 1  # the positions whose features are the target's
        back = self.two
        if self.head is not None:
            width = max(k, s.head_k) + 1
            if width not in self.windows:
                self.windows[width] = torch.arange(width, device=s.tokens.device) - width
            back, s.head_k = self.windows[width], k
        pos = (lengths[:, None] + back).clamp(min=0)  # [B, 2] ([B, max(K, K') + 1] for a head)
        feed = s.tokens.gather(1, pos)
        drafted, laws, sure = [], [], []
        for i in range(k):
            logits = self._draft(feed, pos, known)  # [B, V]
            ui = u[:, i].clone(memory_format=torch.contiguous_format)  # one graph for every K
            x, q, confidence = self.sample(logits, knob, ui)
            drafted.append(x)
            laws.append(q)
            sure.append(confidence)
            feed, pos = x[:, None], (lengths + i)[:, None]
        tokens = torch.stack(drafted, dim=1)
        last = s.tokens.gather(1, (lengths - 1)[:, None])  # [B, 1]
        pos = lengths[:, None] + self.span  # [B, K+1]
        logits = self.target.logits(torch.cat([last, tokens], dim=1), pos, features=s.features)
        out: tuple[Tensor, ...] = self.verify(
            logits, tokens, torch.stack(laws, dim=1), torch.stack(sure, dim=1), u[:, k:], knob, eos,
            s.tokens, s.lengths, s.stop, s.done)
        return out


class PiecewisePrefill:
    """`PrefillStep` with captured layers and the loop in Python."""

    def __init__(self, engine: PieceSource, slot: Slot) -> None:
        self.target = Model(engine, engine.target, slot.target_kv)
        self.features = slot.features
        self.head = None if engine.head is None else HeadPieces(engine, slot)
        self.draft = None if engine.draft is None or self.head is not None else \
            Model(engine, engine.draft, slot.draft_kv)

    def __call__(self, chunk: Tensor, positions: Tensor) -> None:
        """Write both models' K/V of the chunk [B, P] at positions [B, P] (a head's after the
        target's, whose features it reads)."""
        if self.draft is not None:
            self.draft.hidden(chunk, positions)
        x = self.target.hidden(chunk, positions)
        if self.head is not None:
            assert self.features is not None
            self.target.features(x, positions, self.features)
            self.head.layers(chunk, positions)
