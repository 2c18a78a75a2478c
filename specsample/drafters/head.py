"""A feature-level draft head (EAGLE-style): drafts from the target's own hidden states.

The head is a `FeatureHead`: a Model whose input at position t is the token there and the
feature of position t - 1, read from its cache: the target's true feature where the
round has given it (`with_features`), else the head's own prediction, which each forward
writes at the positions not yet known. So a draft step feeds back the feature the head
just predicted, and after verification the committed positions hold the target's.

`HeadDrafter` is a `ModelDrafter` over such a head (thresholds, rollback by length and
the laws q are the same); it is a `FeatureDrafter`, so the round hands it the target's
features of every forward. What it drafts depends only on committed tokens, the target's
features of committed positions and its own samples: the output law stays the target's
whatever the head's weights, which decide only how many drafts are accepted.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from specsample._array import Array, check_int, device, namespace
from specsample.core.cache import Cache, rollback
from specsample.core.protocols import Model, TreeProposal, forward_select
from specsample.drafters.model import DraftRating, DraftState, ModelDrafter

__all__ = ["RECIPES", "DistillPlan", "FeatureHead", "HeadDrafter", "HeadTreeDrafter"]


def _needs_features(method: str, instead: str) -> TypeError:
    """The error of a drafter method that a feature head cannot serve without the target's
    features: the core round calls `instead` in its place."""
    return TypeError(f"{method}: the head reads the target's features; run it through the core round "
                     f"(specsample.generate), which calls {instead}")


@runtime_checkable
class FeatureHead(Model, Protocol):
    """A draft Model that reads the feature of the previous position from its cache."""

    def with_features(self, cache: Cache, features: Array, first: Array, known: Array) -> Cache:
        """`cache` (consumed) with the target's features [B, W, D] written at positions
        first[b] + j, and row b's features at positions < known[b] marked as the target's
        (a forward then keeps them; it writes its predictions at positions >= known[b])."""
        ...


class HeadDrafter(ModelDrafter):
    """Draft with a `FeatureHead` (see the module docstring).

    Args:
        head: the draft head.
        threshold: None or a confidence in (0, 1) (see `ModelDrafter`).
        rating: what the head states about itself (see `ModelDrafter`).
    """

    def __init__(self, head: FeatureHead, *, threshold: float | None = None,
                 rating: DraftRating | None = None) -> None:
        if not isinstance(head, FeatureHead):
            raise TypeError(f"head: expected a FeatureHead (a Model with with_features), got "
                            f"{type(head).__name__}")
        super().__init__(head, threshold=threshold, rating=rating)
        self.head = head

    def start(self, tokens: Array, lengths: Array, capacity: int) -> DraftState:
        """Not available: the head needs the target's features (`start_features`)."""
        raise _needs_features(f"{type(self).__name__}.start", "start_features")

    def advance(self, state: DraftState, lengths: Array) -> DraftState:
        """Not available: the head needs the target's features (`advance_features`)."""
        raise _needs_features(f"{type(self).__name__}.advance", "advance_features")

    def unfed_cache(self, tokens: Array, lengths: Array, capacity: int, features: Array | None) -> Cache:
        """A new head cache holding the target's features of the prompts (each but its last
        token's) and no K/V: what a prefill, or a later catch-up, feeds the prompts into."""
        cache = self.head.new_cache(int(tokens.shape[0]), capacity)
        if features is None:
            return cache
        return self.head.with_features(cache, features, namespace(lengths).zeros_like(lengths), lengths - 1)

    def start_features(self, tokens: Array, lengths: Array, capacity: int,
                       features: Array | None) -> DraftState:
        """Prefill the head with each prompt but its last token, its features the target's."""
        xp = namespace(lengths)
        cache = self.unfed_cache(tokens, lengths, capacity, features)
        width = int(xp.max(lengths))
        if width > 1:
            _, _, cache = forward_select(self.head, tokens[:, : width - 1], cache, None)
        return DraftState(cache=rollback(cache, lengths - 1), window=1)

    def advance_features(self, state: DraftState, lengths: Array, features: Array,
                         first: Array) -> DraftState:
        """Take the round's target features; roll the head back to the positions it computed
        from the target's features only, and feed the rest again next round.

        The round's forward covered positions first..first + W - 1; every position the head
        drafted from its own predictions is >= first + 1, so re-feeding the last W committed
        tokens recomputes them from the target's features. The committed tokens' features
        are the target's up to L - 2; position L - 1 holds a token the target has not read.
        """
        xp = namespace(lengths)
        width = int(features.shape[1])
        cache = self.head.with_features(state.cache, features, first, lengths - 1)
        return DraftState(cache=rollback(cache, xp.clip(lengths - width, min=0)), window=width)


