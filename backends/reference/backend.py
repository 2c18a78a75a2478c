"""The `reference` backend object: NumPy arrays, toy n-gram models by spec string."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray
from specsample_backends.reference.ngram import NGramModel, random_ngram

from specsample.api.backend import CoreBackend
from specsample.api.draft_names import compose_drafter
from specsample.core.protocols import Drafter, Model
from specsample.drafters.model import ModelDrafter

__all__ = ["ReferenceBackend", "ToyTokenizer", "create", "parse_spec"]

DEFAULT_TARGET = "ngram:vocab=8,order=2,seed=0"
DEFAULT_DRAFT = "noisy:0.3"
_NGRAM_KEYS = {"vocab": int, "order": int, "seed": int, "concentration": float, "zeros": float}


def parse_spec(spec: str) -> dict[str, int | float]:
    """`"ngram:vocab=8,order=2"` -> {"vocab": 8, "order": 2} (defaults filled in)."""
    kind, _, rest = spec.partition(":")
    if kind != "ngram":
        raise ValueError(f"target: expected 'ngram[:vocab=V,order=N,seed=S,concentration=C,zeros=Z]', "
                         f"got {spec!r}")
    values: dict[str, int | float] = {"vocab": 8, "order": 2, "seed": 0, "concentration": 1.0,
                                      "zeros": 0.0}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in _NGRAM_KEYS:
            raise ValueError(f"target: unknown key {key!r} in {spec!r}; known: {sorted(_NGRAM_KEYS)}")
        try:
            values[key] = _NGRAM_KEYS[key](value)
        except ValueError as err:
            raise ValueError(f"target: {key} expected {_NGRAM_KEYS[key].__name__}, got {value!r} "
                             f"in {spec!r}") from err
    return values


class ToyTokenizer:
    """Characters to ids of a toy model's vocabulary, for scripts that pass text.

    A character's id is its code point modulo V; an id decodes to the id-th symbol
    of `SYMBOLS`. Lossy by design (V is small): it lets one script run on every
    backend, not reproduce text. No end-of-sequence token.
    """

    SYMBOLS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    eos_token_id: int | None = None
    chat_template: str | None = None

    def __init__(self, vocab: int) -> None:
        if not 2 <= vocab <= len(self.SYMBOLS):
            raise ValueError(f"vocab: the toy tokenizer covers V in [2, {len(self.SYMBOLS)}], got {vocab}")
        self.vocab = vocab

    def encode(self, text: str) -> list[int]:
        """One id per character: its code point modulo V."""
        if not isinstance(text, str) or not text:
            raise ValueError(f"text: expected a non-empty string, got {text!r}")
        return [ord(c) % self.vocab for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """One symbol per id."""
        return "".join(self.SYMBOLS[int(i)] for i in ids)


class ReferenceBackend(CoreBackend):
    """NumPy float64, eager: the oracle every other backend is compared with."""

    name = "reference"

    def __init__(self, options: Mapping[str, object]) -> None:
        if options:
            raise ValueError(f"options: the reference backend takes none, got {sorted(options)}")

    def asarray(self, ids: object) -> NDArray[np.int64]:
        """Token ids as an int64 NumPy array."""
        return np.asarray(ids, dtype=np.int64)

    def load_target(self, spec: str | None = None) -> NGramModel:
        """A toy n-gram model from a spec string (default: `DEFAULT_TARGET`)."""
        values = parse_spec(spec or DEFAULT_TARGET)
        return random_ngram(int(values["vocab"]), order=int(values["order"]), seed=int(values["seed"]),
                            concentration=float(values["concentration"]), zeros=float(values["zeros"]))

    def tokenizer(self, spec: str | None = None) -> ToyTokenizer:
        """The toy tokenizer of the target `spec`'s vocabulary."""
        return ToyTokenizer(int(parse_spec(spec or DEFAULT_TARGET)["vocab"]))

    def load_drafter(self, name: str | None, target: Model) -> Drafter:
        """'noisy:E' (the target's table mixed with E of another), 'lookup', an ngram spec,
        'hybrid[:NAME]', 'auto[:NAME]' or a model draft's name with '@T'
        (`specsample.api.draft_names.compose_drafter`)."""
        return compose_drafter(name or DEFAULT_DRAFT, lambda inner: self._named_drafter(inner, target),
                               default_model=DEFAULT_DRAFT, cost=lambda drafter: _cost_ratio(target, drafter))

    def _named_drafter(self, name: str, target: Model) -> Drafter:
        if name == "lookup":
            from specsample.drafters.lookup import PromptLookupDrafter

            return PromptLookupDrafter()
        if name.startswith("noisy:") and isinstance(target, NGramModel):
            return ModelDrafter(noisy(target, float(name.split(":", 1)[1])))
        if name.startswith("ngram"):
            return ModelDrafter(self.load_target(name))
        raise ValueError(f"draft: expected 'noisy:E', 'lookup', 'ngram:...', 'hybrid[:NAME]' or "
                         f"NAME@THRESHOLD, got {name!r}")


def _cost_ratio(target: Model, drafter: ModelDrafter) -> float:
    """c of `drafter` against `target` on this machine (medians of 5 timed steps each, in turn)."""
    from specsample.core.params import SamplingParams
    from specsample.engine.cost import measure_cost_ratio

    prompt = (np.arange(1, 17, dtype=np.int64) % target.vocab_size)[None, :]
    return measure_cost_ratio(target, drafter, prompt, SamplingParams(), repeats=5)


def noisy(target: NGramModel, weight: float, *, seed: int = 12345) -> NGramModel:
    """A draft close to `target`: (1 - weight) * target + weight * another random table."""
    if not 0 <= weight <= 1:
        raise ValueError(f"weight: expected a value in [0, 1], got {weight}")
    other = random_ngram(target.vocab_size, order=target.order, seed=seed).table
    table = (1 - weight) * target.table + weight * other
    return NGramModel(table / table.sum(axis=-1, keepdims=True))


def create(options: Mapping[str, object]) -> ReferenceBackend:
    """The registry's factory."""
    return ReferenceBackend(options)
