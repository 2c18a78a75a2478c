"""Hugging Face causal LMs as the core's `Model`: preallocated K/V, writes by position."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, overload

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache as HFCache

from specsample.core.cache import Cache, check_live, consume, rollback
from specsample.core.protocols import check_columns

from ._fast import (
    SMALL_ROWS,
    DenseLinear,
    LlamaStack,
    architecture,
    attention_mask,
    hf_config,
    is_supported,
    move_path,
    tree_mask,
)
from ._forward import llama_features
from .kernels import choose_small_rows
from .parallel import TensorParallel

__all__ = ["NO_LOGITS", "HFModel", "selected_columns"]

# The `select` of `HFModel._run` and `HeadModel._run` for a forward that computes no logits
# (a prefill).
NO_LOGITS = object()

Buffers = tuple[tuple[Tensor, Tensor], ...]  # per layer (K, V), each [B, H_kv, C, hd]


def selected_columns(columns: object, tokens: Tensor) -> Tensor:
    """`columns` checked (`check_columns`: [B] integers in [0, T) for tokens [B, T]) as an
    int64 tensor on the tokens' device."""
    if not isinstance(columns, Tensor):
        raise TypeError(f"columns: expected None or a torch tensor, got {type(columns).__name__}")
    check_columns(columns, tokens)
    return columns.to(device=tokens.device, dtype=torch.int64)


class _PositionCache(HFCache):
    """A transformers Cache over preallocated buffers: `update` writes by position.

    `index` [B, H_kv, T, hd] holds each new token's absolute position; the full
    buffers are returned and the 4-D mask hides every position after a query.
    """

    def __init__(self, buffers: Buffers, index: Tensor) -> None:
        super().__init__(layers=[])
        self.buffers, self.index = buffers, index

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Scatter [B, H_kv, T, hd] at the positions; return the [B, H_kv, C, hd] buffers."""
        keys, values = self.buffers[layer_idx]
        keys.scatter_(2, self.index, key_states)
        values.scatter_(2, self.index, value_states)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Unused: positions are always passed explicitly."""
        return 0


def _kv_shape(config: Any) -> tuple[int, int, int]:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, getattr(config, "num_key_value_heads", None) or heads, head_dim