class HeadTreeDrafter:
    """Depth-1 draft trees from a `FeatureHead` (a `specsample.core.protocols.FeatureTreeDrafter`): the
    head's `nodes` most likely next tokens after the committed context, as deterministic
    siblings below it, from one head step a round.

    `verify_tree` tries them in order as one-hot laws: at T = 0 the target's token is
    accepted when it is among them; at T > 0 the walk draws from p without replacement
    over them, so one is accepted with probability their total mass under p, and the
    final token comes from p less their mass. A wider fan-out costs verify positions
    only, not head steps, which is what a head with a low top-1 acceptance needs. The
    candidates are the largest of the head's logits over its support (ties to the lower
    id), read from committed tokens and the target's features of committed positions
    only: the output law is the target's whatever the head's weights.

    Args:
        head: the draft head.
        nodes: candidates per round, >= 1 and at most the head's support.
        rating: what the head states about itself (see `ModelDrafter`).
    """

    depth = 1

    def __init__(self, head: FeatureHead, *, nodes: int = 3, rating: DraftRating | None = None) -> None:
        self.drafter = HeadDrafter(head, rating=rating)
        self.rating = self.drafter.rating
        self.head = head
        self.nodes = check_int("nodes", nodes, 1)
        if nodes > self.drafter.proposable:
            raise ValueError(f"nodes: expected at most the head's {self.drafter.proposable} proposable ids, "
                             f"got {nodes}")

    def start(self, tokens: Array, lengths: Array, capacity: int) -> Any:
        """Not available: the head needs the target's features (`start_features`)."""
        raise _needs_features(f"{type(self).__name__}.start", "start_features")

    def advance(self, state: Any, lengths: Array) -> Any:
        """Not available: the head needs the target's features (`advance_features`)."""
        raise _needs_features(f"{type(self).__name__}.advance", "advance_features")

    def propose_tree(self, tokens: Array, lengths: Array, nodes: int, depth: int) -> TreeProposal:
        """Not available: the head drafts from its cache (`propose_from`)."""
        raise TypeError("HeadTreeDrafter.propose_tree: the head drafts from its state; run it through "
                        "the core round (specsample.generate), which calls propose_from")

    def start_features(self, tokens: Array, lengths: Array, capacity: int,
                       features: Array | None) -> DraftState:
        """As `HeadDrafter.start_features`."""
        return self.drafter.start_features(tokens, lengths, capacity, features)

    def advance_features(self, state: DraftState, lengths: Array, features: Array,
                         first: Array) -> DraftState:
        """As `HeadDrafter.advance_features`, with the accepted path's features."""
        return self.drafter.advance_features(state, lengths, features, first)

    def propose_from(self, state: DraftState, tokens: Array, lengths: Array, nodes: int, depth: int
                     ) -> tuple[TreeProposal, DraftState]:
        """The head's min(nodes, self.nodes) most likely next tokens per row, as siblings."""
        check_int("nodes", nodes, 1)
        check_int("depth", depth, 1)
        xp = namespace(tokens)
        chosen, state = self.drafter.candidates(state, tokens, lengths, min(nodes, self.nodes))
        full = xp.full(chosen.shape, -1, dtype=xp.int64, device=device(tokens))
        sizes = xp.full(lengths.shape, int(chosen.shape[1]), dtype=xp.int64, device=device(tokens))
        return TreeProposal(tokens=chosen, parents=full, sizes=sizes), state


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillPlan:
    """How `specsample distill` trains a head (a backend's `distill` reads it); the defaults
    are the shipped head's.

    Attributes:
        prompts: open training prompts; topics: how many topics they draw on (the
            recipes' 96, or more, up to the 422 there are); grounded: prompts that rework a
            given text (a
            passage sampled for an open prompt, or code); new_tokens: tokens sampled
            after each; temperature: the target's sampling temperature; batch: rows per
            sampling batch.
        temperatures: "" (every prompt at `temperature`), or comma-separated temperatures
            the prompts take in turn (e.g. "0,0.7,1").
        samples: continuations sampled per prompt (open and grounded), each with its own
            seed; the j-th sample of prompt i takes the (i + j)-th temperature in turn, so
            up to as many samples as temperatures give each prompt each temperature once (a
            prompt sampled twice at temperature 0 gives the same row twice).
        vocab: the draft vocabulary's size (the most frequent sampled tokens), 0 for all.
        epochs, lr, batch_rows, feature_weight, logit_weight, noise: training (rows per
            step; loss weights; feature noise, as a fraction of the features' std).
        label_temperature: the temperature at which the cross-entropy compares the head's
            law with the target's: 1, the target's law as it is (over the draft vocabulary,
            unnormalised); below 1, both sharpened (the target's renormalised over the draft
            vocabulary), which weighs the likeliest tokens, those greedy and low-temperature
            sampling keep, more, while a head that fits exactly still has the target's
            logits up to a constant and drafts at every temperature.
        unroll: training-time test (EAGLE-3): the head is unrolled this many draft steps on
            its own predicted features, with the attention drafting sees; step j's
            cross-entropy weighs unroll_weight ** j. 1: teacher forcing only.
        taps: "" (the head reads the target's top feature alone), or comma-separated indices
            of the target's layers whose outputs the head fuses with it (EAGLE-3's low and
            middle features, e.g. "2,15"); the samples are the same either way.
        layers: the head's decoder layers (1, EAGLE's; more give it capacity and cost as
            much more per draft step; the static engine runs one-layer heads only).
        k, held_out_tokens: the held-out acceptance probe.
        seed: every random choice.
    """

    prompts: int = 1152
    topics: int = 96
    grounded: int = 384
    new_tokens: int = 96
    temperature: float = 0.7
    temperatures: str = ""
    samples: int = 1
    batch: int = 32
    vocab: int = 8192
    epochs: int = 4
    lr: float = 3e-3
    batch_rows: int = 8
    feature_weight: float = 1.0
    logit_weight: float = 0.5
    noise: float = 0.05
    label_temperature: float = 1.0
    unroll: int = 1
    unroll_weight: float = 0.8
    taps: str = ""
    layers: int = 1
    k: int = 4
    held_out_tokens: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prompts", "topics", "new_tokens", "samples", "batch", "epochs", "batch_rows", "unroll",
                     "layers", "k", "held_out_tokens"):
            check_int(name, getattr(self, name), 1)
        if not isinstance(self.unroll_weight, (int, float)) or isinstance(self.unroll_weight, bool) or \
                not 0 < self.unroll_weight <= 1:
            raise ValueError(f"unroll_weight: expected a number in (0, 1], got {self.unroll_weight!r}")
        self.sampling_temperatures()  # validates
        self.tap_layers()  # validates
        check_int("vocab", self.vocab, 0)
        check_int("grounded", self.grounded, 0)
        check_int("seed", self.seed, 0)
        for name in ("temperature", "lr", "feature_weight", "logit_weight", "noise", "label_temperature"):
            value = getattr(self, name)
            positive = name in ("temperature", "lr", "label_temperature")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or \
                    (positive and value == 0):
                raise ValueError(f"{name}: expected a number {'> 0' if positive else '>= 0'}, "
                                 f"got {value!r}")

    def tap_layers(self) -> tuple[int, ...]:
        """The target's layers the head fuses with its top feature (() for none)."""
        if not isinstance(self.taps, str):
            raise TypeError(f"taps: expected a comma-separated string, got {self.taps!r}")
        if not self.taps.strip():
            return ()
        wrong = f"taps: expected comma-separated distinct layer indices >= 0, got {self.taps!r}"
        try:
            layers = tuple(int(x) for x in self.taps.split(","))
        except ValueError as err:
            raise ValueError(wrong) from err
        if any(i < 0 for i in layers) or len(set(layers)) != len(layers):
            raise ValueError(wrong)
        return layers

    def sampling_temperatures(self) -> tuple[float, ...]:
        """The temperatures the prompts are sampled at, in turn."""
        if not isinstance(self.temperatures, str):
            raise TypeError(f"temperatures: expected a comma-separated string, got {self.temperatures!r}")
        if not self.temperatures.strip():
            return (float(self.temperature),)
        wrong = f"temperatures: expected comma-separated numbers >= 0, got {self.temperatures!r}"
        try:
            values = tuple(float(x) for x in self.temperatures.split(","))
        except ValueError as err:
            raise ValueError(wrong) from err
        if any(not v >= 0 for v in values):
            raise ValueError(wrong)
        return values


# The heads' recipes: v1 (EAGLE-1: feature regression and cross-entropy, teacher forcing),
# v2 (EAGLE-3's training: tokens only, three unrolled draft steps, data at three
# temperatures, every prompt sampled twice), v3 (EAGLE-3's training on one sample per
# prompt, reading EAGLE-3's fused features: a low, a middle and the top layer of the
# 30-layer SmolLM2-135M).
_EAGLE3 = DistillPlan(temperatures="0,0.7,1", feature_weight=0.0, logit_weight=1.0, unroll=3, epochs=4,
                      new_tokens=128)
RECIPES = {
    "v1": DistillPlan(),
    "v2": dataclasses.replace(_EAGLE3, samples=2, epochs=2),
    "v3": dataclasses.replace(_EAGLE3, taps="2,15"),
}
