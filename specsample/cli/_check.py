"""`specsample check`: speculative sampling of a real target, tested against the target's exact
law and against plain sampling."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
from tqdm import tqdm

from specsample._array import host_array
from specsample.api.backend import CoreBackend
from specsample.api.config import DEFAULT_K, Config
from specsample.api.runner import Runner, load
from specsample.cli._check_law import BINS, Panel, digest, exact_law, law_tests, plot
from specsample.cli.options import add_model_options, config_from_args, sampling_given
from specsample.core.params import SamplingParams
from specsample.core.protocols import FeatureDrafter, TreeDrafter, reads_features
from specsample.core.shard import Shard, join
from specsample.core.verifiers import get_verifier
from specsample.drafters.hybrid import HybridDrafter
from specsample.drafters.model import ModelDrafter
from specsample.drafters.suffix import is_suffix_tree_name
from specsample.testing import (
    broken,
    detectable_tv,
    samples_needed,
    samples_needed_two_sample,
    tree_samples,
)

PROMPT = "The best thing about summer is"  # a first token with spread at T=1 and under top-p 0.9
# For drafters that copy from the context (suffix trees): its suffix recurs, so rounds draft.
COPY_PROMPT = "The cat sat on the mat, and the dog sat on the rug. Then the cat sat on the"
# The built-in pair, checked when no sampling option is given (by flag, config file or environment).
SETTINGS = {"t1.0": SamplingParams(temperature=1.0), "t0.7-p0.9": SamplingParams(temperature=0.7, top_p=0.9)}
ROWS = 200
TV = 0.02  # the default TV distance to detect
SINGLE = Shard()


def add_parser(sub: Any) -> None:
    """Register the `check` subcommand."""
    parser = sub.add_parser(
        "check", help="speculative sampling of a real target, tested against its exact law and "
                      "against plain sampling")
    add_model_options(parser)
    parser.add_argument("--sampler", choices=("auto", "tree", "engine"), default="auto",
                        help="tree: exact laws per distinct prefix, shared by rows (large n); "
                             "engine: the backend's own generate, caches and all (smaller n); "
                             "auto: tree where the backend runs the core round with a model "
                             "draft (e.g. --draft int8, int8@0.5), a hybrid (hybrid, hybrid@0.5) "
                             "or a tree drafter (suffix-tree), else engine")
    parser.add_argument("--against", choices=("both", "exact"), default="both",
                        help="what the speculative samples are tested against: both (the target's "
                             "exact law and plain sampling's samples) or exact (the exact law "
                             "only: no plain sample is drawn, and the one-sample test needs fewer "
                             "samples for the same power)")
    parser.add_argument("--n", "--samples", dest="n", type=int, default=None,
                        help="samples per method and setting (--samples under torchrun, whose "
                             "own options --nnodes, --nproc-per-node make --n ambiguous; default: "
                             "enough to detect --tv with the tree sampler, and with the engine "
                             "where --tv is given, else 2000 with the engine)")
    parser.add_argument("--tv", type=float, default=None,
                        help=f"the TV distance the default --n detects (miss rate <= --alpha): "
                             f"with the tree sampler (default {TV}), and with the engine where "
                             f"given")
    parser.add_argument("--rows", type=int, default=None,
                        help=f"rows per generate call (engine; default {ROWS})")
    parser.add_argument("--settings", default=None,
                        help=f"comma-separated, from {sorted(SETTINGS)} (default: both, unless "
                             f"--temperature/--top-k/--top-p/--min-p or the config set one)")
    parser.add_argument("--prompt", default=None,
                        help="the (raw, not chat-formatted) prompt (default: one whose first token "
                             "has spread; for a drafter that copies from the context, suffix-tree "
                             "or hybrid, one whose suffix recurs)")
    parser.add_argument("--alpha", type=float, default=1e-3, help="false-failure rate of each test")
    parser.add_argument("--broken", choices=sorted([*broken.VERIFIERS, *broken.TREE_VERIFIERS]),
                        default=None, help="swap the acceptance rule for a known-wrong one (a negative "
                                           "control; the tree-* rules for a tree drafter)")
    parser.add_argument("--plot", type=Path, default=Path("results/check.png"),
                        help="the figure of the first token's laws; the results go beside it as "
                             "JSON (the same name, .json)")
    parser.add_argument("--distributed", action="store_true",
                        help="split the rows over the ranks of a torchrun launch (gloo): the engine "
                             "sampler's calls, or the tree sampler's rows; rank 0 gathers them in "
                             "order and tests: the same samples as one process")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a rank waits for the others before failing (--distributed)")
    parser.set_defaults(run=run)


def _draw(fn: Any, n: int, rows: int, bar: tqdm, shard: Shard, **kwargs: Any) -> np.ndarray | None:
    """[n, 3] first three generated tokens, from calls of `rows` rows; call c uses seed + c, so
    the calls can run on any rank (None on ranks other than 0)."""
    seed = int(kwargs.pop("seed"))

    def call(c: int) -> np.ndarray:
        g = fn(seed=seed + c, **kwargs)
        new: np.ndarray = host_array(g.sequences[:, int(g.prompt_lengths[0]):][:, :3])
        bar.update(len(new))
        return new

    out = shard.run(-(-n // rows), call)
    return None if out is None else np.concatenate(out)[:n]


def _engine(runner: Runner, args: argparse.Namespace, prompt: Any, params: SamplingParams,
            verifier: Any, bar: tqdm, shard: Shard = SINGLE) -> tuple[np.ndarray, np.ndarray | None] | None:
    """[n, 3] first tokens of speculative and plain generations (no plain ones when tested
    against the exact law only), through the backend's engine (None on ranks other than 0)."""
    rows = runner.backend.asarray(np.zeros((min(args.rows or ROWS, args.n), 1), dtype=np.int64)) + prompt
    common = {"prompts": rows, "max_new_tokens": 3, "params": params, "eos_token_id": None}
    spec = _draw(runner.generate, args.n, len(rows), bar, shard, seed=runner.config.seed,
                 verifier=runner.config.verifier if args.broken is None else verifier, **common)
    if args.against == "exact":
        return None if spec is None else (spec, None)
    plain = _draw(runner.generate_plain, args.n, len(rows), bar, shard,
                  seed=runner.config.seed + 10**6, **common)
    return None if spec is None or plain is None else (spec, plain)


