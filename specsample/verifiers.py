"""Verification rules by name: "token" (Leviathan et al. 2023) and "block" (Sun et al. 2025)."""

from __future__ import annotations

from collections.abc import Callable

from specsample.verify import Verdict, verify
from specsample.verify_block import verify_block

__all__ = ["VERIFIERS", "Verifier", "get_verifier"]

# Every verifier takes (draft_tokens [B, K], draft_probs [B, K, V] | None,
# target_probs [B, K+1, V], uniforms [B, K+1], *, check) and returns a Verdict.
Verifier = Callable[..., Verdict]

VERIFIERS: dict[str, Verifier] = {"token": verify, "block": verify_block}


def get_verifier(name_or_callable: str | Verifier) -> Verifier:
    """The verifier called `name_or_callable` in `VERIFIERS`, or the callable itself.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
        TypeError: neither a str nor a callable.
    """
    if isinstance(name_or_callable, str):
        if name_or_callable not in VERIFIERS:
            raise ValueError(f"verifier: unknown name {name_or_callable!r}; known: "
                             f"{', '.join(sorted(VERIFIERS))}")
        return VERIFIERS[name_or_callable]
    if callable(name_or_callable):
        return name_or_callable
    raise TypeError(f"verifier: expected a name ({', '.join(sorted(VERIFIERS))}) or a callable, "
                    f"got {type(name_or_callable).__name__}")
