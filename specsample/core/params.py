"""Sampling parameters: the one transform applied to both target and draft logits."""

from __future__ import annotations

import dataclasses
import math

__all__ = ["SamplingParams"]


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value}")
    return float(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Temperature, then top-k, then top-p, then min-p (None: off).

    Attributes:
        temperature: >= 0; 0 means greedy (a one-hot at the argmax).
        top_k: keep the k most likely tokens (ties at the k-th value kept), k >= 1.
        top_p: keep the smallest most-likely set with mass >= top_p, in (0, 1].
        min_p: keep tokens with probability >= min_p * max probability, in [0, 1].
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        if _number("temperature", self.temperature) < 0:
            raise ValueError(f"temperature: expected >= 0, got {self.temperature}")
        if self.top_k is not None:
            if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
                raise TypeError(f"top_k: expected an int or None, got {type(self.top_k).__name__} "
                                f"{self.top_k!r}")
            if self.top_k < 1:
                raise ValueError(f"top_k: expected >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0 < _number("top_p", self.top_p) <= 1:
            raise ValueError(f"top_p: expected a value in (0, 1] or None, got {self.top_p}")
        if self.min_p is not None and not 0 <= _number("min_p", self.min_p) <= 1:
            raise ValueError(f"min_p: expected a value in [0, 1] or None, got {self.min_p}")

    @property
    def greedy(self) -> bool:
        """True when temperature is 0."""
        return self.temperature == 0
