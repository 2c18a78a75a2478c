"""A tensor-parallel target: SmolLM2 sharded over 3 gloo ranks equals the one-device target.

SmolLM2-135M has 9 query heads and 3 K/V heads, so 3 is the smallest size that shards it
by head (tp = 2 is refused before loading, a test below). `tests/tp_worker.py` runs under
`torchrun --nproc_per_node 3` with the per-round replica check on; this process runs the
same calls on one device and compares. Float sums in another order may separate two
forwards only at a near-tie: a greedy difference must be one (the one-device target's
top-2 logit gap below `TIE_GAP`), and sampled rows may differ in at most one row of 8,
the allowance of the repository's other cross-numerics tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from specsample_backends.torch import HFModel, create, loading
from specsample_backends.torch.parallel import check_divides, start

import specsample
from specsample.api.config import Config
from specsample.bench import TIE_GAP
from specsample.bench.prompts import BATCH_PROMPTS
from specsample.core.params import SamplingParams

WORKER = Path(__file__).with_name("tp_worker.py")
SIZE = 3


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("tp") / "out.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(SIZE),
               "--master_port", str(_free_port()), str(WORKER), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, object] = json.loads(out.read_text())
    return result


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


@pytest.mark.slow
def test_sharded_greedy_equals_one_device_except_near_ties(sharded: dict[str, object]) -> None:
    runner = specsample.load(Config(backend="torch", target="smollm2"), draft="lookup")
    plain = runner.generate_plain(list(BATCH_PROMPTS), max_new_tokens=16,
                                  params=SamplingParams(temperature=0.0))
    ties = 0
    for row, theirs in enumerate(sharded["greedy"]):  # type: ignore[arg-type]
        ours = plain.new_tokens(row)
        at = _first_difference(ours, theirs)
        if at is None:
            continue
        ids, _ = runner.encode(BATCH_PROMPTS[row])
        prefix = torch.cat([ids[0], torch.tensor(ours[:at])])[None, :]
        logits, _ = runner.target.forward(prefix, runner.target.new_cache(1, prefix.shape[1]))
        gap = abs(float(logits[0, -1, ours[at]] - logits[0, -1, theirs[at]]))
        assert gap < TIE_GAP, (row, at, gap)
        ties += 1
    assert ties <= 1


@pytest.mark.slow
def test_sharded_sampling_equals_one_device_at_the_same_seed(sharded: dict[str, object]) -> None:
    runner = specsample.load(Config(backend="torch", target="smollm2", k=4), draft="early-exit:10")
    ours = runner.generate(list(BATCH_PROMPTS), max_new_tokens=16,
                           params=SamplingParams(temperature=0.8), seed=7)
    differ = [row for row, theirs in enumerate(sharded["sampled"])  # type: ignore[arg-type]
              if ours.new_tokens(row) != theirs]
    assert len(differ) <= 1, differ


@pytest.mark.slow
def test_two_collectives_per_layer_and_none_in_verification(sharded: dict[str, object]) -> None:
    layers = sharded["layers"]
    assert sharded["forward_collectives"] == 2 * layers  # type: ignore[operator]
    # A lookup round is one verify forward and verification: the forward's all-reduces only.
    assert sharded["round_collectives"] == 2 * layers  # type: ignore[operator]
    assert sharded["generic_vs_fast"] < 1e-3  # type: ignore[operator]  # logits ~ 10-30 in size
    # `auto` on a sharded target leaves the draft head out, and says why.
    assert "left out: head (target: a draft head drafts for a target on one device" in \
        sharded["auto"]  # type: ignore[operator]


@pytest.mark.slow
def test_the_replica_check_names_the_first_diverging_rank_and_round(sharded: dict[str, object]) -> None:
    # Negative control: rank r sampled with seed r, so ranks 1 and 2 commit other tokens.
    assert "replicas diverged in round 0: rank 1 committed other tokens than rank 0" in \
        sharded["diverged"]  # type: ignore[operator]


def test_two_ranks_shard_a_model_whose_heads_split_in_two(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The 2-process case on a model tp = 2 divides: greedy and sampled generation on 8 rows
    # equal one process's (the same float near-tie allowance: at most one row differs).
    sys.path.insert(0, str(WORKER.parent))
    from tp_worker import tiny_model, tiny_runs

    out = tmp_path / "tiny.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(_free_port()), str(WORKER), str(out), "--tiny"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    theirs = json.loads(out.read_text())
    ours = tiny_runs(create({}), HFModel(tiny_model()))
    for name in ("greedy", "sampled"):
        differ = [r for r, (a, b) in enumerate(zip(ours[name], theirs[name], strict=True)) if a != b]
        assert len(differ) <= 1, (name, differ)


def test_a_size_that_does_not_divide_the_heads_is_refused_before_loading() -> None:
    config = loading._config(*loading._resolve("smollm2"))
    with pytest.raises(ValueError, match=r"got tp = 2, which does not divide .*num_attention_heads.*"
                                         r"sizes that do: \[3\]"):
        check_divides(config, 2)
    check_divides(config, 3)


@pytest.mark.parametrize(("options", "message"), [
    ({"tp": 0}, "tp: expected an int >= 1, got 0"),
    ({"tp": True}, "tp: expected an int >= 1, got True"),
    ({"check_replicas": True}, "apply to tp > 1 only"),
    ({"tp": 2, "check_replicas": "yes"}, "check_replicas: expected a bool"),
    ({"tp": 2, "timeout_s": 0}, "timeout_s: expected a number of seconds > 0"),
])
def test_bad_parallel_options_are_clear_errors(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create(options)


def test_a_launch_is_checked_before_joining() -> None:
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="expected a launch by torchrun"):
        start(2, cpu, environ={})
    with pytest.raises(ValueError, match=r"WORLD_SIZE = 3\), got tp = 2"):
        start(2, cpu, environ={"WORLD_SIZE": "3"})
    with pytest.raises(ValueError, match="process_group: expected one of"):
        start(2, cpu, process_group="mpi", environ={"WORLD_SIZE": "2"})
    # Gaudi's documented rule for DTensor, checked before anything touches a device.
    with pytest.raises(ValueError, match="expected PT_HPU_LAZY_MODE=0 in the environment, got '1'"):
        start(2, torch.device("hpu"), environ={"WORLD_SIZE": "2", "PT_HPU_LAZY_MODE": "1"})
