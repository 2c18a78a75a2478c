"""How a benchmark reports progress without printing: the caller supplies a `Progress`."""

from __future__ import annotations

from typing import Protocol

__all__ = ["NO_PROGRESS", "Progress"]


class Progress(Protocol):
    """Receives a benchmark's stages and units of work (e.g. a progress bar in the CLI)."""

    def stage(self, name: str, total: int, unit: str) -> None:
        """A new stage of `total` units begins (the previous one, if any, has ended)."""
        ...

    def advance(self, count: int = 1, note: str = "") -> None:
        """`count` more units of the current stage are done; `note` says what runs now."""
        ...

    def end(self) -> None:
        """The current stage has ended."""
        ...


class _Silent:
    def stage(self, name: str, total: int, unit: str) -> None:
        """Nothing."""

    def advance(self, count: int = 1, note: str = "") -> None:
        """Nothing."""

    def end(self) -> None:
        """Nothing."""


NO_PROGRESS: Progress = _Silent()
