"""Acceptance rules by name, as a config names them."""

from __future__ import annotations

from collections.abc import Callable

from specsample.verify import Verdict, verify

__all__ = ["VERIFIERS", "get_verifier"]

VERIFIERS: dict[str, Callable[..., Verdict]] = {"token": verify}


def get_verifier(verifier: str | Callable[..., Verdict]) -> Callable[..., Verdict]:
    """The rule called `verifier` (a callable is returned as it is).

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if callable(verifier):
        return verifier
    if not isinstance(verifier, str) or verifier not in VERIFIERS:
        raise ValueError(f"verifier: expected one of {sorted(VERIFIERS)} or a callable, got "
                         f"{verifier!r}")
    return VERIFIERS[verifier]
