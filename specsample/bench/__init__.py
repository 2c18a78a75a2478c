"""Benchmarks as a library: explicit arguments in, records (dicts, frozen dataclasses) out.

`models` times plain decoding, specsample and transformers' assisted generation on
the same prompts; `batch` runs ragged rows against batch 1; `memory` follows resident
memory over a long generation; `greedy` compares greedy speculative and plain decoding
token for token. Each takes a `Runner` (`specsample.load(config, target=..., draft=...)`)
and runs on its backend's own engine. Nothing here prints: progress goes to a `Progress` the caller gives,
and `specsample.cli` prints the tables. Heavy libraries (torch, transformers,
matplotlib) are imported when a function runs.
"""

from specsample.bench.greedy import TIE_GAP, GreedyPlan, GreedyReport, greedy
from specsample.bench.measure import MEMORY_GROWTH_MIB, batch, memory, rss_mib
from specsample.bench.models import (
    Method,
    ModelsPlan,
    ModelsReport,
    UnsummarisedRuns,
    methods,
    models,
    run_all,
    write_models,
)
from specsample.bench.output import compiled_graphs, machine, write_json
from specsample.bench.peers import HFVariant, hf_generate, hf_sampling, hf_variants, int8_assistant
from specsample.bench.plots import plot_models
from specsample.bench.progress import NO_PROGRESS, Progress
from specsample.bench.prompts import BATCH_PROMPTS, MEMORY_PROMPT, PROMPTS, greedy_prompts
from specsample.bench.stats import (
    best_variant,
    bootstrap_interval,
    median_rate,
    merge_metrics,
    paired_interval,
    quantile,
    throughput,
)
from specsample.bench.summary import summarise
from specsample.engine.cost import measure_cost_ratio, next_logits

__all__ = [
    "BATCH_PROMPTS", "MEMORY_GROWTH_MIB", "MEMORY_PROMPT", "NO_PROGRESS", "PROMPTS", "TIE_GAP",
    "GreedyPlan", "GreedyReport", "HFVariant", "Method", "ModelsPlan", "ModelsReport",
    "Progress", "UnsummarisedRuns", "batch", "best_variant", "bootstrap_interval", "compiled_graphs",
    "greedy",
    "greedy_prompts", "hf_generate", "hf_sampling", "hf_variants", "int8_assistant",
    "machine", "measure_cost_ratio", "median_rate", "memory", "merge_metrics", "methods", "models",
    "next_logits", "paired_interval", "plot_models", "quantile", "rss_mib", "run_all",
    "summarise", "throughput", "write_json", "write_models",
]