def _tree(runner: Runner, args: argparse.Namespace, prompt: Any, params: SamplingParams,
          verifier: Any, bar: tqdm, shard: Shard = SINGLE) -> tuple[np.ndarray, np.ndarray | None] | None:
    """[n, 3] first tokens of speculative and plain sampling, each distinct prefix once (None
    on ranks other than 0). Rank r of W samples rows [r n / W, (r + 1) n / W): each row's
    uniforms are keyed by its global index, so the split changes no sample."""

    def part(r: int) -> tuple[np.ndarray, np.ndarray]:
        first, stop = r * args.n // shard.world, (r + 1) * args.n // shard.world
        k = runner.config.k if isinstance(runner.config.k, int) else 1  # a tree drafter's budget is its own
        spec, plain, counts = tree_samples(runner.target, runner.drafter, prompt, n=stop - first,
                                           first_row=first, k=k, params=params,
                                           seed=runner.config.seed, verifier=verifier,
                                           lookahead=broken.LOOKAHEAD.get(args.broken or "", 0),
                                           progress=bar.update)
        bar.set_postfix(laws=counts["laws"], forwarded=counts["forwarded"])
        return spec, plain

    parts = shard.run(shard.world, part)
    if parts is None:
        return None
    plain = None if args.against == "exact" else np.concatenate([p[1] for p in parts])
    return np.concatenate([p[0] for p in parts]), plain


