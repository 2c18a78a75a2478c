"""Real-model commands: `specsample generate`, `specsample bench models`, the demo.

Models come from the backend named in the config (`get_backend(config.backend)`),
so `--backend` swaps the engine and nothing else. Peers in the benchmark are
plain decoding (ours and transformers') and transformers' assisted generation
with the same draft. Heavy libraries (torch, transformers, matplotlib) are
imported when a command runs, never when the CLI is built.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from tqdm import tqdm

from specsample.cache import rollback
from specsample.config import ENV_PREFIX, Config
from specsample.generate import Generation, Step, generate, generate_plain, iterate
from specsample.metrics import Metrics
from specsample.params import SamplingParams
from specsample.policy import KPolicy, k_policy
from specsample.protocols import Drafter, Model
from specsample.registry import Backend, get_backend
from specsample.rng import uniforms

__all__ = ["PROMPTS", "add_bench_options", "add_model_options", "add_parser", "bench",
           "demo", "load", "measure_cost_ratio"]

DEFAULT_BACKEND = "torch"
CORE_OPTIONS = ("cost_ratio",)  # read by the core (Config.policy), not by backends

_PARAGRAPH = (
    "The lighthouse at Point Reyes was built in 1870 to warn ships away from the rocky "
    "headland, one of the foggiest places on the Pacific coast. Its first-order Fresnel lens, "
    "made in France, was hauled up the cliff in pieces and assembled on site. For more than a "
    "century keepers wound the clockwork every two hours through the night so that the lens "
    "kept turning. In 1975 the Coast Guard replaced it with an automated light, and the old "
    "lens became the centrepiece of a small museum.")
_CODE = (
    "def mean(values):\n"
    "    total = 0\n"
    "    for v in values:\n"
    "        total = total + v\n"
    "    return total / len(values)\n")

# (tag, prompt): "open" asks for new text; "grounded" reworks text given in the prompt
# (where copying drafts such as prompt lookup shine). Alternating, so --prompts N mixes.
PROMPTS: tuple[tuple[str, str], ...] = (
    ("open", "Write a short story about a robot who learns to paint."),
    ("grounded", f"Summarise the following paragraph in two sentences.\n\n{_PARAGRAPH}"),
    ("open", "Explain how a rainbow forms, for a ten-year-old."),
    ("grounded", "Add type hints and a docstring to this Python function, and make it raise "
                 f"ValueError on an empty list. Return the whole function.\n\n{_CODE}"),
    ("open", "Give me five ideas for a rainy Sunday afternoon."),
    ("grounded", f"Rewrite the following paragraph in simpler English.\n\n{_PARAGRAPH}"),
    ("open", "What are the pros and cons of working from home?"),
    ("grounded", "Rename the variable `total` to `running_sum` and `v` to `value` in this "
                 f"code, and return the whole code.\n\n{_CODE}"),
    ("grounded", f"List the dates and numbers mentioned in this paragraph.\n\n{_PARAGRAPH}"),
)


# ---- options and loading -------------------------------------------------------------------

def _k_value(text: str) -> int | str:
    if text == "adaptive":
        return text
    try:
        return int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'adaptive', got {text!r}") from err


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Backend, models and sampling options shared by the real-model commands.

    Sampling options default to None so that a TOML file (--config) or the
    environment can set them; an explicit option beats both.
    """
    group = parser.add_argument_group("models and sampling")
    group.add_argument("--backend", default=None,
                       help=f"backend name (default: {ENV_PREFIX}BACKEND, the config file, else "
                            f"{DEFAULT_BACKEND!r})")
    group.add_argument("--config", type=Path, default=None, help="a TOML config file")
    group.add_argument("--target", default="smollm2",
                       help="target model: 'smollm2', a model directory or a .gguf file")
    group.add_argument("--draft", default="int8",
                       help="drafter: 'int8', 'early-exit:N', 'lookup' or a model spec")
    group.add_argument("--k", type=_k_value, default=None, help="drafts per round, or 'adaptive'")
    group.add_argument("--temperature", type=float, default=None, help="0 means greedy")
    group.add_argument("--top-k", type=int, default=None)
    group.add_argument("--top-p", type=float, default=None)
    group.add_argument("--min-p", type=float, default=None)
    group.add_argument("--seed", type=int, default=None)
    group.add_argument("--max-new-tokens", type=int, default=None)
    group.add_argument("--device", default=None, help="backend option 'device' (e.g. cpu, cuda:0)")
    group.add_argument("--dtype", default=None, help="backend option 'dtype' (e.g. float32)")


def add_parser(sub: Any) -> None:
    """Register the `generate` subcommand."""
    parser = sub.add_parser("generate", help="speculative sampling on a real model, streamed")
    parser.add_argument("--prompt", action="append", required=True,
                        help="a user message (repeat for a ragged batch)")
    add_model_options(parser)
    parser.set_defaults(run=run_generate)


