"""Recorded runs that pin the emitted tokens of the public API for fixed seeds.

Each run loads a backend by config, generates from fixed prompts and seed, and keeps the
new token ids of every row. `tests/data/golden_tokens.json` holds them as recorded;
`tests/test_golden.py` reruns each and asserts the same ids, so a refactoring that moves
code cannot change one sampled token. `auto` rates its drafters, and "head" its shape (chain
or fan-out of m), by costs measured at load (timings), so those runs fix the costs
(`fixed_costs`) to make the choice, and with it the tokens, reproducible.

Re-record (only when a change is meant to alter tokens, and say why in the commit), all
runs or the named ones:
    python -m tests.golden_runs [NAME ...]
An int8 draft is pinned at T=0 only (bare "auto" chooses int8 at the fixed costs): rounding
activations to int8 turns the last-bit float differences between CPUs (vector widths, BLAS
kernels) into different draft probabilities, so at T > 0 which drafts are accepted is one
host's; its law at every T is the statistical tests' business.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).with_name("data") / "golden_tokens.json"

REFERENCE_PROMPTS = ["abcabcabcab", "hello world", "aaaa"]
TORCH_PROMPTS = ["The capital of France is", "def add(a, b):\n    return a + b\n\ndef add(a, b):"]

# name -> (config fields, max_new_tokens, runs with fixed costs: a choice rated by timings)
RUNS: dict[str, tuple[dict[str, Any], int, bool]] = {
    "reference/noisy/T1": ({"backend": "reference", "seed": 3}, 24, False),
    "reference/noisy/T0.7-topp": ({"backend": "reference", "temperature": 0.7, "top_p": 0.9, "k": 3},
                                  24, False),
    "reference/noisy/T0": ({"backend": "reference", "temperature": 0.0, "k": 4}, 24, False),
    "reference/lookup/T1": ({"backend": "reference", "draft": "lookup", "k": 4}, 24, False),
    "reference/noisy-threshold/T1": ({"backend": "reference", "draft": "noisy:0.3@0.5", "k": 4}, 24, False),
    "reference/hybrid/T1": ({"backend": "reference", "draft": "hybrid", "k": 4}, 24, False),
    "reference/block/T1": ({"backend": "reference", "verifier": "block", "k": 3, "seed": 7}, 24, False),
    "reference/adaptive/T1": ({"backend": "reference", "k": "adaptive", "options": {"cost_ratio": 0.2}},
                              24, False),
    "reference/auto/T1": ({"backend": "reference", "draft": "auto", "seed": 5}, 24, True),
    "torch/lookup/T0": ({"backend": "torch", "draft": "lookup", "temperature": 0.0, "k": 4}, 16, False),
    "torch/head/T0.7": ({"backend": "torch", "draft": "head:v1", "temperature": 0.7, "k": 3}, 16, True),
    "torch/head-tree/T1": ({"backend": "torch", "draft": "head-tree:3", "seed": 2}, 16, False),
    "torch/lookup/T0.7-topk": ({"backend": "torch", "draft": "lookup", "temperature": 0.7, "top_k": 20,
                                "k": 2}, 12, False),
    "torch/suffix/T0": ({"backend": "torch", "draft": "suffix-tree", "temperature": 0.0, "k": 4}, 16, False),
    "torch/auto/T0": ({"backend": "torch", "draft": "auto", "temperature": 0.0}, 16, True),
    "torch/auto-head/T0.7": ({"backend": "torch", "draft": "auto:head", "temperature": 0.7, "seed": 1}, 16,
                             True),
}

# The costs a run with fixed costs sees at load: the draft/target cost ratio c, and a
# verify's cost at `width` positions in plain-step units (a gentle slope, as on a CPU).
FIXED_C = 0.15
FIXED_SLOPE = 0.04


def fixed_width_cost(batch: int, width: int, slope: float = FIXED_SLOPE) -> float:
    """A target forward over `width` positions of `batch` rows, in plain steps."""
    return 1.0 + slope * (width - 1) * batch


@contextlib.contextmanager
def fixed_costs(c: float = FIXED_C, slope: float = FIXED_SLOPE) -> Iterator[None]:
    """Every cost measurement made at load returns c and a verify cost of that slope."""
    from specsample_backends.reference import backend as reference
    from specsample_backends.torch import loading

    saved = reference._cost_ratio, loading._cost_ratio, loading._width_cost
    reference._cost_ratio = lambda target, drafter: c
    loading._cost_ratio = lambda target, drafter: c
    loading._width_cost = lambda target: lambda batch, width: fixed_width_cost(batch, width, slope)
    try:
        yield
    finally:
        reference._cost_ratio, loading._cost_ratio, loading._width_cost = saved


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread: float sums in one order, whatever the machine's cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def loading(name: str, costs: tuple[float, float] | None) -> Iterator[None]:
    """Run `name`'s settings: torch on one thread, and every cost measured at load fixed to
    (c, slope) where `costs` is given (`fixed_costs`)."""
    threads = one_thread() if RUNS[name][0]["backend"] == "torch" else contextlib.nullcontext()
    with threads, contextlib.nullcontext() if costs is None else fixed_costs(*costs):
        yield


def run(name: str) -> list[list[int]]:
    """The new token ids of each prompt's row in run `name`."""
    import specsample

    fields, max_new_tokens, fixed = RUNS[name]
    prompts = TORCH_PROMPTS if fields["backend"] == "torch" else REFERENCE_PROMPTS
    with loading(name, (FIXED_C, FIXED_SLOPE) if fixed else None):
        runner = specsample.load(specsample.Config(**fields))
        generation = runner.generate(prompts, max_new_tokens=max_new_tokens)
    return [generation.new_tokens(row) for row in range(len(prompts))]


def main(names: list[str]) -> int:
    """Record the runs `names` (all when empty) into `GOLDEN`, keeping the others' ids."""
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        sys.stderr.write(f"unknown runs {unknown}; known: {sorted(RUNS)}\n")
        return 2
    kept = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    for name in names or list(RUNS):
        kept[name] = run(name)
    GOLDEN.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    sys.stderr.write(f"recorded {len(names or RUNS)} runs in {GOLDEN}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
