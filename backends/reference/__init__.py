"""The reference backend: NumPy float64, eager, with toy models of known law."""

from __future__ import annotations

from specsample_backends.reference.backend import ReferenceBackend, create
from specsample_backends.reference.ngram import NGramModel, random_ngram

__all__ = ["NGramModel", "ReferenceBackend", "create", "random_ngram"]

