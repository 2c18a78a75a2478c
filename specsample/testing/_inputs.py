"""Input checks shared by the toolkit: every error names the argument, what it expects and what it got."""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

__all__ = ["as_ids", "as_probabilities", "check_level", "check_tau"]


def _check_real(value: float, name: str, want: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected {want}, got {type(value).__name__}")
    return float(value)


def check_level(value: float, name: str) -> float:
    """Return `value` as a float after checking it is a probability in (0, 1).

    Args:
        value: the level to check.
        name: the argument's name, for the error message.

    Returns:
        float(value).
    """
    level = _check_real(value, name, "a float in (0, 1)")
    if not 0.0 < level < 1.0:
        raise ValueError(f"{name}: expected a float in (0, 1), got {value!r}")
    return level


def check_tau(value: float | None) -> float | None:
    """Return the TV threshold `tau` as a float (or None) after checking it is finite and > 0.

    Args:
        value: the threshold, or None to derive it from alpha.

    Returns:
        float(value), or None.
    """
    if value is None:
        return None
    tau = _check_real(value, "tau", "None or a float > 0")
    if not (math.isfinite(tau) and tau > 0.0):
        raise ValueError(f"tau: expected None or a finite float > 0, got {value!r}")
    return tau


def as_ids(samples: object, name: str, *, rows: bool = False) -> NDArray[np.integer]:
    """Convert samples (NumPy, torch CPU tensor, list, ...) to a non-empty integer array.

    Args:
        samples: outcome ids [n], or with `rows` also [n, L] (each row one outcome).
        name: the argument's name, for the error message.
        rows: whether [n, L] arrays are allowed.

    Returns:
        The samples as a NumPy integer array [n] or [n, L].
    """
    ids = np.asarray(samples)
    if ids.ndim != 1 and not (rows and ids.ndim == 2):
        want = "a 1-D array [n] or 2-D array [n, L]" if rows else "a 1-D array [n]"
        raise ValueError(f"{name}: expected {want} of outcome ids, got shape {ids.shape}")
    if ids.shape[0] == 0:
        raise ValueError(f"{name}: expected at least one sample, got none")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer outcome ids, got dtype {ids.dtype}")
    return ids


def _check_entries(probs: NDArray[np.float64], name: str) -> None:
    if not np.all(np.isfinite(probs)):
        bad = probs[~np.isfinite(probs)][0]
        raise ValueError(f"{name}: expected finite probabilities, got {bad}")
    if np.any(probs < 0):
        raise ValueError(f"{name}: expected non-negative probabilities, got min {probs.min()}")


def as_probabilities(expected: object, name: str) -> NDArray[np.float64]:
    """Convert a law (floats summing to 1 within 1e-9, or Fractions summing exactly to 1) to float64.

    Args:
        expected: probabilities [M]; floats, ints, or Fractions (an object array, checked exactly).
        name: the argument's name, for the error message.

    Returns:
        float64 [M], renormalised to sum to 1.
    """
    raw = np.asarray(expected)
    if raw.ndim != 1 or raw.shape[0] == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D array of probabilities, "
                         f"got shape {raw.shape}")
    if raw.dtype == np.object_:
        odd = sorted({type(v).__name__ for v in raw if not isinstance(v, numbers.Rational)})
        if odd:
            raise TypeError(f"{name}: expected numbers or Fractions, got {', '.join(odd)}")
        exact = [Fraction(v) for v in raw]
        probs = np.array([float(v) for v in exact], dtype=np.float64)
        _check_entries(probs, name)
        if sum(exact) != 1:
            raise ValueError(f"{name}: expected Fractions summing exactly to 1, got {sum(exact)}")
    elif raw.dtype.kind in "iuf":
        probs = raw.astype(np.float64)
        _check_entries(probs, name)
        if abs(float(probs.sum()) - 1.0) > 1e-9:
            raise ValueError(f"{name}: expected probabilities summing to 1 within 1e-9, "
                             f"got {float(probs.sum())!r}")
    else:
        raise TypeError(f"{name}: expected real probabilities, got dtype {raw.dtype}")
    return probs / float(probs.sum())
