"""The models a benchmark runs: a config's backend, its target, drafter and tokenizer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from specsample.config import Config
from specsample.protocols import Drafter, Model
from specsample.registry import Backend, get_backend

__all__ = ["Loaded", "load_models", "own_or_core"]


class Loaded(NamedTuple):
    """What `load_models` returns: (config, backend, target, drafter, tokenizer)."""

    config: Config
    backend: Backend
    target: Model
    drafter: Drafter
    tokenizer: Any


def load_models(config: Config, *, target: str, draft: str) -> Loaded:
    """The config's backend with `target`, `draft` and the target's tokenizer loaded.

    Args:
        config: the run's config (its backend and backend options are used).
        target: a target model spec ("smollm2", a model directory or a .gguf file).
        draft: a drafter name ("int8", "early-exit:N", "lookup" or a model spec).

    Raises:
        ValueError: the backend has no tokenizer (the benchmarks take text prompts).
    """
    if not isinstance(config, Config):
        raise TypeError(f"config: expected a Config, got {type(config).__name__}")
    for name, value in (("target", target), ("draft", draft)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name}: expected a model spec (str), got {value!r}")
    backend = get_backend(config.backend, config.backend_options())
    make_tokenizer = getattr(backend, "tokenizer", None)
    if make_tokenizer is None:
        raise ValueError(f"backend: {config.backend!r} has no tokenizer; real-model commands need "
                         f"one (e.g. --backend torch)")
    tokenizer = make_tokenizer(target)
    model = backend.load_target(target)
    return Loaded(config, backend, model, backend.load_drafter(draft, model), tokenizer)


def own_or_core(backend: Backend, name: str, core: Callable[..., Any]) -> Callable[..., Any]:
    """The backend's own `generate`/`iterate`/`generate_plain` when it has one, else the core's."""
    own = getattr(backend, name, None)
    return own if callable(own) else core
