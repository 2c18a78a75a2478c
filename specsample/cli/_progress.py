"""Progress bars (tqdm) for the benchmarks' `Progress`."""

from __future__ import annotations

from tqdm import tqdm

__all__ = ["Bars"]


class Bars:
    """One tqdm bar per stage of a benchmark."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.bar: tqdm | None = None

    def stage(self, name: str, total: int, unit: str) -> None:
        """Close the previous bar and open one for `name`."""
        self.end()
        self.bar = tqdm(total=total, desc=f"{self.prefix}{name}", unit=unit)

    def advance(self, count: int = 1, note: str = "") -> None:
        """Move the bar; show `note` beside it."""
        if self.bar is None:
            return
        if note:
            self.bar.set_postfix_str(note)
        self.bar.update(count)

    def end(self) -> None:
        """Close the current bar."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