def _needed(args: argparse.Namespace) -> int:
    """Samples per method for the weakest test run to detect --tv with both error rates <= --alpha."""
    size = samples_needed if args.against == "exact" else samples_needed_two_sample
    return size(TV if args.tv is None else args.tv, m=BINS, alpha=args.alpha, beta=args.alpha)


def _constant_k(k: int | str | None) -> None:
    if not isinstance(k, int):
        raise ValueError(f"--k: the tree sampler needs a constant K, got {k!r} (or use "
                         f"--sampler engine)")


def _copies(drafter: Any) -> TypeGuard[HybridDrafter]:
    """A `hybrid` (prompt lookup's copies, a model elsewhere, no cost gate): the tree sampler
    runs it (an `auto` hybrid's gate reads each row's record and the batch: the engine)."""
    return isinstance(drafter, HybridDrafter) and drafter.scheduler is None


def _mode(args: argparse.Namespace, runner: Runner) -> str:
    """Pick and validate the sampler for the backend and drafter; fill in the default n."""
    config, drafter = runner.config, runner.drafter
    runs_core: Any = CoreBackend.generate
    own_engine = type(runner.backend).generate is not runs_core  # e.g. the static engine
    # The tree sampler reads a model drafter's laws per prefix, or builds a deterministic
    # tree per distinct context; a feature head also needs the target's features of each
    # round, which only the engine gives it.
    trees = isinstance(drafter, TreeDrafter)
    inner = drafter.model if _copies(drafter) else drafter
    tree_ok = (trees and not reads_features(drafter)) or (
        isinstance(inner, ModelDrafter) and not isinstance(inner, FeatureDrafter))
    if args.sampler == "auto":
        args.sampler = "engine" if own_engine or not tree_ok else "tree"
    if args.broken is not None and (args.broken in broken.TREE_VERIFIERS) != trees:
        wanted = "a tree rule (tree-*)" if trees else "a chain rule (not tree-*)"
        raise ValueError(f"--broken: a {'tree' if trees else 'chain'} drafter ({config.draft!r}) is "
                         f"verified by {wanted}, got {args.broken!r}")
    rule = (f"the core's {'tree' if trees else config.verifier} rule" if args.broken is None
            else f"BROKEN rule {args.broken!r}")
    if args.sampler == "tree":
        if not trees:
            _constant_k(config.k)
        if not tree_ok:
            raise ValueError(f"--draft: the tree sampler needs a draft model (int8, early-exit:N "
                             f"or a model, with or without @THRESHOLD), a hybrid of one, or a tree "
                             f"drafter (suffix-tree), got {config.draft!r} (or use --sampler engine)")
        if args.rows is not None:
            raise ValueError(f"--rows: only the engine sampler draws in calls of rows, got {args.rows} "
                             f"with the tree sampler (or use --sampler engine)")
        if args.n is None:
            args.n = _needed(args)
        return f"tree sampler (exact laws per distinct prefix, {rule})"
    if args.n is None:
        args.n = 2000 if args.tv is None else _needed(args)
    if own_engine:
        if args.broken is not None:
            raise ValueError(f"--broken: backend {config.backend!r} runs its own verify step; "
                             f"use --sampler tree, or a backend that runs the core round "
                             f"(torch, reference)")
        return "the backend's own engine"
    return f"the core round ({rule})"


def label(params: SamplingParams) -> str:
    """A short name of a sampling setting, e.g. "t0.5-k40-p0.9"."""
    parts = [f"t{params.temperature:g}"]
    for key, value in (("k", params.top_k), ("p", params.top_p), ("m", params.min_p)):
        if value is not None:
            parts.append(f"{key}{value:g}")
    return "-".join(parts)


