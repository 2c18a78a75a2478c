"""What `specsample check` does with its samples: the target's exact law, the tests against it
and against plain sampling, the samples' digest and the figure.

Every test against the exact law projects the samples onto outcomes fixed by the law before
any sample is read: the `BINS - 1` most likely sequences of 1 and of `LENGTH` tokens
(`specsample.testing.most_likely_sequences`) and the rest, each with its exact
probability. The tests against plain sampling pick their outcomes from the data.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specsample._array import host_array
from specsample.api.runner import Runner
from specsample.bench import next_logits
from specsample.core.params import SamplingParams
from specsample.core.warp import warp
from specsample.testing import (
    FitResult,
    HomogeneityResult,
    goodness_of_fit,
    homogeneity,
    most_likely_sequences,
    project_sequences,
)

__all__ = ["BINS", "LENGTH", "Panel", "digest", "exact_law", "law_tests", "plot"]

BINS = 8  # outcomes per test: the 7 most likely (or most frequent) and the rest
LENGTH = 3  # tokens per sample
LawOf = Callable[[tuple[int, ...]], np.ndarray]
# (setting, the speculative and plain first tokens, the exact law of the first token)
Panel = tuple[str, np.ndarray, np.ndarray | None, np.ndarray]


def exact_law(runner: Runner, prompt: Any, params: SamplingParams) -> LawOf:
    """The law of the next token after `prompt` + a prefix: a function of the prefix (a tuple
    of ids), float64 probabilities [V] on the host, from the target's logits under `params`."""
    ids = [int(t) for t in host_array(prompt)[0]]

    @functools.cache  # the first token's law serves both tests: one forward pass per prefix
    def law_of(prefix: tuple[int, ...]) -> np.ndarray:
        logits = next_logits(runner.target, runner.backend.asarray([[*ids, *prefix]]))
        wide = logits.double() if hasattr(logits, "double") else logits.astype(np.float64)
        out: np.ndarray = host_array(warp(wide, params))
        return out

    return law_of


def _fixed_outcomes(law_of: LawOf, length: int
                    ) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray]:
    """The BINS - 1 most likely sequences of `length` tokens, their probabilities, and the law
    of (those, the rest). Where they hold all the mass the rest has none, so a sample outside
    them fails at once."""
    sequences, masses = most_likely_sequences(law_of, count=BINS - 1, length=length)
    rest = 1.0 - float(masses.sum())
    law = np.append(masses, rest if rest > 1e-12 else 0.0)
    return sequences, masses, law / law.sum()


def sequence_ids(tokens: np.ndarray) -> np.ndarray:
    """One int64 outcome id per row of [n, 3] token ids (V^3 < 2^63 for V <= 2 million)."""
    vocab = 1 << 21
    ids: np.ndarray = (tokens[:, 0] * vocab + tokens[:, 1]) * vocab + tokens[:, 2]
    return ids


def law_tests(spec: np.ndarray, plain: np.ndarray | None, law_of: LawOf, alpha: float
              ) -> tuple[dict[str, FitResult | HomogeneityResult], list[tuple[int, ...]], np.ndarray]:
    """The tests of the speculative samples `spec` [n, LENGTH] against the exact law (the
    first token, the first LENGTH tokens) and, given `plain` samples, against them; with
    the LENGTH-token sequences tested and their probabilities."""
    for name, rows in (("spec", spec), ("plain", plain)):
        if rows is not None and (not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.shape[1] != LENGTH
                                 or not np.issubdtype(rows.dtype, np.integer)):
            raise ValueError(f"{name}: expected integer token ids of shape [n, {LENGTH}], got "
                             f"{getattr(rows, 'dtype', type(rows).__name__)} of shape "
                             f"{list(getattr(rows, 'shape', []))}")
    first, _, first_law = _fixed_outcomes(law_of, 1)
    sequences, masses, sequence_law = _fixed_outcomes(law_of, LENGTH)
    results: dict[str, FitResult | HomogeneityResult] = {
        f"first token, spec vs exact p (top {BINS - 1} + rest)": goodness_of_fit(
            project_sequences(spec[:, :1], first), first_law, alpha=alpha),
        f"first {LENGTH} tokens, spec vs exact p (the {len(sequences)} most likely + rest)":
            goodness_of_fit(project_sequences(spec, sequences), sequence_law, alpha=alpha),
    }
    if plain is not None:
        results["first token, spec vs plain"] = homogeneity(spec[:, 0], plain[:, 0], alpha=alpha, bins=BINS)
        results[f"first {LENGTH} tokens, spec vs plain"] = homogeneity(
            sequence_ids(spec), sequence_ids(plain), alpha=alpha, bins=BINS)
    return results, sequences, masses


def digest(*samples: np.ndarray) -> str:
    """A short hash of sample arrays: equal digests, bit-identical samples."""
    h = hashlib.sha256()
    for s in samples:
        h.update(np.ascontiguousarray(s, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def plot(panels: list[Panel], path: Path, tokenizer: Any) -> None:
    """The figure of each setting's first token: speculative, plain and exact frequencies of
    the 15 likeliest tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)), squeeze=False)
    for ax, (name, spec, plain, exact) in zip(axes[:, 0], panels, strict=True):
        top = np.argsort(-exact)[:15]
        x = np.arange(len(top))
        ax.bar(x - 0.27, [np.mean(spec == t) for t in top], 0.27, label="speculative")
        if plain is not None:
            ax.bar(x, [np.mean(plain == t) for t in top], 0.27, label="plain")
        ax.bar(x + 0.27, exact[top], 0.27, label="exact p")
        ax.set_xticks(x, [repr(tokenizer.decode([int(t)])) for t in top], rotation=45, fontsize=7)
        ax.set_title(f"first generated token, {name}")
        ax.set_ylabel("frequency")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
