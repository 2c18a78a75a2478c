"""Which `GenerationConfig` fields the transformers-style door honours, tolerates or refuses.

`settings` merges them as transformers' `generate` does (keyword arguments, then the given
config, then the model's, then transformers' defaults) and returns `HFSettings`; every field
either takes effect (`SUPPORTED`), cannot change the tokens (`TOLERATED`), or is refused
with a `ValueError` that names it and where it came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn
from transformers import GenerationConfig

from specsample._array import check_int
from specsample.core.params import SamplingParams

__all__ = ["SUPPORTED", "TOLERATED", "HFSettings", "settings"]

# The GenerationConfig fields that take effect, as in transformers' greedy search and sampling.
SUPPORTED: Mapping[str, str] = {
    "do_sample": "False: greedy (temperature, top_k, top_p and min_p are then unused, as in "
                 "transformers); True: sampling",
    "temperature": "> 0, with do_sample=True",
    "top_k": "an int >= 1, or 0/None (off); transformers' default is 50",
    "top_p": "in (0, 1]; 1.0 or None is off",
    "min_p": "in [0, 1], or None (off)",
    "max_new_tokens": "an int >= 1 (takes precedence over max_length)",
    "max_length": "the total width, input (padding included) + new tokens; transformers' "
                  "default is 20 new tokens",
    "eos_token_id": "None, an int or a list of ints: a row ends at the first of them",
    "pad_token_id": "written after a row's end (None: the first eos_token_id, as in transformers)",
}

# Cache kinds that hold K/V exactly (the others, e.g. "quantized", change the logits).
_EXACT_CACHES = (None, "dynamic", "static", "offloaded", "offloaded_static", "sliding_window", "hybrid",
                 "hybrid_chunked", "offloaded_hybrid", "offloaded_hybrid_chunked")

# Fields that cannot change the tokens of greedy search or sampling: taken without effect.
TOLERATED: Mapping[str, str] = {
    "bos_token_id": "used by transformers only when there are no input_ids",
    "decoder_start_token_id": "used by encoder-decoder models only (refused)",
    "transformers_version": "bookkeeping",
    "_from_model_config": "bookkeeping",
    "use_cache": "the door always runs on its own preallocated K/V cache",
    "cache_implementation": "which transformers cache holds K/V: only the exact kinds (_EXACT_CACHES); "
                            "'quantized' and others are refused",
    "max_cache_len": "the size of transformers' static cache",
    "compile_config": "whether and how transformers compiles its forward",
    "disable_compile": "whether transformers compiles its forward",
    "prefill_chunk_size": "how transformers splits the prompt's forward",
    "renormalize_logits": "a log-softmax of the final scores: the same argmax and the same law",
    "early_stopping": "beam search only (num_beams must be 1)",
    "length_penalty": "beam search only (num_beams must be 1)",
}


def _fresh() -> GenerationConfig:
    """A `GenerationConfig()` with every field at its class default."""
    return GenerationConfig()  # type: ignore[no-untyped-call]  # unannotated in transformers


def _defaults() -> dict[str, Any]:
    """Every field's value when nobody sets it: the class defaults, then transformers' global
    defaults (transformers >= 5 keeps those apart, in `_get_default_generation_params`)."""
    values = _fresh().to_dict()
    global_defaults = getattr(GenerationConfig, "_get_default_generation_params", None)
    if callable(global_defaults):
        values.update(global_defaults())
    return values


def _set_fields(config: GenerationConfig) -> dict[str, Any]:
    """The fields `config` sets: those that differ from a fresh `GenerationConfig()`."""
    unset = _fresh().to_dict()
    return {name: value for name, value in config.to_dict().items()
            if name not in unset or value != unset[name]}


def _inert(value: Any, default: Any) -> bool:
    """Whether `value` leaves transformers' greedy search and sampling as the default does."""
    if value is None or value == default:
        return True
    return default is None and (value is False or (isinstance(value, (list, tuple, dict)) and not value))


def _token_ids(value: Any) -> tuple[int, ...]:
    """`eos_token_id` as a tuple of distinct ids >= 0, in order (None: no id)."""
    if value is None:
        return ()
    if isinstance(value, Tensor):
        value = value.tolist()
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ValueError("eos_token_id: expected an int, a non-empty list of ints or None, got []")
    ids = [check_int("eos_token_id", item, 0) for item in items]
    return tuple(dict.fromkeys(ids))


