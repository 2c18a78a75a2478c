"""One frozen type for everything a run takes besides the models and the prompts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from specsample._array import Array, check_int
from specsample.core.params import SamplingParams
from specsample.core.rng import Seed, row_seeds
from specsample.core.verifiers import get_verifier
from specsample.core.verify import Verdict
from specsample.engine.policy import ConstantK, KPolicy

__all__ = ["RunOptions"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """The settings of one generation, the same for every backend.

    A backend runs all of them or rejects a field it cannot honour with a clear error
    (`unsupported`); it never ignores one.

    Attributes:
        max_new_tokens: per-row budget of generated tokens, >= 1.
        params: sampling parameters (the same warp for p and q).
        k: draft tokens per round (an int >= 1) or a KPolicy.
        seed: the key of the uniforms: one int for the batch, or one int per row (a row's
            tokens then depend on its own seed and prompt only, not on its neighbours).
        eos_token_id: a token that ends its row (kept in the output), or None.
        prompt_lengths: int [B], where each right-padded prompt ends (None: all T).
        capacity: positions per cache row (None: just enough).
        check: validate every verify input (a host sync per round).
        verifier: the acceptance rule by name ("token") or a callable with `verify`'s signature.
        pad_id: the id written after each row's end in `Generation.sequences`.
    """

    max_new_tokens: int
    params: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    k: int | KPolicy = 4
    seed: Seed = 0
    eos_token_id: int | None = None
    prompt_lengths: Array | None = None
    capacity: int | None = None
    check: bool = True
    verifier: str | Callable[..., Verdict] = "token"
    pad_id: int = 0

    def __post_init__(self) -> None:
        check_int("max_new_tokens", self.max_new_tokens, 1)
        if not isinstance(self.params, SamplingParams):
            raise TypeError(f"params: expected SamplingParams, got {type(self.params).__name__}")
        if not isinstance(self.k, KPolicy):
            check_int("k", self.k, 1)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            row_seeds(self.seed, len(self.seed))  # type: ignore[arg-type]
        else:
            row_seeds(self.seed, 1)
        if self.eos_token_id is not None:
            check_int("eos_token_id", self.eos_token_id, 0)
        if self.capacity is not None:
            check_int("capacity", self.capacity, 2)
        if not isinstance(self.check, bool):
            raise TypeError(f"check: expected a bool, got {type(self.check).__name__}")
        get_verifier(self.verifier)
        check_int("pad_id", self.pad_id, -(2**62))

    @property
    def policy(self) -> KPolicy:
        """`k` as a KPolicy (an int is a constant K)."""
        return self.k if isinstance(self.k, KPolicy) else ConstantK(k=self.k)

    @property
    def verify(self) -> Callable[..., Verdict]:
        """The acceptance rule `verifier` names."""
        return get_verifier(self.verifier)

    def rows(self, batch: int) -> None:
        """Check the per-row fields against a batch of `batch` rows."""
        if not isinstance(self.seed, int):
            row_seeds(self.seed, batch)

    def unsupported(self, backend: str, **defaults: Any) -> None:
        """Raise ValueError naming each field that differs from what `backend` can run.

        Args:
            backend: the backend's name, for the message.
            defaults: field name -> the only value the backend supports.
        """
        for name, value in defaults.items():
            given = getattr(self, name)
            if given != value:
                raise ValueError(f"{name}: the {backend} backend supports only {value!r}, got "
                                 f"{given!r}")
