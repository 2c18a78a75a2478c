"""What a backend offers, declared once: callers never probe a backend with getattr.

A backend loads models, drafters and tokenizers by name, turns ids into its arrays,
and runs generations. `CoreBackend` gives every method that runs a generation a
default that calls the core loop (`specsample.generate`); a backend with its own
engine (the static engine) overrides them, and callers cannot tell the difference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from specsample._array import Array
from specsample.core.protocols import Drafter, Model
from specsample.engine.generate import run_plain, run_rounds
from specsample.engine.options import RunOptions
from specsample.engine.runs import Generation, Step, finish

__all__ = ["Backend", "CoreBackend", "Tokenizer"]


@runtime_checkable
class Tokenizer(Protocol):
    """Text to ids and back (a Hugging Face tokenizer is one)."""

    eos_token_id: int | None

    def encode(self, text: str) -> list[int]:
        """The ids of `text` (no chat template)."""
        ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str:
        """The text of `ids`."""
        ...


@runtime_checkable
class Backend(Protocol):
    """A backend: arrays of its library, models by name, and the engine that runs them."""

    name: str

    def asarray(self, ids: object) -> Any:
        """Token ids as an int64 array of this backend."""
        ...

    def load_target(self, spec: str | None = None) -> Any:
        """The target `Model` named by `spec` (None: the backend's default)."""
        ...

    def load_drafter(self, name: str | None, target: Any) -> Any:
        """A `Drafter` for `target` named by `name` (None: the backend's default)."""
        ...

    def tokenizer(self, spec: str | None = None) -> Tokenizer:
        """The tokenizer of the target `spec` (None: the backend's default target)."""
        ...

    def iterate(self, target: Any, drafter: Any, input_ids: Any, run: RunOptions) -> Iterator[Step]:
        """Speculative rounds, one `Step` per round (or per host sync)."""
        ...

    def generate(self, target: Any, drafter: Any, input_ids: Any, run: RunOptions) -> Generation:
        """Speculative sampling to completion."""
        ...

    def generate_plain(self, target: Any, input_ids: Any, run: RunOptions) -> Generation:
        """Plain autoregressive sampling of the target (the baseline)."""
        ...

    def default_k(self, target: Any, drafter: Any) -> tuple[int, str] | None:
        """The K to run `drafter` at when the config gives none, and why; None: the
        drafter's default (`specsample.api.config`)."""
        ...


class CoreBackend:
    """Runs generations with the core loop; a subclass supplies loading and arrays."""

    name = "core"

    def asarray(self, ids: object) -> Any:
        """Token ids as an int64 array of this backend."""
        raise NotImplementedError

    def iterate(self, target: Model, drafter: Drafter, input_ids: Array, run: RunOptions) -> Iterator[Step]:
        """`specsample.engine.generate.run_rounds` over this backend's arrays."""
        return run_rounds(target, drafter, self.asarray(input_ids), self._run(run))

    def generate(self, target: Model, drafter: Drafter, input_ids: Array, run: RunOptions) -> Generation:
        """Rounds to completion, keeping only the last state."""
        run = self._run(run)
        ids = self.asarray(input_ids)
        return finish(self.iterate(target, drafter, ids, run), ids, run, target.vocab_size)

    def generate_plain(self, target: Model, input_ids: Array, run: RunOptions) -> Generation:
        """`specsample.engine.generate.run_plain` over this backend's arrays."""
        return run_plain(target, self.asarray(input_ids), self._run(run))

    def default_k(self, target: Model, drafter: Drafter) -> tuple[int, str] | None:
        """None: the drafter's default K (a backend that can rate K on its machine says so)."""
        return None

    def _run(self, run: RunOptions) -> RunOptions:
        """`run` with its array fields on this backend."""
        if not isinstance(run, RunOptions):
            raise TypeError(f"run: expected RunOptions, got {type(run).__name__}")
        if run.prompt_lengths is None:
            return run
        return dataclasses.replace(run, prompt_lengths=self.asarray(run.prompt_lengths))
