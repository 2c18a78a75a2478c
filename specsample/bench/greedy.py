"""`greedy`: greedy speculative decoding against plain greedy decoding, token for token."""

from __future__ import annotations

import dataclasses
from typing import Any

from specsample._array import check_int
from specsample.api.runner import Runner, encode_text
from specsample.bench.progress import NO_PROGRESS, Progress
from specsample.bench.prompts import greedy_prompts
from specsample.core.params import SamplingParams
from specsample.engine.cost import next_logits

__all__ = ["TIE_GAP", "GreedyPlan", "GreedyReport", "greedy"]

TIE_GAP = 1e-3  # logits: a first difference where the plain top-2 gap is below this is a near-tie


@dataclasses.dataclass(frozen=True, kw_only=True)
class GreedyPlan:
    """What `greedy` runs (validated on construction, before any model loads).

    Attributes:
        prompts: the first N of `greedy_prompts()` (default all).
        max_new_tokens: tokens per prompt (EOS disabled).
        tie_gap: a difference where the target's top-2 logit gap is below this is a near-tie.
    """

    prompts: int = len(greedy_prompts())
    max_new_tokens: int = 48
    tie_gap: float = TIE_GAP

    def __post_init__(self) -> None:
        every = len(greedy_prompts())
        if isinstance(self.prompts, bool) or not isinstance(self.prompts, int) or \
                not 1 <= self.prompts <= every:
            raise ValueError(f"prompts: expected 1 to {every}, got {self.prompts!r}")
        check_int("max_new_tokens", self.max_new_tokens, 1)
        if not self.tie_gap >= 0:
            raise ValueError(f"tie_gap: expected a number >= 0, got {self.tie_gap!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GreedyReport:
    """Per-prompt records and the counts: equal, near-ties, other differences."""

    records: list[dict[str, Any]]
    equal: int
    near_ties: int
    other: int


def _gap(runner: Runner, ids: list[int]) -> tuple[float, int, int]:
    """(top-1 minus top-2 logit, top-1 id, top-2 id) of the target's next token after `ids` (torch)."""
    top = next_logits(runner.target, runner.backend.asarray([ids])).double().topk(2)
    values, tokens = top.values.tolist(), top.indices.tolist()
    return values[0] - values[1], int(tokens[0]), int(tokens[1])


def _compare(runner: Runner, text: str, n: int, tie_gap: float) -> dict[str, Any]:
    ids = encode_text(runner.tokenizer, text)
    kw: dict[str, Any] = {"max_new_tokens": n, "params": SamplingParams(temperature=0), "eos_token_id": None}
    plain = runner.generate_plain([ids], **kw).new_tokens(0)
    spec = runner.generate([ids], **kw).new_tokens(0)
    first = next((i for i, (a, b) in enumerate(zip(plain, spec, strict=False)) if a != b),
                 None if len(plain) == len(spec) else min(len(plain), len(spec)))
    record: dict[str, Any] = {"prompt": text[:60], "tokens": len(plain), "equal": first is None,
                              "first_difference": first}
    if first is not None:
        gap, best, second = _gap(runner, ids + plain[:first])
        record.update(top2_gap=gap, plain_token=plain[first] if first < len(plain) else None,
                      spec_token=spec[first] if first < len(spec) else None,
                      top2=[best, second], near_tie=gap < tie_gap)
    return record


def greedy(runner: Runner, plan: GreedyPlan, *, progress: Progress = NO_PROGRESS) -> GreedyReport:
    """Greedy speculative vs plain greedy decoding on the runner's backend engine (EOS off).

    Speculative verification scores K+1 positions in one forward while plain decoding
    scores one: float32 sums in another order, so where the target's two best logits
    are within rounding of each other the argmax may flip. Each first difference is
    reported with the plain forward's top-2 gap and counted as a near-tie when the
    gap is below `plan.tie_gap`.
    """
    if not isinstance(plan, GreedyPlan):
        raise TypeError(f"plan: expected a GreedyPlan, got {type(plan).__name__}")
    prompts = greedy_prompts()[:plan.prompts]
    progress.stage("greedy", len(prompts), "prompt")
    records = []
    for text in prompts:
        records.append(_compare(runner, text, plan.max_new_tokens, plan.tie_gap))
        progress.advance(1)
    progress.end()
    equal = sum(r["equal"] for r in records)
    ties = sum(bool(r.get("near_tie")) for r in records)
    return GreedyReport(records=records, equal=equal, near_ties=ties, other=len(records) - equal - ties)