class HFModel:
    """A transformers causal LM as a specsample `Model` (torch tensors in and out).

    K/V buffers are allocated once per cache; every forward writes row b's
    tokens at positions `lengths[b] + t` and a query at position i sees keys
    j <= i, so rollback is a new `lengths` and the storage never moves. Llama
    models take a compact fast path over the same weights (no copy, except a
    oneDNN-packed float32 copy on CPU); others go through the module's own
    forward with a custom transformers Cache and a 4-D mask.

    Args:
        model: an `AutoModelForCausalLM` instance (standard or grouped-query attention).
        dtype: convert the model to this dtype in place (default: keep its own).
        fast: use the fast path (default: when the architecture is in `_fast.ARCHITECTURES`).
        vocab_size: pad (with -inf) or truncate the logits to this V, for a draft
            model whose embedding rows are padded (see `compat.check_compatible`).
        parallel: shard the model in place over this mesh (tensor parallelism; see
            `parallel.TensorParallel`): each rank holds its heads' K/V, every rank gets
            the full logits.
    """

    def __init__(self, model: nn.Module, *, dtype: torch.dtype | None = None,
                 fast: bool | None = None, vocab_size: int | None = None,
                 parallel: TensorParallel | None = None) -> None:
        if not isinstance(model, nn.Module) or not hasattr(model, "config"):
            raise TypeError(f"model: expected a transformers causal LM (nn.Module with a config), "
                            f"got {type(model).__name__}")
        if dtype is not None and next(model.parameters()).dtype != dtype:
            model.to(dtype=dtype)
        if fast:
            architecture(model)  # raises, naming the supported architectures
        if parallel is not None:
            parallel.shard(model)
        self.parallel = parallel
        # The verify's cost per width on this machine (`loading._width_cost`), measured once
        # for this target and shared by every drafter loaded for it.
        self.verify_costs: Any = None
        self.module = model.eval()
        first = next(model.parameters())
        self.dtype, self.device = first.dtype, first.device
        self.layers, self.kv_heads, self.head_dim = _kv_shape(model.config)
        self.kv_heads //= 1 if parallel is None else parallel.size  # this rank's K/V heads
        self.stack = LlamaStack.of(model, parallel=parallel) \
            if (is_supported(model) if fast is None else fast) else None
        self.own_vocab = int(hf_config(model).vocab_size)
        self.vocab = self.own_vocab if vocab_size is None else int(vocab_size)
        self._slots = torch.arange(1 << 16, device=self.device)  # key positions, sliced to C
        self.taps: tuple[int, ...] = ()  # layers whose outputs the features carry too (`tap`)
        # Which kernel the decoder linears use for 1 to 3 rows, and the timings behind it
        # (`kernels.choose_small_rows`: measured on this machine once per module).
        self.small_rows: tuple[frozenset[int], dict[str, float]] = (frozenset(SMALL_ROWS), {})
        if self.stack is not None and parallel is None:
            self.small_rows = choose_small_rows(model, self.stack, self._probe())

    def _probe(self) -> Callable[[int], None]:
        """width -> one forward of that many positions after a 16-token context (timing only)."""
        context = (torch.arange(1, 17, device=self.device) % self.vocab)[None, :]
        state: list[Cache] = []

        def forward(width: int) -> None:
            with torch.no_grad():
                if not state:
                    state.append(self.forward(context, self.new_cache(1, 20))[1])
                at = torch.full((1,), 16, dtype=torch.int64, device=self.device)
                _, cache = self.forward(context[:, :width], rollback(state.pop(), at))
                state.append(cache)
        return forward

    @property
    def vocab_size(self) -> int:
        """V, the number of logits per position."""
        return self.vocab

    def derive(self, *, num_layers: int | None = None,
               linear: Callable[[DenseLinear], Callable[[Tensor], Tensor]] | None = None) -> HFModel:
        """A self-draft sharing these weights: the first `num_layers` layers, linears mapped.

        Args:
            num_layers: keep layers [0, num_layers) then the final norm and head.
            linear: replaces every linear (e.g. by an int8 one); None keeps them.
        """
        if self.stack is None:
            raise ValueError(f"derive: needs the fast path, got a {type(self.module).__name__}")
        if num_layers is not None and not 1 <= num_layers <= len(self.stack.layers):
            raise ValueError(f"num_layers: expected an int in [1, {len(self.stack.layers)}], "
                             f"got {num_layers!r}")
        other = copy.copy(self)
        other.stack = self.stack.derive(num_layers=num_layers, linear=linear)
        other.layers = len(other.stack.layers)
        other.taps = ()
        return other

    def check_taps(self, layers: tuple[int, ...]) -> None:
        """Raise ValueError unless `layers` are distinct indices of layers this model can tap."""
        if not isinstance(layers, tuple) or len(set(layers)) != len(layers) or any(
                isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.layers - 1
                for i in layers):
            raise ValueError(f"layers: expected a tuple of distinct layer indices in [0, {self.layers - 1}) "
                             f"(the last layer's output is the final norm's input, already carried), "
                             f"got {layers!r}")

    def tap(self, layers: tuple[int, ...]) -> None:
        """Make the features (`forward_features` and the other feature forwards) carry, after
        the final norm's output, the outputs of these decoder layers (the residual stream after
        each, in this order): [B, T, D * (1 + len(layers))]. A draft head that fuses the
        target's low and middle layers with its top one (EAGLE-3) reads them; a head that
        reads the top one alone takes the first D columns. () asks for none (and leaves any
        set for another head).

        Raises:
            ValueError: `layers` not distinct layer indices of this model, or other taps already
                set (two heads fusing different layers cannot share one target).
        """
        self.check_taps(layers)
        if not layers:
            return
        if self.taps and self.taps != layers:
            raise ValueError(f"layers: this target's features already carry layers {self.taps} for "
                             f"another head, got {layers}: load the second head on its own target")
        self.taps = layers

    def new_cache(self, batch: int, capacity: int) -> Cache:
        """An empty cache: per layer K and V [batch, H_kv, capacity, hd], lengths 0."""
        for name, value in (("batch", batch), ("capacity", capacity)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if capacity > self._slots.shape[0]:
            self._slots = torch.arange(capacity, device=self.device)
        shape = (batch, self.kv_heads, capacity, self.head_dim)
        with torch.inference_mode():
            buffers = tuple((torch.zeros(shape, dtype=self.dtype, device=self.device),
                             torch.zeros(shape, dtype=self.dtype, device=self.device))
                            for _ in range(self.layers))
            lengths = torch.zeros(batch, dtype=torch.int64, device=self.device)
        return Cache(lengths=lengths, capacity=capacity, buffers=buffers)

    def _check(self, tokens: Any, cache: Any) -> int:
        """Check the inputs; the longest row's cache length."""
        if not isinstance(tokens, Tensor) or tokens.dtype != torch.int64 or tokens.ndim != 2:
            raise TypeError(f"tokens: expected an int64 torch tensor [B, T], got "
                            f"{type(tokens).__name__} {getattr(tokens, 'dtype', '')} with shape "
                            f"{list(getattr(tokens, 'shape', []))}")
        if not isinstance(cache, Cache) or not isinstance(cache.buffers, tuple) or \
                len(cache.buffers) != self.layers:
            raise TypeError(f"cache: expected a Cache from this model's new_cache ({self.layers} "
                            f"layers), got {type(cache).__name__}")
        if tokens.shape[0] != cache.batch or tokens.shape[1] < 1:
            raise ValueError(f"tokens: expected shape [{cache.batch}, T >= 1], got {list(tokens.shape)}")
        if tokens.device != self.device:
            raise ValueError(f"tokens: expected device {self.device}, got {tokens.device}")
        low, high = int(cache.lengths.min()), int(cache.lengths.max())
        if low < 0 or high + tokens.shape[1] > cache.capacity:
            raise ValueError(f"cache: lengths + T must lie in [0, {cache.capacity}] (capacity), got "
                             f"lengths in [{low}, {high}] and T = {tokens.shape[1]}")
        return high

    def forward(self, tokens: Tensor, cache: Cache) -> tuple[Tensor, Cache]:
        """Logits [B, T, V] (float32, or float64 for a float64 model) for tokens [B, T].

        The K/V buffers of `cache` are updated in place: the forward consumes
        `cache` (see `specsample.core.cache`); use the returned one, whose lengths are
        advanced by T.
        """
        logits, _, cache = self._run(tokens, cache, features=False)
        return logits, cache

    def forward_features(self, tokens: Tensor, cache: Cache) -> tuple[Tensor, Tensor, Cache]:
        """`forward`, also returning the features [B, T, D] the output head reads (the final
        norm's output, in the model dtype) from the same pass; a feature-level draft head
        reads them. With `tap`ped layers, [B, T, D * (1 + taps)]: their outputs follow."""
        logits, features, cache = self._run(tokens, cache, features=True)
        assert features is not None
        return logits, features, cache

    def forward_select(self, tokens: Tensor, cache: Cache, columns: Tensor | None, *,
                       features: bool = False) -> tuple[Tensor | None, Tensor | None, Cache]:
        """`forward` with the logits of one column per row only ([B, V]: row b's at
        columns[b]), or none for `columns` None (a prefill); with `features`, also every
        column's features [B, T, D] (`specsample.core.protocols.SelectiveModel`). The output head
        reads only the selected columns' features, so the logits are `forward`'s there."""
        logits, hidden, cache = self._run(tokens, cache, features=features,
                                          select=NO_LOGITS if columns is None else columns)
        return logits, hidden, cache

    def forward_tree(self, tokens: Tensor, parents: Tensor, cache: Cache) -> tuple[Tensor, Cache]:
        """Logits [B, T, V] for a tree of tokens [B, T] in one pass (a draft tree's verify).

        Token t's parent is parents[b, t] (-1: the committed context; always < t). Its
        position is the cache length plus its number of ancestors, and it attends the
        committed context, its ancestors and itself only.
        K/V are written at consecutive slots lengths + t, and the returned cache's lengths
        are advanced by T; `commit_path` then moves an accepted path's entries into place.
        """
        logits, _, cache = self._tree(tokens, parents, cache, features=False)
        return logits, cache

    def forward_tree_features(self, tokens: Tensor, parents: Tensor, cache: Cache
                              ) -> tuple[Tensor, Tensor, Cache]:
        """`forward_tree`, also returning each node's features [B, T, D] (the final norm's
        output, as `forward_features` gives them) from the same pass: a feature-level draft
        head reads those of the accepted path."""
        logits, features, cache = self._tree(tokens, parents, cache, features=True)
        assert features is not None
        return logits, features, cache

    def _tree(self, tokens: Tensor, parents: Tensor, cache: Cache, *, features: bool
              ) -> tuple[Tensor, Tensor | None, Cache]:
        self._check(tokens, cache)
        if not isinstance(parents, Tensor) or parents.shape != tokens.shape or \
                parents.dtype != torch.int64:
            raise TypeError(f"parents: expected an int64 tensor shaped like tokens "
                            f"{list(tokens.shape)}, got {type(parents).__name__} "
                            f"{getattr(parents, 'dtype', '')} {list(getattr(parents, 'shape', []))}")
        index = self._slots[:tokens.shape[1]][None, :]
        if bool(((parents < -1) | (parents >= index)).any()):
            raise ValueError("parents: expected -1 or an earlier token's index for every token")
        if self.stack is not None and self.stack.window is not None:
            raise ValueError(f"tokens: a tree verify needs full attention, got a sliding window "
                             f"of {self.stack.window}")
        return self._run(tokens, cache, features=features, parents=parents)

    def commit_path(self, cache: Cache, first: Tensor, path: Tensor) -> Cache:
        """Move the K/V of an accepted tree path into place: the entries at slots
        first + path[b, j] go to first + j, for each j with path[b, j] >= 0.

        Args:
            cache: the cache `forward_tree` returned (consumed).
            first: int64 [B], the slot of the tree's first node (the length before it).
            path: int64 [B, D], node indices along the accepted path (increasing), then -1.
        """
        check_live(cache)
        with torch.inference_mode():
            # Usually nothing moves: a chain's path, a first candidate's hit and a miss are
            # already in place (path[b, j] is j or -1). One host read then saves a gather
            # and a scatter per layer and buffer.
            index = self._slots[:path.shape[1]][None, :]
            if bool(((path >= 0) & (path != index)).any()):
                for keys, values in cache.buffers:
                    move_path(keys, values, first, path)
        return consume(cache, lengths=cache.lengths, buffers=cache.buffers)

    @overload
    def _run(self, tokens: Tensor, cache: Cache, *, features: bool, parents: Tensor | None = None
             ) -> tuple[Tensor, Tensor | None, Cache]: ...

    @overload
    def _run(self, tokens: Tensor, cache: Cache, *, features: bool, parents: Tensor | None = None,
             select: Tensor | object) -> tuple[Tensor | None, Tensor | None, Cache]: ...

    def _run(self, tokens: Tensor, cache: Cache, *, features: bool, parents: Tensor | None = None,
             select: Tensor | object = None) -> tuple[Tensor | None, Tensor | None, Cache]:
        """The forward; `select`: None for every column's logits, `NO_LOGITS` for none, or
        [B] integer columns, one per row, whose logits alone are computed ([B, V])."""
        high = self._check(tokens, cache)
        check_live(cache)
        if select is not None and select is not NO_LOGITS:
            select = selected_columns(select, tokens)
        width = tokens.shape[1]
        with torch.inference_mode():
            slots = cache.lengths[:, None] + self._slots[:width]  # [B, T]
            window = None if self.stack is None else self.stack.window
            # The fast path attends the slots in use only (up to the longest row's end),
            # not the whole capacity: the cost follows the length, not the reservation.
            span = high + width if self.stack is not None else cache.capacity
            if parents is None:
                positions = slots
                mask = attention_mask(self._slots[:span], positions, window)  # [B, 1, T, span]
            else:
                positions, mask = tree_mask(cache.lengths, parents, self._slots[:span])
            logits: Tensor | None
            kept: list[Tensor] = []
            if self.stack is None:
                logits, hidden = self._generic(tokens, positions, mask, cache.buffers, features, slots, kept)
                if select is NO_LOGITS:
                    logits = None
                elif isinstance(select, Tensor):
                    logits = logits[torch.arange(tokens.shape[0], device=self.device), select]
            else:
                hidden = llama_features(self.stack, tokens, positions, mask, cache.buffers,
                                        None if parents is None else slots,
                                        self.taps if features else (), kept)
                if select is None:
                    logits = self.stack.head(hidden)
                elif isinstance(select, Tensor):  # [B, 1, D] -> [B, V]
                    at = select[:, None, None].expand(-1, 1, hidden.shape[2])
                    logits = self.stack.head(hidden.gather(1, at))[:, 0]
                else:
                    logits = None
            if logits is not None:
                logits = self._resize(logits if logits.dtype == torch.float64 else logits.float())
            lengths = cache.lengths + width
            if features and kept:
                assert hidden is not None
                hidden = torch.cat([hidden, *kept], dim=-1)
        return logits, hidden if features else None, consume(cache, lengths=lengths, buffers=cache.buffers)

    def _generic(self, tokens: Tensor, positions: Tensor, mask: Tensor, buffers: Buffers,
                 features: bool, slots: Tensor, kept: list[Tensor]) -> tuple[Tensor, Tensor | None]:
        batch, width = tokens.shape
        index = slots[:, None, :, None].expand(batch, self.kv_heads, width, self.head_dim)
        # Additive, so that eager attention (mask added to the scores) and SDPA agree.
        bias = torch.zeros(mask.shape, dtype=self.dtype, device=self.device).masked_fill_(
            ~mask, torch.finfo(self.dtype).min)
        out = self.module(input_ids=tokens, attention_mask=bias, position_ids=positions,
                          cache=_PositionCache(buffers, index), use_cache=True,
                          output_hidden_states=features)
        logits: Tensor = out.logits  # [B, T, V]
        # The last hidden state is the final norm's output, the one the head reads; entry
        # i + 1 is layer i's output (entry 0 the embedding).
        if features:
            kept.extend(out.hidden_states[i + 1] for i in self.taps)
        return logits, out.hidden_states[-1] if features else None

    def _resize(self, logits: Tensor) -> Tensor:
        if self.vocab == logits.shape[-1]:
            return logits
        if self.vocab < logits.shape[-1]:
            return logits[..., : self.vocab]
        pad = logits.new_full((*logits.shape[:-1], self.vocab - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)
