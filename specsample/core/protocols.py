"""The two protocols the core is generic over: a `Model` and a `Drafter`."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from specsample._array import Array, check_shape, namespace
from specsample.core.cache import Cache
from specsample.core.params import SamplingParams

__all__ = ["Drafter", "FeatureDrafter", "FeatureModel", "FeatureTreeDrafter", "Model", "Proposal",
           "SelectiveModel", "SkippingDrafter", "StatefulTreeDrafter", "TreeDrafter", "TreeModel",
           "TreeProposal", "check_columns",
           "forward_select", "reads_features"]


@runtime_checkable
class Model(Protocol):
    """A causal language model over a cache of fixed capacity.

    `forward(tokens [B, T], cache)` writes row b's tokens at positions
    `cache.lengths[b] + t` (t < T), attends to every position <= its own, and
    returns the next-token logits `[B, T, V]` together with the cache whose
    lengths are advanced by T. Positions at or beyond a row's length hold
    garbage that later writes overwrite; the causal mask by absolute position
    keeps them out of every query's view, so rollback is only a new `lengths`.

    A draft model may also have a `support` attribute: the ascending ids outside which its
    logits are always -inf (`specsample.drafters.model.draft_support`).
    """

    @property
    def vocab_size(self) -> int:
        """V, the number of logits per position."""
        ...

    def new_cache(self, batch: int, capacity: int) -> Cache:
        """An empty cache (lengths 0) for `batch` rows of `capacity` positions."""
        ...

    def forward(self, tokens: Array, cache: Cache) -> tuple[Array, Cache]:
        """Logits [B, T, V] for tokens [B, T] written at `cache.lengths`."""
        ...


@runtime_checkable
class FeatureModel(Model, Protocol):
    """A Model that can also return the hidden states its output head reads."""

    def forward_features(self, tokens: Array, cache: Cache) -> tuple[Array, Array, Cache]:
        """`forward`, with the features [B, T, D] (logits = head(features)) from the same pass."""
        ...


@runtime_checkable
class SelectiveModel(Model, Protocol):
    """A Model whose forward can skip the logits nobody reads.

    A prefill reads none of its logits, and a draft model that catches up on several
    committed tokens reads only the last one's; the output head over every position is
    about a fifth of a prefill's work (V = 49152, D = 576).
    """

    def forward_select(self, tokens: Array, cache: Cache, columns: Array | None, *,
                       features: bool = False) -> tuple[Array | None, Array | None, Cache]:
        """`forward`, with the logits of one column per row only: [B, V], row b's those of
        tokens[b, columns[b]]; `columns` None computes no logits (None). With `features`,
        also the features [B, T, D] of every column (as `FeatureModel.forward_features`),
        else None. The cache is written as by `forward`."""
        ...


def forward_select(model: Model, tokens: Array, cache: Cache, columns: Array | None, *,
                   features: bool = False) -> tuple[Array | None, Array | None, Cache]:
    """`SelectiveModel.forward_select` for any Model: the model's own where it has one, else
    its full forward (`forward_features` with `features`) with the wanted columns taken.

    Args:
        tokens: [B, T] ids written at `cache.lengths`.
        columns: int64 [B] in [0, T), or None for no logits (a prefill).
        features: also return the features [B, T, D] (the model must be a FeatureModel).
    """
    if isinstance(model, SelectiveModel):  # it checks its own inputs
        return model.forward_select(tokens, cache, columns, features=features)
    check_columns(columns, tokens)
    hidden = None
    if features:
        if not isinstance(model, FeatureModel):
            raise TypeError(f"model: features were asked for: expected a FeatureModel "
                            f"(forward_features), got {type(model).__name__}")
        logits, hidden, cache = model.forward_features(tokens, cache)
    else:
        logits, cache = model.forward(tokens, cache)
    if columns is None:
        return None, hidden, cache
    xp = namespace(logits)
    at = xp.broadcast_to(xp.astype(columns, xp.int64)[:, None, None],
                         (int(logits.shape[0]), 1, int(logits.shape[2])))
    return xp.take_along_axis(logits, at, axis=1)[:, 0, :], hidden, cache


def check_columns(columns: Array | None, tokens: Array) -> None:
    """Raise unless `columns` is None or an integer array [B] with values in [0, T) for
    `tokens` [B, T] (`forward_select`'s columns)."""
    if columns is None:
        return
    batch, width = (int(d) for d in tokens.shape)
    check_shape("columns", columns, (batch,))
    xp = namespace(columns)
    if not xp.isdtype(columns.dtype, "integral"):
        raise TypeError(f"columns: expected an integer array of column indices, got dtype {columns.dtype}")
    if batch and (bool(xp.any(columns < 0)) or bool(xp.any(columns >= width))):
        raise ValueError(f"columns: expected values in [0, {width}), got range "
                         f"[{int(xp.min(columns))}, {int(xp.max(columns))}]")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Proposal:
    """K drafted tokens per row and the laws they were sampled from.

    Attributes:
        tokens: int64 [B, K].
        probs: [B, K, V], the distributions the tokens were actually sampled
            from, or None for a deterministic drafter (q is one-hot).
        state: the drafter's new state.
        lengths: int64 [B] in [0, K], or None (all K): how many drafts each row
            verifies, decided while drafting from the draft's own samples (a
            stopping time of the draft process, which leaves the output law
            unchanged; a confidence threshold is one).
        parents: None (the drafts are a chain), or int64 [B, K]: the drafts as a tree
            below the last committed token, node i's parent (-1: that token) < i, siblings
            tried in order; the round then scores the tree in one forward and verifies
            it with `specsample.core.verify_tree.verify_tree` (`lengths`: each row's first
            nodes; `probs`: each node's law, None for deterministic candidates).
    """

    tokens: Array
    probs: Array | None
    state: Any
    lengths: Array | None = None
    parents: Array | None = None


@runtime_checkable
class Drafter(Protocol):
    """Proposes K tokens per row from the committed context.

    The committed context is `tokens [B, C]` (prompt then generated ids) with
    `lengths [B]` valid entries per row. A drafter keeps whatever state it
    needs (a draft model's cache, nothing for prompt lookup) as a value.
    """

    def start(self, tokens: Array, lengths: Array, capacity: int) -> Any:
        """The initial state after the prompt (`lengths` >= 1 per row)."""
        ...

    def propose(
        self,
        state: Any,
        tokens: Array,
        lengths: Array,
        k: int,
        params: SamplingParams,
        uniforms: Array,
    ) -> Proposal:
        """Draft k tokens per row using `uniforms [B, k]` for any sampling."""
        ...

    def advance(self, state: Any, lengths: Array) -> Any:
        """The state once the committed lengths have become `lengths [B]`."""
        ...

    def draft_lengths(self, tokens: Array, lengths: Array, k: int) -> Array:
        """How many of the k drafts each row verifies this round: int64 [B] in [0, k].

        It may read the committed context (never the target): a stopping rule of
        the draft process, which leaves the output law unchanged. A row with 0 takes
        a plain step; only a stateless drafter (state None) may give 0 to every row.
        """
        ...


@runtime_checkable
class SkippingDrafter(Drafter, Protocol):
    """A drafter with state that can sit out a round (a plain step, K = 0).

    `skip` gives the state after a round in which it proposed nothing; `advance` then
    moves it to the new committed lengths as after any round.
    """

    def skip(self, state: Any) -> Any:
        """The state after a round without a proposal."""
        ...


@runtime_checkable
class FeatureDrafter(Drafter, Protocol):
    """A drafter that reads the target's features (a feature-level draft head).

    The round gives it the features of every target forward instead of calling `start`
    and `advance`: the target must be a `FeatureModel`. Its drafts still depend only on
    committed tokens, the target's features of committed positions and its own samples,
    so the output law is unchanged whatever it does with them.
    """

    def start_features(self, tokens: Array, lengths: Array, capacity: int,
                       features: Array | None) -> Any:
        """`start`, with the target's features [B, T - 1, D] of positions 0..T-2 of the
        prompt buffer (None when T = 1)."""
        ...

    def advance_features(self, state: Any, lengths: Array, features: Array, first: Array) -> Any:
        """`advance`, with the features [B, W, D] of the round's target forward, whose
        column j is position first[b] + j of row b."""
        ...


def reads_features(drafter: object) -> bool:
    """Whether the round hands `drafter` the target's features instead of calling `start` and
    `advance`: a chain `FeatureDrafter`, or a tree drafter with the same two methods
    (`specsample.engine.tree.FeatureTreeDrafter`)."""
    return all(callable(getattr(drafter, name, None)) for name in ("start_features", "advance_features"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TreeProposal:
    """A draft tree per row (static shapes: N nodes per row, the first `sizes[b]` used).

    Attributes:
        tokens: int64 [B, N], node i's token.
        parents: int64 [B, N], node i's parent (-1: the last committed token), < i.
        sizes: int64 [B] in [0, N].
        probs: [B, N, V], the law each node was drawn from, or None (deterministic).
    """

    tokens: Array
    parents: Array
    sizes: Array
    probs: Array | None = None


@runtime_checkable
class TreeModel(Model, Protocol):
    """A Model that can score a token tree in one pass and commit a path of it."""

    def forward_tree(self, tokens: Array, parents: Array, cache: Cache) -> tuple[Array, Cache]:
        """Logits [B, T, V] of tokens [B, T] with parents [B, T] (-1: the context)."""

    def commit_path(self, cache: Cache, first: Array, path: Array) -> Cache:
        """Move the entries at slots first + path[b, j] to first + j."""


@runtime_checkable
class TreeDrafter(Protocol):
    """Proposes a draft tree per row from the committed tokens, within its budget: at most
    `nodes` nodes and `depth` levels."""

    nodes: int
    depth: int

    def start(self, tokens: Array, lengths: Array, capacity: int) -> Any:
        """The initial state after the prompt."""

    def advance(self, state: Any, lengths: Array) -> Any:
        """The state after a round committed up to `lengths`."""

    def propose_tree(self, tokens: Array, lengths: Array, nodes: int, depth: int) -> TreeProposal:
        """A tree of at most `nodes` nodes and `depth` levels per row."""


@runtime_checkable
class StatefulTreeDrafter(TreeDrafter, Protocol):
    """A tree drafter that keeps state between rounds (a draft model's cache): the round asks
    it for a tree with its state (`propose_from`) instead of calling `propose_tree`."""

    def propose_from(self, state: Any, tokens: Array, lengths: Array, nodes: int, depth: int
                     ) -> tuple[TreeProposal, Any]:
        """A tree of at most `nodes` nodes and `depth` levels per row, and the state after it."""


@runtime_checkable
class FeatureTreeDrafter(StatefulTreeDrafter, Protocol):
    """A tree drafter that reads the target's features (a feature-level draft head): the round
    gives it the features of the committed positions of every forward instead of calling
    `start` and `advance`, and asks it for a tree with its state (`propose_from`). Its trees
    still depend only on committed tokens and the target's features of committed positions,
    so the output law is unchanged whatever it does with them."""

    def start_features(self, tokens: Array, lengths: Array, capacity: int,
                       features: Array | None) -> Any:
        """`start`, with the target's features [B, T - 1, D] of positions 0..T-2 of the
        prompt buffer (None when T = 1)."""

    def advance_features(self, state: Any, lengths: Array, features: Array, first: Array) -> Any:
        """`advance`, with the features [B, W, D] of the round's committed path: column j is
        position first[b] + j of row b (the last committed token's, then the accepted
        nodes'; columns past a row's accepted path are not the target's and are ignored)."""
