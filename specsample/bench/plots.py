"""Plots of the models benchmark (matplotlib, written to files beside the JSON)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_models"]


def _label(record: Mapping[str, Any]) -> str:
    return str(record.get("setting") or f"T={record['temperature']:g}")


def _speed(plt: Any, records: Sequence[Mapping[str, Any]], path: Path) -> None:
    settings = list(dict.fromkeys(_label(r) for r in records))
    families = list(dict.fromkeys(r["method"] for r in records))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(families)
    for j, family in enumerate(families):
        rows = [next((r for r in records if r["method"] == family and _label(r) == t), None)
                for t in settings]
        xs = [i + j * width for i, r in enumerate(rows) if r is not None]
        mids = [r["tokens_per_s"] for r in rows if r is not None]
        lows = [r["tokens_per_s"] - r["tokens_per_s_min"] for r in rows if r is not None]
        highs = [r["tokens_per_s_max"] - r["tokens_per_s"] for r in rows if r is not None]
        ax.bar(xs, mids, width, yerr=[lows, highs], capsize=3, label=family)
    ax.set_xticks([i + width * (len(families) - 1) / 2 for i in range(len(settings))],
                  [t + (" (greedy)" if t == "T=0" else "") for t in settings])
    ax.set_ylabel("tokens/s (median; bars: min-max over runs)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _accepted(plt: Any, records: Sequence[Mapping[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    spec = [r for r in records if r["method"] == "specsample"]
    bins = max((len(r["histogram"]) for r in spec), default=1)
    for j, r in enumerate(spec):
        counts = r["histogram"]
        ax.bar([n + j * 0.8 / len(spec) for n in range(len(counts))],
               [n / max(1, sum(counts)) for n in counts], 0.8 / len(spec),
               label=_label(r))
    ax.set_xticks([n + 0.4 - 0.4 / max(1, len(spec)) for n in range(bins)], [str(n) for n in range(bins)])
    ax.set_xlabel("drafts accepted per round (specsample)")
    ax.set_ylabel("fraction of row-rounds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_models(records: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> list[Path]:
    """Tokens/s by method and setting, and specsample's accepted-length histogram.

    Args:
        records: the records of `summarise`.
        path: the JSON's path; the plots are `<stem>_tokens_per_s.png` and
            `<stem>_accepted.png` beside it.

    Returns:
        The two PNG paths.
    """
    if not records:
        raise ValueError("records: expected at least one record to plot, got none")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    speed = base.with_name(f"{base.stem}_tokens_per_s.png")
    accepted = base.with_name(f"{base.stem}_accepted.png")
    _speed(plt, records, speed)
    _accepted(plt, records, accepted)
    return [speed, accepted]