@dataclasses.dataclass(frozen=True, kw_only=True)
class HFSettings:
    """What a `GenerationConfig` (merged as transformers merges it) asks of the door.

    Attributes:
        params: the sampling parameters (temperature 0 for greedy search).
        max_new_tokens: new tokens per row, or None to derive them from `max_length`.
        max_length: the total width when `max_new_tokens` is None.
        default_length: `max_length` is transformers' default (20 new tokens, capped at the
            model's `max_position_embeddings`), not one that somebody set.
        eos_token_ids: the ids that end a row (empty: none).
        pad_token_id: the id written after a row's end (None when there is no EOS either).
    """

    params: SamplingParams
    max_new_tokens: int | None
    max_length: int
    default_length: bool
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None

    def new_tokens(self, width: int, max_positions: int | None = None) -> int:
        """New tokens per row for an input `width` wide (padding included), as transformers counts."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        total = self.max_length + width if self.default_length else self.max_length
        if self.default_length and max_positions is not None:
            total = min(total, max_positions)
        if total <= width:
            raise ValueError(f"max_length: expected more than the input's width {width} (padding "
                             f"included), got {total}; set max_new_tokens instead")
        return total - width


def settings(model: nn.Module, generation_config: GenerationConfig | None = None,
             **kwargs: Any) -> HFSettings:
    """The settings `model.generate(generation_config=..., **kwargs)` would run with.

    Fields merge as in transformers: keyword arguments, then the fields `generation_config`
    sets, then those `model.generation_config` sets, then transformers' defaults.

    Raises:
        TypeError: a keyword that is not a GenerationConfig field; a config of another type.
        ValueError: a field that changes the tokens and is not supported (the message names
            it, its value and where it came from), or a supported field out of range.
    """
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(f"generation_config: expected a transformers GenerationConfig or None, got "
                        f"{type(generation_config).__name__}")
    defaults = _defaults()
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        raise TypeError(f"generate: unexpected keyword arguments {unknown}: expected GenerationConfig "
                        f"fields (model inputs other than attention_mask are not supported)")
    own = getattr(model, "generation_config", None)
    values: dict[str, tuple[Any, str]] = {name: (value, "transformers' defaults")
                                          for name, value in defaults.items()}
    layers: list[tuple[str, Mapping[str, Any]]] = [
        ("model.generation_config", _set_fields(own) if isinstance(own, GenerationConfig) else {}),
        ("generation_config", _set_fields(generation_config) if generation_config is not None else {}),
        ("keyword argument", kwargs)]
    for source, fields in layers:
        values.update({name: (value, source) for name, value in fields.items()})
    _refuse_unsupported(values, defaults)
    default_length = all(fields.get("max_length") is None for _, fields in layers)
    if default_length:  # max_length=None is unset, as in transformers
        values["max_length"] = (defaults["max_length"], "transformers' defaults")
    return _settings(values, default_length=default_length)


def _refuse_unsupported(values: Mapping[str, tuple[Any, str]], defaults: Mapping[str, Any]) -> None:
    for name, (value, source) in values.items():
        if name in SUPPORTED:
            continue
        if name == "cache_implementation":
            if value in _EXACT_CACHES:
                continue
        elif name in TOLERATED or _inert(value, defaults.get(name)):
            continue
        default = defaults.get(name)
        raise ValueError(
            f"{name}: got {value!r} (from {source}); specsample's generate runs greedy search or "
            f"sampling, set by {', '.join(SUPPORTED)}, and {name} would change the tokens: pass "
            f"{name}={default!r} to run without it")


def _settings(values: Mapping[str, tuple[Any, str]], *, default_length: bool) -> HFSettings:
    def get(name: str) -> Any:
        return values[name][0]

    do_sample = get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise TypeError(f"do_sample: expected a bool or None, got {type(do_sample).__name__} {do_sample!r}")
    if do_sample:
        temperature = 1.0 if get("temperature") is None else get("temperature")
        if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature <= 0:
            raise ValueError(f"temperature: expected > 0 with do_sample=True, got {temperature}; for "
                             f"greedy search pass do_sample=False")
        top_k, top_p = get("top_k"), get("top_p")
        params = SamplingParams(temperature=temperature, top_k=None if top_k in (None, 0) else top_k,
                                top_p=None if top_p is None or top_p == 1.0 else top_p, min_p=get("min_p"))
    else:
        params = SamplingParams(temperature=0.0)
    max_new = get("max_new_tokens")
    if max_new is not None:
        max_new = check_int("max_new_tokens", max_new, 1)
    max_length = check_int("max_length", get("max_length"), 1)
    eos = _token_ids(get("eos_token_id"))
    pad = get("pad_token_id")
    if isinstance(pad, Tensor):
        pad = pad.item()
    if pad is not None:
        pad = check_int("pad_token_id", pad, -(2**62))
    return HFSettings(params=params, max_new_tokens=max_new, max_length=max_length,
                      default_length=default_length, eos_token_ids=eos,
                      pad_token_id=pad if pad is not None or not eos else eos[0])
