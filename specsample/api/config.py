"""One frozen Config from keyword arguments, a dict, a TOML file or the environment."""

from __future__ import annotations

import dataclasses
import os
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specsample._array import check_int
from specsample.api.draft_names import DraftSpec
from specsample.core.params import SamplingParams
from specsample.core.verifiers import get_verifier
from specsample.engine.policy import KPolicy, k_policy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["AUTO_K", "DEFAULT_K", "ENV_PREFIX", "Config"]

ENV_PREFIX = "SPECSAMPLE_"
# K when none is given: drafters that verify all K every round take DEFAULT_K; `auto`
# narrows each round to the width that pays, so its K only caps the longest copies: a long
# verify costs little more than a short one, and a long copy that holds commits up to K + 1
# tokens. A model draft without a threshold runs at the K its backend rates fastest at load
# (`specsample.engine.scheduler.rated_k`).
DEFAULT_K, AUTO_K = 4, 16
CORE_OPTIONS = ("cost_ratio",)  # read by the core (the adaptive K policy), not by backends


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """Everything a run needs; swapping `backend` changes nothing else.

    Attributes:
        backend: a registered backend name ("reference", "torch", "static-cpu", "cuda", "gaudi").
        target: the target model's spec for the backend (None: the backend's default).
        draft: the drafter's name for the backend (None: the backend's default), in the
            shared syntax "KIND:MODEL@THRESHOLD" (`DraftSpec.name` spells a structured one;
            `from_dict` and TOML files also take a table with keys kind, model, threshold).
        k: draft tokens per round (int >= 1), "adaptive", or None: the default, which
            `specsample.load` settles once the drafter is known: `AUTO_K` for a drafter
            that narrows each round to what pays (`auto`: K only caps its longest copies),
            `DEFAULT_K` for the others (they verify all K every round).
        temperature, top_k, top_p, min_p: sampling (see SamplingParams).
        seed: the key of the uniforms.
        verifier: the acceptance rule by name ("token"; see `specsample.core.verifiers`).
        options: backend-specific settings (device, dtype, buckets, ...), and
            `cost_ratio` (the draft/target cost c the adaptive K policy assumes).
    """

    backend: str = "reference"
    target: str | None = None
    draft: str | None = None
    k: int | str | None = None
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int = 0
    verifier: str = "token"
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str) or not self.backend:
            raise ValueError(f"backend: expected a backend name, got {self.backend!r}")
        if isinstance(self.k, int) and not isinstance(self.k, bool) and self.k < 1:
            raise ValueError(f"k: expected an int >= 1 or 'adaptive', got {self.k}")
        if not isinstance(self.options, Mapping):
            raise TypeError(f"options: expected a mapping, got {type(self.options).__name__}")
        object.__setattr__(self, "options", types.MappingProxyType(dict(self.options)))
        self.policy()  # validates k and the cost ratio
        self.params()  # validates the sampling fields
        check_int("seed", self.seed, 0)
        if isinstance(self.draft, str) and self.draft:
            DraftSpec.parse(self.draft)  # validates the shared syntax
        for name in ("target", "draft"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name}: expected a non-empty name or None, got {value!r}")
        get_verifier(self.verifier)

    def backend_options(self) -> dict[str, Any]:
        """`options` less the ones the core reads itself (`cost_ratio`)."""
        return {k: v for k, v in self.options.items() if k not in CORE_OPTIONS}

    def params(self) -> SamplingParams:
        """The sampling parameters."""
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                              min_p=self.min_p)

    def policy(self, measured_c: float | None = None) -> KPolicy:
        """The K policy (constant or adaptive); an adaptive one assumes `measured_c` (the draft's
        cost ratio measured on this machine) where given, unless `options` sets cost_ratio."""
        if self.k == "adaptive" and measured_c is not None and "cost_ratio" not in self.options:
            return k_policy("adaptive", c=measured_c)
        raw = self.options.get("cost_ratio", 0.1)
        try:
            cost = float(raw)
        except (TypeError, ValueError) as err:
            raise ValueError(f"options.cost_ratio: expected a number >= 0, got {raw!r}") from err
        return k_policy(DEFAULT_K if self.k is None else self.k, c=cost)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Config:
        """From a flat mapping; unknown keys are an error naming the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"config: unknown keys {unknown}; known: {sorted(known)}")
        values = dict(values)
        draft = values.get("draft")
        if isinstance(draft, Mapping):
            draft = DraftSpec.from_dict(draft)
        if isinstance(draft, DraftSpec):
            values["draft"] = draft.name
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> Config:
        """From a TOML file (top-level keys; an [options] table for the backend)."""
        return cls.from_dict(_read_toml(path))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """From SPECSAMPLE_BACKEND, SPECSAMPLE_K, SPECSAMPLE_TEMPERATURE, ..."""
        return cls.from_dict(_env_values(os.environ if environ is None else environ))

    @classmethod
    def load(cls, file: str | os.PathLike[str] | None = None, *,
             environ: Mapping[str, str] | None = None, values: Mapping[str, Any] | None = None,
             **kwargs: Any) -> Config:
        """Merge sources; later wins: defaults < environment < TOML file < dict < keyword arguments.

        `options` merge key by key across sources.
        """
        layers = [_env_values(os.environ if environ is None else environ),
                  _read_toml(file) if file is not None else {}, dict(values or {}), kwargs]
        merged: dict[str, Any] = {}
        options: dict[str, Any] = {}
        for layer in layers:
            options.update(layer.get("options", {}))
            merged.update({k: v for k, v in layer.items() if k != "options"})
        return cls.from_dict({**merged, "options": options})


def _read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"config: no such file {str(file)!r}")
    with file.open("rb") as handle:
        return tomllib.load(handle)


def _parse_env(name: str, raw: str) -> Any:
    if name in {"top_k", "top_p", "min_p"} and raw.lower() in {"", "none"}:
        return None
    try:
        if name in {"seed", "top_k"}:
            return int(raw)
        if name == "k":
            return raw if raw == "adaptive" else int(raw)
        if name in {"temperature", "top_p", "min_p"}:
            return float(raw)
    except ValueError as err:
        raise ValueError(f"{ENV_PREFIX}{name.upper()}: expected a number, got {raw!r}") from err
    return raw


def _env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    names = ("backend", "target", "draft", "k", "temperature", "top_k", "top_p", "min_p", "seed",
             "verifier")
    return {n: _parse_env(n, environ[ENV_PREFIX + n.upper()]) for n in names
            if ENV_PREFIX + n.upper() in environ}