def settings(args: argparse.Namespace, config: Config) -> dict[str, SamplingParams]:
    """The setting the sampling options (or the config) give, else the built-in ones --settings names."""
    given = sampling_given(args)
    if given:
        if args.settings is not None:
            raise ValueError(f"--settings: give either --settings or sampling options, got --settings "
                             f"{args.settings!r} and {', '.join(given)} (from the options or the config)")
        return {label(config.params()): config.params()}
    names = [s.strip() for s in (args.settings or ",".join(SETTINGS)).split(",") if s.strip()]
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        raise ValueError(f"--settings: unknown {unknown}; known: {sorted(SETTINGS)}")
    return {name: SETTINGS[name] for name in names}


def run(args: argparse.Namespace) -> int:
    """Run every setting; exit status 0 when every test passes."""
    if args.n is not None and args.n < 100:
        raise ValueError(f"--n: expected >= 100 samples per method, got {args.n}")
    if args.tv is not None and not 0 < args.tv <= 1:
        raise ValueError(f"--tv: expected a TV distance in (0, 1], got {args.tv}")
    if args.max_new_tokens is not None:
        raise ValueError(f"--max-new-tokens: not used by `specsample check` (it tests the first 3 "
                         f"tokens), got {args.max_new_tokens}")
    config = config_from_args(args)
    if config.k is None:  # the exact checks enumerate rounds: the plain default K, not auto's cap
        config = dataclasses.replace(config, k=DEFAULT_K)
    chosen = settings(args, config)
    if args.sampler == "tree" and not is_suffix_tree_name(config.draft):
        _constant_k(config.k)  # fail before loading models (a tree drafter's budget is its own)
    runner = load(config)
    backend, tokenizer = runner.backend, runner.tokenizer
    if args.prompt is None:
        trees = isinstance(runner.drafter, TreeDrafter) and not reads_features(runner.drafter)
        copies = trees or _copies(runner.drafter)  # a head's trees are grown, not copied
        args.prompt = COPY_PROMPT if copies else PROMPT
    prompt = backend.asarray([tokenizer.encode(args.prompt)])  # raw text: no chat template
    verifier = get_verifier(config.verifier) if args.broken is None else \
        {**broken.VERIFIERS, **broken.TREE_VERIFIERS}[args.broken]
    rule = args.broken or ("tree" if isinstance(runner.drafter, TreeDrafter) else config.verifier)
    mode = _mode(args, runner)
    if args.n < 100:
        raise ValueError(f"--n: expected >= 100 samples per method, got {args.n} (from --tv "
                         f"{args.tv} and --alpha {args.alpha})")
    if not args.distributed:
        return _report(runner, args, prompt, chosen, verifier, rule, mode, SINGLE)
    shard = join(args.timeout)
    try:
        if shard.rank == 0:
            return _report(runner, args, prompt, chosen, verifier, rule, f"{mode}, {shard.world} ranks",
                           shard)
        draw = _tree if args.sampler == "tree" else _engine
        for params in chosen.values():  # the other ranks sample their share and send it to rank 0
            draw(runner, args, prompt, params, verifier, tqdm(disable=True), shard)
        return 0
    finally:
        shard.close()


