"""Sharded checks: calls split by index across torchrun ranks give one process's samples.

`specsample check --distributed` runs under `torchrun` with 2 gloo processes on the reference
backend (the engine sampler, rows in calls of 100, and the tree sampler, rows split in two
halves); its samples' digest and every test line
must equal a single process's at the same seed and n. A rank that never joins makes the
others fail within the stated timeout.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from specsample.core.shard import Shard, join

# --samples is --n: torchrun's own parser reads "--n" as an ambiguous abbreviation of its options.
CHECK = ["-m", "specsample", "check", "--backend", "reference", "--sampler", "engine", "--samples", "600",
         "--rows", "100", "--settings", "t1.0", "--k", "2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lines(out: str) -> list[str]:
    """The test result and digest lines, without the elapsed seconds."""
    keep = [line for line in out.splitlines()
            if line.startswith(("  first", "  samples digest", "check: PASS", "check: FAIL"))]
    return [re.sub(r"\(\d+ s\)", "", line) for line in keep]


def _run(args: list[str], tmp_path, **env: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run([sys.executable, *args, "--plot", str(tmp_path / "check.png")], text=True,
                          capture_output=True, timeout=600, env={**os.environ, **env}, check=False)


@pytest.mark.parametrize("sampler", ["engine", "tree"])
def test_two_ranks_give_one_process_samples_bit_for_bit(tmp_path, sampler: str) -> None:  # type: ignore[no-untyped-def]
    check = [*CHECK[:CHECK.index("--sampler") + 1], sampler, *CHECK[CHECK.index("--sampler") + 2:]]
    if sampler == "tree":  # it has no calls of rows: it splits the rows themselves
        at = check.index("--rows")
        del check[at:at + 2]
    alone = _run(check, tmp_path)
    assert alone.returncode == 0, alone.stderr
    torchrun = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                str(_free_port()), *check, "--distributed", "--timeout", "120"]
    ranks = _run(torchrun, tmp_path, OMP_NUM_THREADS="1")
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    mine, theirs = _lines(alone.stdout), _lines(ranks.stdout)
    assert len(mine) == 6 and mine[-1] == "check: PASS", alone.stdout  # 4 tests, the digests, the verdict
    assert theirs == mine, (ranks.stdout, alone.stdout)
    assert "2 ranks" in ranks.stdout and ranks.stdout.count("samples digest") == 1  # rank 0 reports


def test_a_rank_that_never_joins_fails_the_others_within_the_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    began = time.monotonic()
    lonely = _run([*CHECK, "--distributed", "--timeout", "5"], tmp_path, **env)
    assert lonely.returncode != 0
    assert "rank 0 of 2: the process group did not form within 5 s (a rank died or hangs)" in lonely.stderr
    assert time.monotonic() - began < 120


def test_one_process_shard_runs_everything_in_order() -> None:
    shard = Shard()
    assert list(shard.mine(5)) == [0, 1, 2, 3, 4]
    assert shard.run(4, lambda i: np.full(2, i)) is not None
    assert [int(a[0]) for a in shard.run(4, lambda i: np.full(2, i)) or []] == [0, 1, 2, 3]
    assert list(Shard(rank=1, world=3).mine(8)) == [1, 4, 7]


def test_bad_shards_and_launches_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="rank: expected"):
        Shard(rank=2, world=2)
    with pytest.raises(ValueError, match="world: expected"):
        Shard(world=0)
    with pytest.raises(ValueError, match="--distributed: expected a launch by torchrun"):
        join(environ={})
    with pytest.raises(ValueError, match="timeout_s: expected a number of seconds > 0, got 0"):
        join(0, environ={})


def test_killing_a_rank_mid_run_ends_the_other_with_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two ranks join; once rank 0 has started sampling, rank 1 is killed: rank 0 fails at the
    gather with an error naming the cause, within the timeout, instead of waiting forever."""
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "OMP_NUM_THREADS": "1"}
    slow = [a if a != "600" else "400000" for a in CHECK]  # long enough to be killed mid-run
    command = [sys.executable, *slow, "--distributed", "--timeout", "10", "--plot", str(tmp_path / "c.png")]
    ranks = [subprocess.Popen(command, env={**env, "RANK": str(r)}, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for r in (0, 1)]
    try:
        assert ranks[0].stdout is not None
        header = ranks[0].stdout.readline()  # printed once the group has formed, before sampling
        assert header.startswith("check: "), header
        time.sleep(1.0)
        ranks[1].kill()
        began = time.monotonic()
        _, err = ranks[0].communicate(timeout=120)
        assert ranks[0].returncode != 0
        assert "rank 0 of 2: gathering the results did not complete within 10 s (a rank died or hangs)" \
            in err, err[-2000:]
        assert time.monotonic() - began < 60
    finally:
        for process in ranks:
            process.kill()
            process.wait()
