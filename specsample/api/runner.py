"""The front door: `load(config)` gives a Runner whose script runs unchanged on every backend.

    config = Config.load("run.toml")
    runner = specsample.load(config)
    out = runner.generate(["Once upon a time"], max_new_tokens=64)
    text = out.texts[0]  # the first prompt's new text

The runner routes every generation to the backend's own engine (the static engine on
`static-cpu`, `cuda` and `gaudi`, the core loop elsewhere); only `Config.backend`
changes between backends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from specsample._array import check_int
from specsample.api.backend import Backend, Tokenizer
from specsample.api.config import AUTO_K, DEFAULT_K, Config
from specsample.api.registry import get_backend
from specsample.core.protocols import Drafter, Model
from specsample.drafters.head import HeadTreeDrafter
from specsample.drafters.hybrid import HybridDrafter
from specsample.drafters.model import ModelDrafter
from specsample.engine.options import RunOptions
from specsample.engine.runs import Generation, Step
from specsample.engine.scheduler import Scheduler

__all__ = ["Prompts", "Runner", "encode_text", "load"]

Prompts = str | Sequence[str] | Sequence[Sequence[int]] | Any  # text(s), id lists, or an id array [B, T]


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """A user message as ids: through the chat template when the tokenizer has one."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"prompts: expected non-empty strings, got {text!r}")
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer.encode(text)]


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Runner:
    """A loaded backend, target, drafter and tokenizer, and the config they came from.

    Attributes:
        config: the run's Config.
        backend: the backend `config.backend` names.
        target: the target Model; drafter: the Drafter.
        tokenizer: the target's tokenizer.
        k_note: how the backend chose K where the config gave none, or None.
    """

    config: Config
    backend: Backend
    target: Model
    drafter: Drafter
    tokenizer: Tokenizer
    k_note: str | None = None

    def encode(self, prompts: Prompts) -> tuple[Any, Any]:
        """Right-padded ids [B, T] and lengths [B] as the backend's arrays.

        Args:
            prompts: a string or strings (each a user message, chat-formatted when the
                tokenizer has a template), lists of ids, or an id array [B, T] (all T long).
        """
        if isinstance(prompts, str):
            prompts = [prompts]
        if hasattr(prompts, "shape"):
            ids = self.backend.asarray(prompts)
            if len(ids.shape) != 2:
                raise ValueError(f"prompts: expected an id array [B, T], got shape {list(ids.shape)}")
            return ids, self.backend.asarray([int(ids.shape[1])] * int(ids.shape[0]))
        rows = list(prompts)
        if not rows:
            raise ValueError("prompts: expected at least one prompt, got none")
        encoded = [encode_text(self.tokenizer, r) if isinstance(r, str) else [int(t) for t in r]
                   for r in rows]
        if any(not r for r in encoded):
            raise ValueError("prompts: expected every prompt to have at least one token")
        width = max(len(r) for r in encoded)
        pad = self.pad_id
        ids = self.backend.asarray([r + [pad] * (width - len(r)) for r in encoded])
        return ids, self.backend.asarray([len(r) for r in encoded])

    @property
    def pad_id(self) -> int:
        """The id that pads prompts and outputs: the tokenizer's EOS, else 0."""
        eos = self.tokenizer.eos_token_id
        return 0 if eos is None else int(eos)

    def options(self, **overrides: Any) -> RunOptions:
        """The config's RunOptions (sampling, K policy, seed, verifier, the tokenizer's EOS
        and pad), with `overrides` (any RunOptions field) on top."""
        fields = {f.name for f in dataclasses.fields(RunOptions)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise TypeError(f"options: unknown {unknown}; RunOptions fields: {sorted(fields)}")
        values: dict[str, Any] = {
            "params": self.config.params(), "k": self.config.policy(), "seed": self.config.seed,
            "eos_token_id": self.tokenizer.eos_token_id, "verifier": self.config.verifier,
            "pad_id": self.pad_id, "max_new_tokens": overrides.get("max_new_tokens", 1)}
        return RunOptions(**{**values, **overrides})

    def _inputs(self, prompts: Prompts, overrides: dict[str, Any]) -> tuple[Any, RunOptions]:
        ids, lengths = self.encode(prompts)
        overrides.setdefault("prompt_lengths", lengths)
        return ids, self.options(**overrides)

    def prepare(self, batch: int = 1) -> None:
        """Measure now what the drafter's choices read at `batch` rows and have not measured
        yet: the verify's cost at the widths a round may take (`auto`'s narrowing, a grown
        tree's budget; `specsample.engine.cost.WidthCost`). Otherwise each is measured when a
        generation first needs it, which pauses that generation (about a second per width on
        two CPU cores); `load` measures batch 1. A drafter that measures nothing per width
        returns at once.

        Args:
            batch: the rows of the generations to come, >= 1.
        """
        check_int("batch", batch, 1)
        widest = max(self.config.policy().k_max, int(getattr(self.drafter, "nodes", 0) or 0)) + 1
        for cost in _width_costs(self.drafter):
            cost.prepare(batch, widest)

    def iterate(self, prompts: Prompts, *, max_new_tokens: int, **overrides: Any) -> Iterator[Step]:
        """Speculative rounds on the backend's engine; `overrides` are RunOptions fields."""
        ids, run = self._inputs(prompts, {"max_new_tokens": max_new_tokens, **overrides})
        return self.backend.iterate(self.target, self.drafter, ids, run)

    def generate(self, prompts: Prompts, *, max_new_tokens: int, **overrides: Any) -> Generation:
        """Speculative sampling to completion, with each row's new text decoded."""
        ids, run = self._inputs(prompts, {"max_new_tokens": max_new_tokens, **overrides})
        return self.decode(self.backend.generate(self.target, self.drafter, ids, run))

    def generate_plain(self, prompts: Prompts, *, max_new_tokens: int, **overrides: Any) -> Generation:
        """Plain decoding of the target (the baseline), with each row's new text decoded."""
        ids, run = self._inputs(prompts, {"max_new_tokens": max_new_tokens, **overrides})
        return self.decode(self.backend.generate_plain(self.target, ids, run))

    def drafter_note(self) -> str:
        """The drafter in words; for `auto`, what it chose on this machine and why."""
        k = self.config.policy().k_max
        if isinstance(self.drafter, HybridDrafter):
            return f"drafter {self.config.draft or 'default'}: {self.drafter.describe(k)}"
        note = None
        if isinstance(self.drafter, (ModelDrafter, HeadTreeDrafter)):
            note = self.drafter.rating.note
        why = "".join(f"; {told}" for told in (note, self.k_note) if told)
        return f"drafter {self.config.draft or 'default'}: {type(self.drafter).__name__}{why}"

    def explain(self) -> list[str]:
        """How the drafter was chosen, as a short table: for `auto`, each candidate with its
        measured c, the verify's cost by width, its prior and its predicted speed, and the one
        chosen (`specsample.engine.scheduler.Choice.table`); otherwise one line."""
        gate = self.drafter.scheduler if isinstance(self.drafter, HybridDrafter) else None
        if isinstance(gate, Scheduler) and gate.choice is not None:
            shape = f"a fan-out of {gate.fan_out}" if gate.fan_out else "a chain"
            return [f"auto chose {gate.choice.chosen} ({shape}) on this machine:", *gate.choice.table()]
        return [self.drafter_note()]

    def with_drafter(self, name: str) -> Runner:
        """The same backend, target and tokenizer with the drafter `name` at its own default K
        (as `load` settles it), e.g. a second drafter to benchmark beside this one."""
        drafter = self.backend.load_drafter(name, self.target)
        config, note = _settle_k(dataclasses.replace(self.config, draft=name, k=None), self.backend,
                                 self.target, drafter)
        runner = dataclasses.replace(self, config=config, drafter=drafter, k_note=note)
        runner.prepare(1)  # as `load` does
        return runner

    def decode(self, generation: Generation) -> Generation:
        """`generation` with `texts`: each row's generated ids decoded."""
        rows = int(generation.sequences.shape[0])
        texts = tuple(self.tokenizer.decode(generation.new_tokens(i), skip_special_tokens=True)
                      for i in range(rows))
        return dataclasses.replace(generation, texts=texts)


def load(config: Config | None = None, *, target: str | None = None, draft: str | None = None) -> Runner:
    """Load what `config` names: its backend (with its options), target, drafter, tokenizer.

    Args:
        config: the run's Config (None: `Config.load()`, i.e. defaults and the environment).
        target: the target's spec, overriding `config.target` (None: the config's, else
            the backend's default).
        draft: the drafter's name, overriding `config.draft`.
    """
    config = Config.load() if config is None else config
    if not isinstance(config, Config):
        raise TypeError(f"config: expected a Config, got {type(config).__name__}")
    backend = get_backend(config.backend, config.backend_options())
    spec = target if target is not None else config.target
    tokenizer = backend.tokenizer(spec)
    model = backend.load_target(spec)
    drafter = backend.load_drafter(draft if draft is not None else config.draft, model)
    config, note = _settle_k(config, backend, model, drafter)
    runner = Runner(config=config, backend=backend, target=model, drafter=drafter, tokenizer=tokenizer,
                    k_note=note)
    runner.prepare(1)  # the verify's costs a batch-1 round reads: no generation stops to measure
    return runner


def _settle_k(config: Config, backend: Backend, target: Model, drafter: Drafter) -> tuple[Config, str | None]:
    """`config` with its K settled now that the drafter is known (where it gives none), and how
    the backend chose it (None: the drafter's default)."""
    if config.k is not None:
        return config, None
    if isinstance(drafter, HybridDrafter) and drafter.scheduler is not None and drafter.scheduler.narrows:
        return dataclasses.replace(config, k=AUTO_K), None
    rated = backend.default_k(target, drafter)
    k, note = (DEFAULT_K, None) if rated is None else rated
    return dataclasses.replace(config, k=k), note


def _width_costs(drafter: Drafter) -> list[Any]:
    """The verify-cost tables (objects with `prepare(batch, widest)`) that `drafter`'s choices
    read: its scheduler's, its tree budget's, its rating's; each once."""
    gate = drafter.scheduler if isinstance(drafter, HybridDrafter) else None
    budget = getattr(drafter, "budget", None)
    rating = getattr(drafter, "rating", None)
    found = [getattr(gate, "width_cost", None), getattr(getattr(budget, "costs", None), "width", None),
             getattr(getattr(rating, "costs", None), "width", None)]
    unique = {id(cost): cost for cost in found if callable(getattr(cost, "prepare", None))}
    return list(unique.values())