def _report(runner: Runner, args: argparse.Namespace, prompt: Any, chosen: dict[str, SamplingParams],
            verifier: Any, rule: str, mode: str, shard: Shard) -> int:
    """Rank 0 (or the only process): sample every setting, test, print, plot, write the JSON."""
    config, tokenizer = runner.config, runner.tokenizer
    print(f"check: target {config.target or 'default'}, draft {config.draft or 'default'}, "
          f"backend {config.backend}, K={config.k}, verifier {rule}, {mode}, prompt {args.prompt!r}, "
          f"n={args.n:,} per method, against {args.against}, alpha={args.alpha}")
    tv = TV if args.tv is None else args.tv
    kind = "one-sample (against the exact law)" if args.against == "exact" else "two-sample"
    print(f"  {kind} size to detect TV {tv} with both error rates <= {args.alpha}: {_needed(args):,} "
          f"per method ({BINS} outcomes)")
    ok, panels, records = True, [], {}
    for name, params in chosen.items():
        passed, panel, record = _one(runner, args, prompt, name, params, verifier, shard)
        ok &= passed
        panels.append(panel)
        records[name] = record
    plot(panels, args.plot, tokenizer)
    print(f"wrote {args.plot}")
    out = args.plot.with_suffix(".json")
    out.write_text(json.dumps({
        "target": config.target or "default", "draft": config.draft or "default",
        "backend": config.backend, "k": config.k, "drafter": _shape(runner.drafter), "rule": rule,
        "broken": args.broken, "sampler": mode,
        "prompt": args.prompt, "n": args.n, "against": args.against, "alpha": args.alpha,
        # The TV the tests against the exact law detect with this n (miss rate <= alpha).
        "tv_detected": detectable_tv(args.n, m=BINS, alpha=args.alpha), "passed": bool(ok),
        "settings": records,
    }, indent=1) + "\n")
    print(f"wrote {out}")
    print("check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def _shape(drafter: Any) -> dict[str, Any]:
    """The drafter a name resolved to: its class and, for a tree, its node budget (a head's
    fan-out is chosen at load from the costs measured then)."""
    out: dict[str, Any] = {"class": type(drafter).__name__}
    for key in ("nodes", "depth", "branch"):
        value = getattr(drafter, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    return out


def _one(runner: Runner, args: argparse.Namespace, prompt: Any, name: str, params: SamplingParams,
         verifier: Any, shard: Shard) -> tuple[bool, Panel, dict[str, Any]]:
    """Sample, test and print one setting; (every test passed, the plot's panel, the JSON record)."""
    draw = _tree if args.sampler == "tree" else _engine
    alone = args.against == "exact" and args.sampler == "engine"  # the tree sampler draws both at once
    bar = tqdm(total=args.n * (1 if alone else 2), desc=f"{name}: sampling", unit="seq")
    began = time.perf_counter()
    drawn = draw(runner, args, prompt, params, verifier, bar, shard)
    assert drawn is not None  # rank 0 gathers every call
    spec, plain = drawn
    bar.close()
    law_of = exact_law(runner, prompt, params)
    exact = law_of(())
    results, sequences, masses = law_tests(spec, plain, law_of, args.alpha)
    seconds = time.perf_counter() - began
    print(f"{name} ({seconds:.0f} s): {params}")
    if float(exact.max()) > 1 - 1e-9:
        print(f"  note: under {name} the first token after {args.prompt!r} is certain "
              f"({runner.tokenizer.decode([int(exact.argmax())])!r}): the first-token tests say "
              f"nothing here; the 3-token tests do (or choose another --prompt)")
    for what, result in results.items():
        print(f"  {what}: {result}")
    digests = [digest(spec)] + ([] if plain is None else [digest(plain)])
    print(f"  samples digest ({'speculative, plain' if plain is not None else 'speculative'}): "
          f"{' '.join(digests)}")
    print(f"  TV here is between the laws projected on {BINS} outcomes; a test misses a TV >= its "
          f"'detects' value with probability <= {args.alpha:.2g} where the outcomes come from the "
          f"exact law (tests against exact p), <= {2 * args.alpha:.2g} against plain (its outcomes "
          f"are the most frequent in both samples together, chosen from the data, so that miss "
          f"bound is approximate); every false-failure bound is exact")
    record = {
        "params": dataclasses.asdict(params), "seconds": round(seconds, 1), "digests": digests,
        "sequences": [list(q) for q in sequences], "sequence_probabilities": [float(m) for m in masses],
        "tests": {what: {key: (value if not isinstance(value, np.generic) else value.item())
                         for key, value in dataclasses.asdict(result).items()}
                  for what, result in results.items()},
    }
    passed = all(r.passed for r in results.values())
    return passed, (name, spec[:, 0], None if plain is None else plain[:, 0], exact), record