def config_from_args(args: argparse.Namespace, *,
                     environ: Mapping[str, str] | None = None) -> Config:
    """Defaults < environment < --config TOML < explicit options (backend default: torch)."""
    values: dict[str, Any] = {}
    for name in ("backend", "k", "temperature", "top_k", "top_p", "min_p", "seed"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    options = {name: getattr(args, name) for name in ("device", "dtype")
               if getattr(args, name, None) is not None}
    if options:
        values["options"] = options
    env = dict(os.environ if environ is None else environ)
    env.setdefault(ENV_PREFIX + "BACKEND", DEFAULT_BACKEND)  # below env and TOML
    return Config.load(getattr(args, "config", None), environ=env, values=values)


def backend_options(config: Config) -> dict[str, Any]:
    """The config's options minus those the core reads itself (e.g. cost_ratio)."""
    return {k: v for k, v in config.options.items() if k not in CORE_OPTIONS}


class Loaded(NamedTuple):
    """What `load` returns: (config, backend, target, drafter, tokenizer)."""

    config: Config
    backend: Backend
    target: Model
    drafter: Drafter
    tokenizer: Any


def load(args: argparse.Namespace) -> Loaded:
    """(config, backend, target, drafter, tokenizer) for the parsed options."""
    config = config_from_args(args)
    backend = get_backend(config.backend, backend_options(config))
    make_tokenizer = getattr(backend, "tokenizer", None)
    if make_tokenizer is None:
        raise ValueError(f"backend: {config.backend!r} has no tokenizer; real-model commands need "
                         f"one (e.g. --backend torch)")
    tokenizer = make_tokenizer(args.target)
    target = backend.load_target(args.target)
    drafter = backend.load_drafter(args.draft, target)
    return Loaded(config, backend, target, drafter, tokenizer)


def encode(tokenizer: Any, prompt: str) -> list[int]:
    """A user message as token ids, chat-formatted when the tokenizer has a template."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer.encode(prompt)]


def _batch(backend: Backend, rows: Sequence[list[int]], pad: int) -> tuple[Any, Any]:
    """Right-padded ids [B, T] and prompt lengths [B] as the backend's arrays."""
    width = max(len(r) for r in rows)
    ids = backend.asarray([r + [pad] * (width - len(r)) for r in rows])
    return ids, backend.asarray([len(r) for r in rows])


def next_logits(target: Model, prompt: Any) -> Any:
    """The target's logits [V] for the token after `prompt` [1, T], from a fresh cache."""
    logits, _ = target.forward(prompt, target.new_cache(1, int(prompt.shape[1]) + 1))
    return logits[0, -1]


def _runner(backend: Backend, name: str, core: Callable[..., Any]) -> Callable[..., Any]:
    """The backend's own generate/iterate when it has one, else the core's."""
    own = getattr(backend, name, None)
    return own if callable(own) else core


def _policy(config: Config, c: float) -> KPolicy:
    """The config's K policy; an adaptive one uses the measured c unless cost_ratio is set."""
    if config.k == "adaptive" and "cost_ratio" not in config.options:
        return k_policy("adaptive", c=c)
    return config.policy()


def _sync(value: Any) -> None:
    float(value.reshape(-1)[0])  # a host read: waits for an asynchronous device


def measure_cost_ratio(target: Model, drafter: Drafter, prompt: Any, params: SamplingParams, *,
                       repeats: int = 5) -> float:
    """c: the median time of one draft step over that of one target forward, at batch 1.

    A draft step is `drafter.propose` with K = 1 (a draft forward, warp and sample);
    the target step is a one-token forward after the prompt. Both write at the
    same cache position each time (rollback is free), after one warm-up.

    Args:
        prompt: int64 [1, T] ids, T >= 2, of the backend's array library.
    """
    width = int(prompt.shape[1])
    if width < 2:
        raise ValueError(f"prompt: expected at least 2 tokens to time a step, got {width}")
    lengths = prompt[:, 0] * 0 + width  # [1] int64, on the prompt's device
    cache = target.new_cache(1, width + 2)
    _, cache = target.forward(prompt[:, :-1], cache)
    cache = rollback(cache, lengths - 1)
    state = drafter.start(prompt, lengths, width + 2)
    u = uniforms(0, 0, 1, 1, like=prompt)

    def target_step() -> None:
        _sync(target.forward(prompt[:, -1:], cache)[0])

    def draft_step() -> None:
        _sync(drafter.propose(state, prompt, lengths, 1, params, u).tokens)

    def timed(step: Callable[[], None]) -> float:
        step()
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            step()
            times.append(time.perf_counter() - began)
        return statistics.median(times)

    return timed(draft_step) / timed(target_step)


# ---- generate ------------------------------------------------------------------------------

def _stream(steps: Iterator[Step], tokenizer: Any, prompt_length: int) -> Step:
    """Print row 0's text as rounds commit it; returns the last step."""
    printed, text, last = "", "", None
    for step in steps:
        ids = [int(t) for t in step.state.tokens[0, prompt_length:int(step.state.lengths[0])]]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if text.startswith(printed) and not text.endswith("\ufffd"):  # wait out partial bytes
            print(text[len(printed):], end="", flush=True)
            printed = text
        last = step
    print(text[len(printed):] if text.startswith(printed) else "")
    assert last is not None  # max_new_tokens >= 1: at least one round
    return last


def _print_metrics(m: Metrics, *, seconds: float, c: float) -> None:
    print(f"acceptance rate {m.acceptance_rate:.3f}, alpha {m.alpha:.3f}, tokens/round "
          f"{m.mean_tokens_per_round:.2f}, rounds {m.rounds}, mean K {m.mean_k:.2f}")
    print(f"{m.emitted} tokens in {seconds:.2f} s: {m.emitted / seconds:.1f} tokens/s; "
          f"measured c = {c:.3f}; predicted speedup (Thm 3.8) {m.predicted_speedup(c):.2f}x")


def run_generate(args: argparse.Namespace) -> int:
    """`specsample generate`: stream one prompt, or run several as one ragged batch."""
    max_new = 128 if args.max_new_tokens is None else args.max_new_tokens
    return _generate(load(args), args.prompt, max_new, stream=len(args.prompt) == 1)


def _generate(loaded: Loaded, prompts: Sequence[str], max_new: int, *, stream: bool) -> int:
    """Generate for `prompts` as one batch; stream row 0 if asked, print the other rows after."""
    config, backend, target, drafter, tokenizer = loaded
    rows = [encode(tokenizer, p) for p in prompts]
    eos = tokenizer.eos_token_id
    ids, lengths = _batch(backend, rows, 0 if eos is None else int(eos))
    params = config.params()
    c = measure_cost_ratio(target, drafter, backend.asarray([rows[0]]), params)
    steps = _runner(backend, "iterate", iterate)(
        target, drafter, ids, max_new_tokens=max_new, params=params, k=_policy(config, c),
        seed=config.seed, eos_token_id=eos, prompt_lengths=lengths)
    began = time.perf_counter()
    if stream:
        print(f"> {prompts[0]}")
        last = _stream(steps, tokenizer, len(rows[0]))
    else:
        *_, last = steps
    seconds = time.perf_counter() - began
    for i in range(1 if stream else 0, len(rows)):
        new = [int(t) for t in last.state.tokens[i, len(rows[i]):int(last.state.lengths[i])]]
        print(f"> {prompts[i]}\n{tokenizer.decode(new, skip_special_tokens=True)}\n")
    _print_metrics(last.metrics, seconds=seconds, c=c)
    return 0


# ---- transformers peers --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class _HFVariant:
    """One way to call transformers' `generate`.

    `holder.generation_config` is replaced by `config` for the run and restored
    after it (transformers reads an assistant's settings from there, and its
    "heuristic" schedule writes back into it).
    """

    name: str
    k: int | str
    kwargs: Mapping[str, Any]
    holder: Any = None
    config: Any = None


def _hf_module(model: Any) -> Any:
    """The transformers module behind a backend model, or None."""
    module = getattr(model, "module", None)
    return module if hasattr(module, "generate") else None


def _int8_module(module: Any) -> Any:
    """A dynamically quantized (int8 linears, fbgemm) copy of an HF module: an assistant_model.

    The torch backend's int8 self-draft is a fast-path stack, not an HF module,
    so the peer gets the same quantization of a copy (tied weights are untied).
    """
    import warnings

    import torch

    if next(module.parameters()).device.type != "cpu":
        raise ValueError("draft: the int8 assistant for transformers runs on CPU only")
    clone = copy.deepcopy(module)
    if next(clone.parameters()).dtype != torch.float32:
        clone = clone.to(torch.float32)
    quantize: Any = torch.ao.quantization.quantize_dynamic  # untyped
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated, still ships fbgemm
        return quantize(clone, {torch.nn.Linear}, dtype=torch.qint8)


def _assistant_variants(holder: Any, kwargs: Mapping[str, Any], k: int | None) -> list[_HFVariant]:
    base = copy.deepcopy(holder.generation_config)
    variants = [_HFVariant(name="hf_default", k="hf-default", kwargs=kwargs, holder=holder,
                           config=base)]
    if k is not None:
        fixed = copy.deepcopy(base)
        fixed.num_assistant_tokens, fixed.num_assistant_tokens_schedule = k, "constant"
        variants.append(_HFVariant(name=f"hf_k{k}", k=k, kwargs=kwargs, holder=holder, config=fixed))
    return variants


def hf_variants(draft: str, target: Model, drafter: Drafter, k: int | None) -> list[_HFVariant]:
    """transformers' assisted generation with the same draft (empty when it has no equivalent)."""
    module = _hf_module(target)
    if module is None:
        return []
    if draft == "lookup":
        return [_HFVariant(name=f"hf_lookup{n}", k=n, kwargs={"prompt_lookup_num_tokens": n})
                for n in dict.fromkeys([10] + ([k] if k is not None else []))]
    if draft == "int8":
        assistant = _int8_module(module)
        return _assistant_variants(assistant, {"assistant_model": assistant}, k)
    if draft.startswith("early-exit:"):  # LayerSkip: the target drafts with its first N layers
        return _assistant_variants(module, {"assistant_early_exit": int(draft.split(":")[1])}, k)
    assistant = _hf_module(getattr(drafter, "model", None))
    return [] if assistant is None else _assistant_variants(assistant, {"assistant_model": assistant}, k)


def _hf_sampling(params: SamplingParams) -> dict[str, Any]:
    if params.temperature == 0:
        return {"do_sample": False}
    extra = {} if params.min_p is None else {"min_p": params.min_p}
    # transformers' defaults would add top_k=50: pass "off" explicitly.
    return {"do_sample": True, "temperature": params.temperature,
            "top_k": params.top_k or 0, "top_p": 1.0 if params.top_p is None else params.top_p, **extra}


def _hf_generate(module: Any, ids: list[int], variant: _HFVariant | None, params: SamplingParams,
                 max_new: int, seed: int, pad: int) -> tuple[int, float]:
    """(new tokens, seconds) of one transformers `generate` call, exactly max_new tokens long."""
    import torch

    inputs = torch.tensor([ids], device=module.device)
    kwargs = dict(variant.kwargs) if variant is not None else {}
    saved = None
    if variant is not None and variant.holder is not None:
        saved = variant.holder.generation_config
        variant.holder.generation_config = copy.deepcopy(variant.config)
    torch.manual_seed(seed)
    try:
        began = time.perf_counter()
        with torch.inference_mode():
            out = module.generate(inputs, attention_mask=torch.ones_like(inputs),
                                  max_new_tokens=max_new, min_new_tokens=max_new,
                                  pad_token_id=pad, **_hf_sampling(params), **kwargs)
        seconds = time.perf_counter() - began
    finally:
        if variant is not None and variant.holder is not None:
            variant.holder.generation_config = saved
    return int(out.shape[1]) - len(ids), seconds


# ---- the benchmark -------------------------------------------------------------------------

def add_bench_options(parser: argparse.ArgumentParser) -> None:
    """Options of `specsample bench models` (the bench parser has --json and --repeats)."""
    add_model_options(parser)
    parser.add_argument("--temperatures", default="0,0.7",
                        help="comma-separated settings (models; 0 = greedy)")
    parser.add_argument("--prompts", type=int, default=None,
                        help=f"use the first N built-in prompts (models: default all {len(PROMPTS)}; "
                             "greedy: default all 22)")
    parser.add_argument("--versus", default=None, metavar="BACKEND",
                        help="also run specsample on this backend (e.g. torch, to rate static-cpu "
                             "against eager): record 'specsample@BACKEND' and ratio_vs_versus")
    parser.add_argument("--skip-hf", action="store_true",
                        help="leave out transformers' plain and assisted generation")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Method:
    """A benchmarked variant: `family` is the record it competes for."""

    family: str  # "plain", "specsample" or "hf_assisted"
    name: str
    k: int | str | None
    run: Callable[[list[int], SamplingParams, int], tuple[int, float, Metrics | None]]


def _ours(loaded: Loaded, max_new: int, *,
          plain: bool) -> Callable[[list[int], SamplingParams, int], tuple[int, float, Metrics | None]]:
    backend, config = loaded.backend, loaded.config

    def run(ids: list[int], params: SamplingParams, seed: int) -> tuple[int, float, Metrics | None]:
        prompt = backend.asarray([ids])
        began = time.perf_counter()
        out: Generation
        if plain:
            out = _runner(backend, "generate_plain", generate_plain)(
                loaded.target, prompt, max_new_tokens=max_new, params=params, seed=seed)
        else:
            out = _runner(backend, "generate", generate)(
                loaded.target, loaded.drafter, prompt, max_new_tokens=max_new, params=params,
                k=config.policy(), seed=seed, eos_token_id=None)
        seconds = time.perf_counter() - began
        new = int(out.lengths[0]) - int(out.prompt_lengths[0])
        return new, seconds, None if plain else out.metrics

    return run


def _versus(loaded: Loaded, name: str, target: str, draft: str) -> Loaded:
    """The same models, config and tokenizer on another backend."""
    backend = get_backend(name, {k: v for k, v in backend_options(loaded.config).items()
                                 if k in ("device", "dtype")})
    other = backend.load_target(target)
    return loaded._replace(config=dataclasses.replace(loaded.config, backend=name), backend=backend,
                           target=other, drafter=backend.load_drafter(draft, other))


def _methods(loaded: Loaded, draft: str, max_new: int, *, versus: Loaded | None = None,
             with_hf: bool = True) -> list[_Method]:
    k = loaded.config.k
    methods = [_Method(family="plain", name="plain_ours", k=None, run=_ours(loaded, max_new, plain=True)),
               _Method(family="specsample", name="specsample", k=k,
                       run=_ours(loaded, max_new, plain=False))]
    if versus is not None:
        name = f"specsample@{versus.config.backend}"
        methods.append(_Method(family=name, name=name, k=k, run=_ours(versus, max_new, plain=False)))
    module = _hf_module(loaded.target) if with_hf else None
    if module is None:
        return methods
    eos = loaded.tokenizer.eos_token_id
    pad = 0 if eos is None else int(eos)

    def hf(variant: _HFVariant | None) -> Callable[..., tuple[int, float, Metrics | None]]:
        def run(ids: list[int], params: SamplingParams, seed: int) -> tuple[int, float, None]:
            return (*_hf_generate(module, ids, variant, params, max_new, seed, pad), None)
        return run

    methods.append(_Method(family="plain", name="plain_hf", k=None, run=hf(None)))
    methods += [_Method(family="hf_assisted", name=v.name, k=v.k, run=hf(v))
                for v in hf_variants(draft, loaded.target, loaded.drafter,
                                     k if isinstance(k, int) else None)]
    return methods


def _rotated(items: list[_Method], shift: int) -> list[_Method]:
    shift %= len(items)
    return items[shift:] + items[:shift]


def compiled_graphs() -> int | None:
    """Graphs torch.compile has produced in this process (None when torch is not loaded)."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _run_all(config: Config, methods: list[_Method], prompts: Sequence[tuple[str, list[int]]],
             temperatures: Sequence[float], repeats: int,
             graphs: list[int | None]) -> list[dict[str, Any]]:
    """Every (repeat, setting, prompt, method) once; method order rotated per repetition.

    `graphs` receives the compiled-graph count after warm-up.

    Each method first runs untimed on the shortest and the longest prompt (at the
    first setting: sampling knobs are graph inputs), so most one-off costs (a static
    backend's graphs for the smallest and largest bucket these prompts need, allocator
    growth) stay out of the timed runs. A bucket between the two, or a K an adaptive
    policy picks only later, still compiles inside a timed run.
    """
    runs: list[dict[str, Any]] = []
    by_length = sorted(prompts, key=lambda p: len(p[1]))
    warm = [by_length[0], by_length[-1]] if len(by_length) > 1 else by_length
    params = dataclasses.replace(config.params(), temperature=temperatures[0])
    for method in tqdm(methods, desc="warm-up", unit="method"):
        for _, ids in warm:
            method.run(ids, params, config.seed)
    graphs.append(compiled_graphs())
    bar = tqdm(total=repeats * len(temperatures) * len(prompts) * len(methods), desc="bench",
               unit="run")
    for rep in range(repeats):
        for temperature in temperatures:
            params = dataclasses.replace(config.params(), temperature=temperature)
            for index, (tag, ids) in enumerate(prompts):
                for method in _rotated(methods, rep + index):
                    bar.set_postfix_str(f"{method.name} T={temperature}")
                    new, seconds, metrics = method.run(ids, params, config.seed + rep)
                    runs.append({"family": method.family, "method": method.name, "k": method.k,
                                 "temperature": temperature, "prompt": index, "tag": tag,
                                 "repeat": rep, "new_tokens": new, "seconds": seconds,
                                 "tokens_per_s": new / seconds,
                                 "metrics": None if metrics is None else metrics.as_dict()})
                    bar.update(1)
    bar.close()
    return runs


def _add(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """Elementwise sum of two count vectors of any lengths."""
    width = max(len(a), len(b))
    return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(width))


def _merge(dicts: Sequence[Mapping[str, Any]]) -> Metrics:
    """Metrics summed over runs (from `Metrics.as_dict` records)."""
    counts = ("rounds", "row_rounds", "drafted", "accepted", "emitted", "full_rounds", "elapsed_s")
    total = Metrics()
    for d in dicts:
        total = dataclasses.replace(total, **{f: getattr(total, f) + d[f] for f in counts},
                                    histogram=_add(total.histogram, d["histogram"]),
                                    k_counts=_add(total.k_counts, d["k_counts"]))
    return total


def _median(runs: Sequence[Mapping[str, Any]]) -> float:
    return statistics.median(r["tokens_per_s"] for r in runs) if runs else float("nan")


def _best_variant(runs: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, float]]:
    """The fastest variant's name (by median tokens/s) and every variant's median."""
    medians = {name: _median([r for r in runs if r["method"] == name])
               for name in dict.fromkeys(r["method"] for r in runs)}
    return max(medians, key=lambda n: medians[n]), medians


def _throughput(runs: Sequence[Mapping[str, Any]]) -> float:
    """All new tokens over all seconds: the rate Thm 3.8 predicts the ratio of."""
    return float(sum(r["new_tokens"] for r in runs) / sum(r["seconds"] for r in runs))


def _record(family: str, temperature: float, runs: list[dict[str, Any]], *, draft: str, c: float,
            plain: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary of one (method, setting); `plain` holds the faster plain variant's runs."""
    best, medians = _best_variant(runs)
    chosen = [r for r in runs if r["method"] == best]
    tps = [r["tokens_per_s"] for r in chosen]
    record: dict[str, Any] = {
        "method": family, "temperature": temperature, "k": chosen[0]["k"], "draft": draft,
        "variant": best,
        "variants_tokens_per_s": medians, "tokens_per_s": statistics.median(tps),
        "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
        "tokens_per_s_q25": _quantile(tps, 0.25), "tokens_per_s_q75": _quantile(tps, 0.75),
        "acceptance_rate": None, "alpha": None, "mean_tokens_per_round": None, "c": c,
        "predicted_speedup": None, "n_runs": len(chosen)}
    record["achieved_speedup"] = record["tokens_per_s"] / _median(plain)
    record["throughput_speedup"] = _throughput(chosen) / _throughput(plain)
    record["by_tag"] = {}
    for tag in dict.fromkeys(r["tag"] for r in chosen):
        mine, base = ([r for r in rs if r["tag"] == tag] for rs in (chosen, plain))
        record["by_tag"][tag] = {"tokens_per_s": _median(mine), "n_runs": len(mine),
                                 "achieved_speedup": _median(mine) / _median(base),
                                 "throughput_speedup": _throughput(mine) / _throughput(base)}
    if family.startswith("specsample"):
        _add_acceptance(record, chosen, plain, c)
    return record


def _add_acceptance(record: dict[str, Any], runs: Sequence[Mapping[str, Any]],
                    plain: Sequence[Mapping[str, Any]], c: float) -> None:
    """alpha, Thm 3.8's prediction and the efficiency: achieved over predicted speedup.

    The prediction is a ratio of expected rates over the whole workload, so `efficiency`
    compares it with the measured ratio of rates over the same workload (all tokens over
    all seconds, against plain decoding on the same prompts and repeats), not with the
    median run, which for a mix of prompts lands on whichever prompt is in the middle.
    `efficiency_per_prompt` (median and minimum) applies the theorem to each prompt
    with that prompt's own alpha and median speedup.
    """
    m = _merge([r["metrics"] for r in runs])
    record.update(acceptance_rate=m.acceptance_rate, alpha=m.alpha,
                  mean_tokens_per_round=m.mean_tokens_per_round, mean_k=m.mean_k,
                  histogram=list(m.histogram), predicted_speedup=m.predicted_speedup(c))
    record["efficiency"] = record["throughput_speedup"] / record["predicted_speedup"]
    per_prompt = []
    for index in dict.fromkeys(r["prompt"] for r in runs):
        mine, base = ([r for r in rs if r["prompt"] == index] for rs in (runs, plain))
        predicted = _merge([r["metrics"] for r in mine]).predicted_speedup(c)
        per_prompt.append(_median(mine) / _median(base) / predicted)
    record["efficiency_per_prompt"] = {"median": statistics.median(per_prompt),
                                       "min": min(per_prompt), "n_prompts": len(per_prompt)}
    for tag, entry in record["by_tag"].items():
        t = _merge([r["metrics"] for r in runs if r["tag"] == tag])
        entry.update(alpha=t.alpha, acceptance_rate=t.acceptance_rate,
                     mean_tokens_per_round=t.mean_tokens_per_round,
                     predicted_speedup=t.predicted_speedup(c))
        entry["efficiency"] = entry["throughput_speedup"] / entry["predicted_speedup"]


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarise(runs: list[dict[str, Any]], *, draft: str, c: float) -> list[dict[str, Any]]:
    """One record per (method family, temperature), speedups against the faster plain."""
    records: list[dict[str, Any]] = []
    for temperature in dict.fromkeys(r["temperature"] for r in runs):
        at = [r for r in runs if r["temperature"] == temperature]
        plain_runs = [r for r in at if r["family"] == "plain"]
        best, _ = _best_variant(plain_runs)
        fastest = [r for r in plain_runs if r["method"] == best]
        group = {f: _record(f, temperature, [r for r in at if r["family"] == f], draft=draft, c=c,
                            plain=fastest)
                 for f in dict.fromkeys(r["family"] for r in at)}
        hf = group.get("hf_assisted")
        versus = next((group[f] for f in group if f.startswith("specsample@")), None)
        for record in group.values():
            record["ratio_vs_hf"] = None if hf is None else record["tokens_per_s"] / hf["tokens_per_s"]
            record["ratio_vs_versus"] = None if versus is None else \
                record["tokens_per_s"] / versus["tokens_per_s"]
            record.setdefault("efficiency", None)
        records += group.values()
    return records


def _plots(records: Sequence[Mapping[str, Any]], path: Path) -> list[Path]:
    """Tokens/s by method and setting; specsample's accepted-length histogram."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temperatures = list(dict.fromkeys(r["temperature"] for r in records))
    families = list(dict.fromkeys(r["method"] for r in records))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(families)
    for j, family in enumerate(families):
        rows = [next((r for r in records if r["method"] == family and r["temperature"] == t), None)
                for t in temperatures]
        xs = [i + j * width for i, r in enumerate(rows) if r is not None]
        mids = [r["tokens_per_s"] for r in rows if r is not None]
        lows = [r["tokens_per_s"] - r["tokens_per_s_min"] for r in rows if r is not None]
        highs = [r["tokens_per_s_max"] - r["tokens_per_s"] for r in rows if r is not None]
        ax.bar(xs, mids, width, yerr=[lows, highs], capsize=3, label=family)
    ax.set_xticks([i + width * (len(families) - 1) / 2 for i in range(len(temperatures))],
                  [f"T={t:g}" + (" (greedy)" if t == 0 else "") for t in temperatures])
    ax.set_ylabel("tokens/s (median; bars: min-max over runs)")
    ax.legend()
    fig.tight_layout()
    speed = path.with_name(f"{path.stem}_tokens_per_s.png")
    fig.savefig(speed, dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    spec = [r for r in records if r["method"] == "specsample"]
    bins = max((len(r["histogram"]) for r in spec), default=1)
    for j, r in enumerate(spec):
        counts = r["histogram"]
        ax.bar([n + j * 0.8 / len(spec) for n in range(len(counts))],
               [n / max(1, sum(counts)) for n in counts], 0.8 / len(spec),
               label=f"T={r['temperature']:g}")
    ax.set_xticks([n + 0.4 - 0.4 / max(1, len(spec)) for n in range(bins)], [str(n) for n in range(bins)])
    ax.set_xlabel("drafts accepted per round (specsample)")
    ax.set_ylabel("fraction of row-rounds")
    ax.legend()
    fig.tight_layout()
    accepted = path.with_name(f"{path.stem}_accepted.png")
    fig.savefig(accepted, dpi=120)
    plt.close(fig)
    return [speed, accepted]


def _fmt(value: Any, width: int, spec: str) -> str:
    return "-".rjust(width) if value is None else format(value, f">{width}{spec}")


def _table(records: Sequence[Mapping[str, Any]]) -> None:
    versus = any(r.get("ratio_vs_versus") is not None for r in records)
    print(f"{'method':<18}{'T':>5}{'k':>11}{'tok/s':>8}{'speedup':>9}{'tput':>7}{'pred':>7}{'eff':>6}"
          f"{'alpha':>7}{'vs HF':>7}" + (f"{'vs @':>7}" if versus else "") + "  variant")
    for r in records:
        print(f"{r['method']:<18}{r['temperature']:>5g}{r['k']!s:>11}{r['tokens_per_s']:>8.1f}"
              f"{r['achieved_speedup']:>8.2f}x{r['throughput_speedup']:>6.2f}x"
              f"{_fmt(r['predicted_speedup'], 7, '.2f')}"
              f"{_fmt(r['efficiency'], 6, '.2f')}{_fmt(r['alpha'], 7, '.3f')}"
              f"{_fmt(r['ratio_vs_hf'], 7, '.2f')}"
              + (_fmt(r.get("ratio_vs_versus"), 7, ".2f") if versus else "") + f"  {r['variant']}")


def _temperatures(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError as err:
        raise ValueError(f"--temperatures: expected comma-separated numbers, got {text!r}") from err
    if not values or any(t < 0 for t in values):
        raise ValueError(f"--temperatures: expected numbers >= 0, got {text!r}")
    return values


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging
    except ImportError:  # pragma: no cover: a backend without transformers
        return
    quiet: Any = logging.set_verbosity_error  # untyped
    quiet()


def bench(args: argparse.Namespace, loaded: Loaded | None = None) -> int:
    """`specsample bench models`: plain, specsample and HF assisted on the same prompts."""
    repeats = 3 if args.repeats is None else args.repeats
    count = len(PROMPTS) if args.prompts is None else args.prompts
    max_new = 64 if args.max_new_tokens is None else args.max_new_tokens
    if repeats < 1 or not 1 <= count <= len(PROMPTS) or max_new < 1:
        raise ValueError(f"--repeats >= 1, --prompts in [1, {len(PROMPTS)}], --max-new-tokens >= 1 "
                         f"expected, got {repeats}, {count}, {max_new}")
    temperatures = _temperatures(args.temperatures)
    path = Path("results/bench.json") if args.json is None else args.json
    loaded = load(args) if loaded is None else loaded
    _quiet_transformers()
    prompts = [(tag, encode(loaded.tokenizer, text)) for tag, text in PROMPTS[:count]]
    c = measure_cost_ratio(loaded.target, loaded.drafter, loaded.backend.asarray([prompts[0][1]]),
                           loaded.config.params())
    config = loaded.config
    if config.k == "adaptive" and "cost_ratio" not in config.options:
        loaded = loaded._replace(config=dataclasses.replace(
            config, options={**config.options, "cost_ratio": c}))
    versus = None if getattr(args, "versus", None) is None else \
        _versus(loaded, args.versus, args.target, args.draft)
    methods = _methods(loaded, args.draft, max_new, versus=versus,
                       with_hf=not getattr(args, "skip_hf", False))
    graphs: list[int | None] = []
    runs = _run_all(loaded.config, methods, prompts, temperatures, repeats, graphs)
    graphs.append(compiled_graphs())
    records = summarise(runs, draft=args.draft, c=c)
    settings = {"backend": config.backend, "options": dict(loaded.config.options),
                "target": args.target, "draft": args.draft, "k": config.k, "c": c,
                "max_new_tokens": max_new, "repeats": repeats, "prompts": count,
                "temperatures": temperatures, "versus": getattr(args, "versus", None),
                "compiled_graphs_after_warmup": graphs[0],
                "compiled_graphs_at_end": graphs[1],
                "top_k": config.top_k, "top_p": config.top_p,
                "min_p": config.min_p, "seed": config.seed, "methods": [m.name for m in methods]}
    _write(path, settings, records, runs)
    _table(records)
    if graphs[0] is not None:
        print(f"torch.compile graphs: {graphs[0]} after warm-up, {graphs[1]} at the end "
              f"({graphs[1] - graphs[0]} compiled during the timed runs)")  # type: ignore[operator]
    return 0


def _write(path: Path, settings: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
           runs: Sequence[Mapping[str, Any]]) -> None:
    from specsample.cli._bench import machine

    payload = {
        "benchmark": "models", "machine": machine(), "settings": settings,
        "tokens_per_s": "median over prompts x repeats of per-run new tokens / wall seconds "
                        "(one generate call, prefill included); every run generates exactly "
                        "max_new_tokens (EOS disabled)",
        "c": "median time of one draft step (propose, K=1) / one target forward, batch 1",
        "achieved_speedup": "median tokens/s over the faster plain variant's median",
        "throughput_speedup": "all new tokens / all seconds, over the same for plain",
        "efficiency": "throughput_speedup / predicted_speedup (Thm 3.8 summed over the rounds "
                      "at each K, from the pooled alpha and c)",
        "records": list(records), "runs": list(runs)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    pngs = _plots(records, path)
    print(f"wrote {path}, {', '.join(str(p) for p in pngs)}")


# ---- demo ----------------------------------------------------------------------------------

def _namespace(**values: Any) -> argparse.Namespace:
    """Parsed defaults of the model and bench options, then `values`."""
    parser = argparse.ArgumentParser()
    add_bench_options(parser)
    args = parser.parse_args([])
    args.json, args.repeats = None, None
    for name, value in values.items():
        setattr(args, name, value)
    return args


def demo(args: argparse.Namespace) -> int:
    """The README's first command: SmolLM2-135M with its int8 self-draft, then a short bench."""
    k = getattr(args, "k", None) or 4
    seed = getattr(args, "seed", None) or 0
    print(f"specsample demo: SmolLM2-135M-Instruct (target) and its int8 copy (draft), K={k}; "
          f"loading...")
    options = _namespace(k=k, seed=seed, temperature=0.7, prompts=2, repeats=1, max_new_tokens=32,
                         json=Path("results/demo.json"))
    loaded = load(options)
    print("two prompts as one ragged batch, T=0.7 (the first streamed):")
    _generate(loaded, [PROMPTS[0][1], PROMPTS[2][1]], 48, stream=True)
    print("\nshort benchmark: 2 prompts, 1 repeat, 32 tokens, greedy and T=0.7")
    return bench(options, loaded)
