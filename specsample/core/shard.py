"""Work split by global index across `torch.distributed` ranks and gathered back in order.

A statistical check draws its samples in calls keyed by their index (call c uses seed
s + c), so the calls can run on any rank: rank r takes c = r, r + W, r + 2W, ... and rank 0
gathers every call's output in index order. The result is bit for bit what one process
gives at the same seed and n. Launch with `torchrun --nproc_per_node W ...`; the process
group is gloo (CPU). A rank that dies or hangs makes the others fail within `timeout_s`
with an error that says so, instead of waiting forever.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Callable, Mapping
from typing import Any

from specsample._array import check_int

__all__ = ["Shard", "agree", "join"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shard:
    """This process's place among `world` ranks (one process: rank 0 of 1).

    Attributes:
        rank: this process's rank, in [0, world).
        world: the number of ranks.
        timeout_s: how long a collective may wait for the other ranks.
    """

    rank: int = 0
    world: int = 1
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        check_int("world", self.world, 1)
        check_int("rank", self.rank, 0, self.world)

    def mine(self, count: int) -> range:
        """The indices in [0, count) this rank computes."""
        return range(self.rank, check_int("count", count, 0), self.world)

    def run(self, count: int, work: Callable[[int], Any]) -> list[Any] | None:
        """`work(i)` for every i in [0, count), spread over the ranks.

        Returns:
            On rank 0, the list [work(0), ..., work(count - 1)]; None on other ranks.
        """
        parts = {i: work(i) for i in self.mine(count)}
        if self.world == 1:
            return [parts[i] for i in range(count)]
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world if self.rank == 0 else []
        try:
            dist.gather_object(parts, gathered if self.rank == 0 else None, dst=0)
        except RuntimeError as error:
            raise RuntimeError(f"rank {self.rank} of {self.world}: gathering the results did not "
                               f"complete within {self.timeout_s:g} s (a rank died or hangs): "
                               f"{error}") from error
        if self.rank != 0:
            return None
        merged: dict[int, Any] = {}
        for part in gathered:
            merged.update(part)
        missing = sorted(set(range(count)) - set(merged))
        if missing:
            raise RuntimeError(f"rank 0: results {missing[:5]} never arrived from the other ranks")
        return [merged[i] for i in range(count)]

    def close(self) -> None:
        """Leave the process group (nothing to do for one process)."""
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def agree(value: float) -> float:
    """Rank 0's `value` on every rank of the default process group; `value` itself when no
    group has formed (one process)."""
    import sys

    dist = sys.modules.get("torch.distributed")  # a group exists only if torch.distributed was imported
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return float(value)
    box = [float(value)]
    dist.broadcast_object_list(box, src=0)
    return float(box[0])


def join(timeout_s: float = 600.0, *, environ: Mapping[str, str] | None = None,
         backend: str = "gloo") -> Shard:
    """Join the process group that `torchrun` describes (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT in the environment).

    Args:
        timeout_s: > 0; joining, and every later collective, fails after this long.
        backend: the process group's backend: "gloo" (CPU), "nccl" (CUDA), "hccl" (Gaudi).

    Raises:
        ValueError: the environment does not describe a launch, or `timeout_s` is not > 0.
        RuntimeError: the other ranks did not join within `timeout_s`.
    """
    env = dict(os.environ if environ is None else environ)
    if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s: expected a number of seconds > 0, got {timeout_s!r}")
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise ValueError(f"--distributed: expected a launch by torchrun (environment variables "
                         f"{', '.join(missing)} are not set); run `torchrun --nproc_per_node N -m "
                         f"specsample ...`")
    shard = Shard(rank=int(env["RANK"]), world=int(env["WORLD_SIZE"]), timeout_s=float(timeout_s))
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, rank=shard.rank, world_size=shard.world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        dist.barrier()
    except (RuntimeError, ValueError) as error:  # DistStoreError is a RuntimeError
        raise RuntimeError(f"rank {shard.rank} of {shard.world}: the process group did not form "
                           f"within {timeout_s:g} s (a rank died or hangs): {error}") from error
    return shard
