"""Draft trees and verification rules, measured side by side.

`trees`: on the grounded prompts, plain decoding, single-chain prompt lookup and the
suffix-tree drafter at several node budgets, interleaved in every repeat: tokens/s (all
tokens over all seconds), tokens per target forward and the ratio to plain decoding;
and the cost curve of a wide verify (a target forward over 1 + N tokens against one
token), since a wider tree pays for its width on a CPU.

`verifiers`: token-wise against block verification with the same drafts, seeds and
prompts: mean accepted drafts per round, at each temperature.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specsample._array import check_int
from specsample.api.runner import Runner
from specsample.bench.progress import NO_PROGRESS, Progress
from specsample.bench.prompts import PROMPTS
from specsample.bench.stats import bootstrap_interval
from specsample.core.cache import rollback
from specsample.core.params import SamplingParams
from specsample.core.protocols import forward_select
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.drafters.suffix import SuffixTreeDrafter
from specsample.engine.cost import timings

__all__ = ["TreePlan", "VerifierPlan", "plot_trees", "trees", "verifiers"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TreePlan:
    """What `trees` measures.

    Attributes:
        budgets: the suffix tree's node budgets N; depth: its levels.
        lookup_k: the single-chain prompt lookup's K.
        max_new_tokens, repeats, temperature: each run's length, the runs per method
            (interleaved), the sampling temperature (0: greedy).
        widths: the verify widths N of the cost curve (a forward over 1 + N tokens).
    """

    budgets: tuple[int, ...] = (2, 4, 8, 16)
    depth: int = 6
    lookup_k: int = 4
    max_new_tokens: int = 64
    repeats: int = 2
    temperature: float = 0.0
    widths: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32)

    def __post_init__(self) -> None:
        for name in ("budgets", "widths"):
            values = getattr(self, name)
            if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < (name == "budgets")
                                 for v in values):
                raise ValueError(f"{name}: expected a non-empty tuple of ints >= {int(name == 'budgets')}, "
                                 f"got {values!r}")
        for name in ("depth", "lookup_k", "max_new_tokens", "repeats"):
            check_int(name, getattr(self, name), 1)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or \
                self.temperature < 0:
            raise ValueError(f"temperature: expected a number >= 0, got {self.temperature!r}")


def _run(runner: Runner, drafter: Any, text: str, plan: TreePlan, seed: int, k: int) -> dict[str, Any]:
    """One generation of `text` (EOS off): tokens, seconds, target forwards."""
    ids, lengths = runner.encode([text])
    params = SamplingParams(temperature=plan.temperature)
    run = runner.options(max_new_tokens=plan.max_new_tokens, params=params, seed=seed, eos_token_id=None,
                         k=k, prompt_lengths=lengths)
    began = time.perf_counter()
    if drafter is None:
        out = runner.backend.generate_plain(runner.target, ids, run)
        forwards = len(out.new_tokens(0))
    else:
        out = runner.backend.generate(runner.target, drafter, ids, run)
        forwards = out.metrics.row_rounds
    return {"new_tokens": len(out.new_tokens(0)), "seconds": time.perf_counter() - began,
            "forwards": forwards, "accepted": 0 if drafter is None else out.metrics.accepted}


def _cost_curve(runner: Runner, widths: Sequence[int], repeats: int = 7) -> list[dict[str, float]]:
    """Median time of a target forward over 1 + N tokens after a grounded prompt, and its
    ratio to N = 0."""
    target = runner.target
    ids, lengths = runner.encode([PROMPTS[1][1]])
    width = int(lengths[0])
    cache = target.new_cache(1, width + max(widths) + 2)
    _, _, cache = forward_select(target, ids[:, :width - 1], cache, None)
    cache = rollback(cache, lengths - 1)
    medians = {}
    for n in widths:
        feed = runner.backend.asarray([[int(ids[0, width - 1])] * (n + 1)])

        def step(feed: Any = feed) -> None:
            nonlocal cache
            logits, cache = target.forward(feed, cache)
            float(logits[0, -1, 0])  # wait for the device
            cache = rollback(cache, lengths - 1)

        medians[n] = statistics.median(timings(step, repeats))
    return [{"nodes": n, "median_ms": 1e3 * medians[n], "relative": medians[n] / medians[widths[0]]}
            for n in widths]


def trees(runner: Runner, plan: TreePlan, *, progress: Progress = NO_PROGRESS) -> dict[str, Any]:
    """Plain, lookup (K = plan.lookup_k) and suffix trees at each budget, on the grounded prompts.

    Returns:
        {"records": one per method (tokens/s, tokens per forward, ratio to plain with a
        bootstrap 95% interval over the repeats, runs), "cost_curve": [...], "plan": ...}.
    """
    if not isinstance(plan, TreePlan):
        raise TypeError(f"plan: expected a TreePlan, got {type(plan).__name__}")
    prompts = [text for tag, text in PROMPTS if tag == "grounded"]
    methods: list[tuple[str, Any, int]] = [
        ("plain", None, 1), (f"lookup K={plan.lookup_k}", PromptLookupDrafter(), plan.lookup_k)]
    methods += [(f"suffix-tree N={n}", SuffixTreeDrafter(nodes=n, depth=plan.depth), n) for n in plan.budgets]
    progress.stage("trees", len(methods) * (1 + len(prompts) * plan.repeats), "run")
    for name, drafter, k in methods:  # warm-up: one short run each
        _run(runner, drafter, prompts[0], dataclasses.replace(plan, max_new_tokens=8), 0, k)
        progress.advance(1, name)
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name, _, _ in methods}
    for repeat in range(plan.repeats):
        for name, drafter, k in methods:
            one = []
            for i, text in enumerate(prompts):
                one.append(_run(runner, drafter, text, plan, 1000 * repeat + i, k))
                progress.advance(1, name)
            runs[name].append(one)
    progress.end()
    rate = {name: [sum(r["new_tokens"] for r in rep) / sum(r["seconds"] for r in rep) for rep in reps]
            for name, reps in runs.items()}
    records = []
    for name, _, k in methods:
        flat = [r for rep in runs[name] for r in rep]
        ratios = [a / b for a, b in zip(rate[name], rate["plain"], strict=True)]
        records.append({
            "method": name, "budget": k if name.startswith("suffix") else None,
            "tokens_per_s": sum(r["new_tokens"] for r in flat) / sum(r["seconds"] for r in flat),
            "tokens_per_forward": sum(r["new_tokens"] for r in flat) / sum(r["forwards"] for r in flat),
            "ratio_vs_plain": statistics.median(ratios), "ratio_vs_plain_ci95": bootstrap_interval(ratios),
            "runs": flat})
    return {"records": records, "cost_curve": _cost_curve(runner, plan.widths),
            "plan": dataclasses.asdict(plan), "prompts": len(prompts)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifierPlan:
    """What `verifiers` measures: K drafts per round, the temperatures, tokens per prompt,
    seeds per prompt (the same for both rules)."""

    k: int = 4
    temperatures: tuple[float, ...] = (0.0, 0.7)
    max_new_tokens: int = 64
    seeds: int = 2

    def __post_init__(self) -> None:
        check_int("k", self.k, 1)
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_int("seeds", self.seeds, 1)
        if not self.temperatures or any(isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0
                                        for t in self.temperatures):
            raise ValueError(f"temperatures: expected a non-empty tuple of numbers >= 0, got "
                             f"{self.temperatures!r}")


def verifiers(runner: Runner, plan: VerifierPlan, *, progress: Progress = NO_PROGRESS) -> dict[str, Any]:
    """Token-wise vs block verification with the runner's drafter, on all benchmark prompts.

    Returns:
        {"records": per (temperature, rule): accepted drafts, rounds, mean accepted per
        round; "gains": per temperature, block's mean over token-wise's, "plan": ...}.
    """
    if not isinstance(plan, VerifierPlan):
        raise TypeError(f"plan: expected a VerifierPlan, got {type(plan).__name__}")
    rules = ("token", "block")
    progress.stage("verifiers", len(plan.temperatures) * len(rules) * len(PROMPTS) * plan.seeds, "run")
    records: list[dict[str, Any]] = []
    for temperature in plan.temperatures:
        for rule in rules:
            accepted = rounds = 0
            for i, (_, text) in enumerate(PROMPTS):
                for seed in range(plan.seeds):
                    out = runner.generate([text], max_new_tokens=plan.max_new_tokens, k=plan.k,
                                          params=SamplingParams(temperature=temperature),
                                          seed=100 * i + seed, eos_token_id=None, verifier=rule)
                    accepted += out.metrics.accepted
                    rounds += out.metrics.row_rounds
                    progress.advance(1, f"T={temperature:g} {rule}")
            records.append({"temperature": temperature, "verifier": rule, "accepted": accepted,
                            "rounds": rounds, "accepted_per_round": accepted / rounds})
    progress.end()
    gains = {}
    for temperature in plan.temperatures:
        token, block = (next(r for r in records if r["temperature"] == temperature and r["verifier"] == v)
                        for v in rules)
        gains[f"{temperature:g}"] = block["accepted_per_round"] / token["accepted_per_round"]
    return {"records": records, "gains": gains, "plan": dataclasses.asdict(plan)}


def plot_trees(report: dict[str, Any], path: str | Path) -> Path:
    """Tokens/s and tokens per forward by node budget (lookup and plain as lines), and the
    verify cost curve; `<stem>.png` beside the JSON `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path).with_suffix(".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    records = report["records"]
    tree = [r for r in records if r["budget"] is not None]
    fig, (speed, cost) = plt.subplots(1, 2, figsize=(11, 4))
    budgets = [r["budget"] for r in tree]
    speed.plot(budgets, [r["tokens_per_s"] for r in tree], "o-", label="suffix tree: tokens/s")
    for r in records:
        if r["budget"] is None:
            speed.axhline(r["tokens_per_s"], linestyle="--" if r["method"] == "plain" else ":",
                          color="grey" if r["method"] == "plain" else "tab:orange", label=r["method"])
    twin = speed.twinx()
    twin.plot(budgets, [r["tokens_per_forward"] for r in tree], "s-", color="tab:green",
              label="suffix tree: tokens per forward")
    twin.set_ylabel("tokens per target forward")
    speed.set_xscale("log", base=2)
    speed.set_xlabel("node budget N")
    speed.set_ylabel("tokens/s")
    speed.set_title("grounded prompts")
    lines, labels = speed.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    speed.legend(lines + more, labels + more_labels, fontsize=8, loc="lower right")
    curve = report["cost_curve"]
    cost.plot([c["nodes"] + 1 for c in curve], [c["relative"] for c in curve], "o-")
    cost.set_xscale("log", base=2)
    cost.set_xlabel("tokens in one target forward (1 + N)")
    cost.set_ylabel("time / one-token forward")
    cost.set_title("verify cost curve")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
