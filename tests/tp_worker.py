"""One rank of a tensor-parallel run of SmolLM2, launched by `torchrun` from test_backend_torch_parallel.

    torchrun --nproc_per_node N tests/tp_worker.py OUT.json [--tiny]

Every rank loads the target sharded N ways (`tp = N`, the per-round replica check on)
and generates for the 8 batch prompts, greedy with the default drafter and sampled at
T = 0.8 with an early-exit draft. It then counts the collectives of one target forward
and of one speculative round with the profiler, and runs a negative control: rank 1
samples with another seed, which the replica check must name. Rank 0 writes it all to
OUT.json. With --tiny, a small random Llama that shards 2 ways runs instead (`tiny_runs`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from specsample_backends.torch import HFModel, create
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

import specsample
from specsample.api.config import Config
from specsample.bench.prompts import BATCH_PROMPTS
from specsample.core.params import SamplingParams
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.drafters.model import ModelDrafter
from specsample.engine.options import RunOptions

NEW_TOKENS = 16
HOT = SamplingParams(temperature=0.8)


def collectives(run) -> int:  # type: ignore[no-untyped-def]
    """How many collective calls (all-reduce, all-gather, broadcast) `run()` makes."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    names = [e.name for e in prof.events()]
    return sum(name.startswith("c10d::") and name.endswith("_") for name in names)


def main(out: str) -> None:
    size = int(os.environ["WORLD_SIZE"])
    config = Config(backend="torch", target="smollm2", options={"tp": size, "check_replicas": True,
                                                                "timeout_s": 300})
    began = time.perf_counter()
    runner = specsample.load(config, draft="auto")
    print(f"rank {dist.get_rank()}: loaded at {time.perf_counter() - began:.0f} s", file=sys.stderr)
    prompts = list(BATCH_PROMPTS)
    greedy = runner.generate(prompts, max_new_tokens=NEW_TOKENS, params=SamplingParams(temperature=0.0))
    early = dataclasses.replace(runner, drafter=runner.backend.load_drafter("early-exit:10", runner.target))
    sampled = early.generate(prompts, max_new_tokens=NEW_TOKENS, params=HOT, seed=7)
    print(f"rank {dist.get_rank()}: generated at {time.perf_counter() - began:.0f} s", file=sys.stderr)

    target = runner.target
    ids, _ = runner.encode(BATCH_PROMPTS[0])
    forward = collectives(lambda: target.forward(ids, target.new_cache(1, int(ids.shape[1]))))
    # The module's own forward (DTensor hooks) against the fast path over the same shards.
    generic = HFModel(target.module, fast=False, parallel=runner.backend.parallel)
    fast_logits, _ = target.forward(ids, target.new_cache(1, int(ids.shape[1])))
    generic_logits, _ = generic.forward(ids, generic.new_cache(1, int(ids.shape[1])))
    # The second round of a lookup run: no draft forward, so every collective belongs to
    # the verify forward or to verification (the replica check, one debug all-gather, is off).
    runner.backend.check_replicas = False
    steps = dataclasses.replace(runner, drafter=PromptLookupDrafter()).iterate(
        "the cat sat on the mat the cat sat on the", max_new_tokens=8)
    next(steps)
    round_ = collectives(lambda: next(steps))
    runner.backend.check_replicas = True

    diverged = ""
    try:
        runner.generate(prompts, max_new_tokens=8, params=HOT, seed=dist.get_rank())
    except RuntimeError as error:
        diverged = str(error)
    if dist.get_rank() == 0:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump({"greedy": [greedy.new_tokens(i) for i in range(len(prompts))],
                       "sampled": [sampled.new_tokens(i) for i in range(len(prompts))],
                       "forward_collectives": forward, "round_collectives": round_,
                       "generic_vs_fast": float((generic_logits - fast_logits).abs().max()),
                       "layers": target.layers, "diverged": diverged,
                       "auto": runner.drafter_note()}, handle)
    dist.barrier()
    dist.destroy_process_group()


def tiny_model() -> LlamaForCausalLM:
    """A small random Llama with 4 query and 2 K/V heads (shards 2 ways), the same on every rank."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(config).eval()


def tiny_runs(backend: Any, target: HFModel) -> dict[str, list[list[int]]]:
    """Greedy (prompt lookup) and sampled (T = 0.8, a one-layer early-exit draft) generations."""
    ids = torch.tensor([[(7 * r + 3 * i) % 96 for i in range(6)] for r in range(8)])
    greedy = backend.generate(target, PromptLookupDrafter(), ids,
                              RunOptions(max_new_tokens=16, params=SamplingParams(temperature=0.0)))
    draft = ModelDrafter(target.derive(num_layers=1))
    sampled = backend.generate(target, draft, ids, RunOptions(max_new_tokens=16, params=HOT, seed=7, k=3))
    return {"greedy": greedy.sequences.tolist(), "sampled": sampled.sequences.tolist()}


def tiny(out: str) -> None:
    backend = create({"tp": int(os.environ["WORLD_SIZE"]), "check_replicas": True, "timeout_s": 120})
    runs = tiny_runs(backend, HFModel(tiny_model(), parallel=backend.parallel))
    if dist.get_rank() == 0:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(runs, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    (tiny if "--tiny" in sys.argv else main)(sys.argv[1])
    # Every rank has passed the last barrier and left the group; rank 0 has written the
    # results. Leave without the interpreter's finalisation, where gloo's worker threads can
    # still release tensors and abort the process ("terminate called without an active
    # exception", seen on a loaded 2-core machine), failing a run whose work is complete.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
