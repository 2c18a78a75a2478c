"""A tensor-parallel target: its weights sharded over a DeviceMesh by torch.distributed.

The plan is Megatron's, applied by `torch.distributed.tensor.parallel.parallelize_module`:
q, k, v, gate and up are sharded column-wise (each rank owns whole attention heads, its
K/V heads' cache, and a slice of the MLP), o and down row-wise (each rank's partial sum,
all-reduced). Embeddings, norms and the output head stay replicated, so every rank holds
the full logits: 2 all-reduces per layer per forward, and none in verification, because
the uniforms are a pure function of (seed, stream, step, row) and every rank computes the
same verdict from the same logits. `TensorParallel.checked` proves that at run time: an
all-gather of a digest of the committed tokens after every round.

Launch with `torchrun --nproc_per_node N`; the process group is gloo on CPU, nccl on
CUDA, hccl on Gaudi. A rank that dies or hangs makes the others fail after `timeout_s`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from specsample._array import check_int
from specsample.core.shard import join
from specsample.engine.runs import Step

__all__ = ["PROCESS_GROUPS", "TensorParallel", "check_divides", "local", "plan", "start"]

PROCESS_GROUPS = {"cpu": "gloo", "cuda": "nccl", "hpu": "hccl"}  # default per device type
_COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
_ROW = ("self_attn.o_proj", "mlp.down_proj")


def check_divides(config: Any, tp: int) -> None:
    """Raise ValueError unless `tp` divides the query heads, the K/V heads and the MLP width.

    Args:
        config: a transformers decoder config (num_attention_heads, num_key_value_heads,
            intermediate_size).
        tp: the tensor-parallel size.
    """
    check_int("tp", tp, 1)
    heads = int(config.num_attention_heads)
    sizes = {"num_attention_heads": heads,
             "num_key_value_heads": int(getattr(config, "num_key_value_heads", None) or heads),
             "intermediate_size": int(config.intermediate_size)}
    bad = {name: size for name, size in sizes.items() if size % tp}
    if bad:
        fits = [n for n in range(2, heads + 1) if all(size % n == 0 for size in sizes.values())]
        raise ValueError(f"tp: expected a size that divides the model's {sizes}, got tp = {tp}, "
                         f"which does not divide {bad}; sizes that do: {fits or 'none above 1'}")


def plan(config: Any) -> dict[str, Any]:
    """The parallelize_module plan of a Llama-like decoder: fully qualified name -> style."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles: dict[str, Any] = {}
    for i in range(int(config.num_hidden_layers)):
        styles.update({f"model.layers.{i}.{name}": ColwiseParallel() for name in _COLUMN})
        styles.update({f"model.layers.{i}.{name}": RowwiseParallel() for name in _ROW})
    return styles


def local(weight: Tensor) -> Tensor:
    """This rank's shard of a weight (the weight itself when it is not sharded)."""
    from torch.distributed.tensor import DTensor

    shard: Tensor = weight.to_local() if isinstance(weight, DTensor) else weight
    return shard


@dataclasses.dataclass(frozen=True, eq=False)
class TensorParallel:
    """A 1-D DeviceMesh over the ranks that share one target (see `start`).

    Attributes:
        mesh: the DeviceMesh.
        timeout_s: how long a collective waits for the other ranks.
    """

    mesh: Any
    timeout_s: float = 600.0

    @property
    def size(self) -> int:
        """The number of ranks the target is sharded over."""
        return int(self.mesh.size())

    @property
    def rank(self) -> int:
        """This process's rank in the mesh."""
        return int(self.mesh.get_local_rank())

    def shard(self, model: nn.Module) -> nn.Module:
        """Shard `model`'s projections in place (a no-op when they already are DTensors)."""
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.parallel import parallelize_module

        config = model.config
        check_divides(config, self.size)
        layers: Any = model.get_submodule("model.layers")
        if isinstance(layers[0].self_attn.q_proj.weight, DTensor):
            return model
        parallelize_module(model, self.mesh, plan(config))
        return model

    def reduce(self, x: Tensor) -> Tensor:
        """Sum `x` over the ranks, in place (a row-parallel linear's partial sums)."""
        import torch.distributed as dist

        dist.all_reduce(x, group=self.mesh.get_group())
        return x

    def checked(self, steps: Iterator[Step]) -> Iterator[Step]:
        """`steps`, each checked to commit the same tokens on every rank.

        Raises:
            RuntimeError: after the first round whose committed tokens differ, on every
                rank, naming the first rank that differs from rank 0 and the round.
        """
        import torch.distributed as dist

        for step in steps:
            mine = torch.tensor([_digest(step.state.tokens, step.state.lengths)], dtype=torch.int64,
                                device=self._device())
            every = [torch.zeros_like(mine) for _ in range(self.size)]
            dist.all_gather(every, mine, group=self.mesh.get_group())
            digests = [int(d.item()) for d in every]
            wrong = [r for r, d in enumerate(digests) if d != digests[0]]
            if wrong:
                raise RuntimeError(f"tensor-parallel replicas diverged in round {step.index}: rank "
                                   f"{wrong[0]} committed other tokens than rank 0 (token digests "
                                   f"per rank: {[f'{d & (2**64 - 1):016x}' for d in digests]})")
            yield step

    def _device(self) -> torch.device:
        kind = self.mesh.device_type
        if kind == "cpu":
            return torch.device("cpu")
        return torch.device(kind, torch.get_device_module(kind).current_device())


def _digest(tokens: Tensor, lengths: Tensor) -> int:
    """A 64-bit digest of each row's committed tokens (those before its length)."""
    rows = tokens.detach().cpu().tolist()
    ends = lengths.detach().cpu().tolist()
    h = hashlib.blake2b(digest_size=8)
    for row, end in zip(rows, ends, strict=True):
        h.update(repr(row[:end]).encode())
    return int.from_bytes(h.digest(), "little", signed=True)


def start(tp: int, device: torch.device, *, process_group: str | None = None, timeout_s: float = 600.0,
          environ: Mapping[str, str] | None = None) -> TensorParallel:
    """Join the `torchrun` launch as one of `tp` ranks and build the mesh.

    Args:
        tp: the tensor-parallel size; must equal torchrun's WORLD_SIZE.
        device: the device type of the mesh (cpu, cuda, hpu).
        process_group: "gloo", "nccl" or "hccl" (default: `PROCESS_GROUPS[device.type]`).
        timeout_s: joining and every collective fail after this long.

    Raises:
        ValueError: not launched by torchrun, WORLD_SIZE != tp, an unknown process group,
            or Gaudi in lazy mode (DTensor needs PT_HPU_LAZY_MODE=0).
        RuntimeError: the other ranks did not join within `timeout_s`.
    """
    import os

    from torch.distributed.device_mesh import init_device_mesh

    check_int("tp", tp, 2)
    env = dict(os.environ if environ is None else environ)
    chosen = process_group or PROCESS_GROUPS.get(device.type, "")
    if chosen not in PROCESS_GROUPS.values():
        raise ValueError(f"process_group: expected one of {sorted(set(PROCESS_GROUPS.values()))} "
                         f"(default for {device.type!r}: {PROCESS_GROUPS.get(device.type)}), got "
                         f"{process_group!r}")
    if device.type == "hpu" and env.get("PT_HPU_LAZY_MODE") != "0":
        # Intel's Gaudi docs ("Using DistributedTensor with Intel Gaudi"): DTensor runs in
        # eager mode or under torch.compile only, not in lazy mode.
        raise ValueError(f"tp: DTensor on Gaudi needs eager mode: expected PT_HPU_LAZY_MODE=0 in "
                         f"the environment, got {env.get('PT_HPU_LAZY_MODE')!r}")
    world = env.get("WORLD_SIZE")
    if world is not None and world != str(tp):
        raise ValueError(f"tp: expected the number of processes torchrun started (WORLD_SIZE = "
                         f"{world}), got tp = {tp}")
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != tp:
            raise ValueError(f"tp: expected the process group's size {dist.get_world_size()}, got {tp}")
    else:
        join(timeout_s, environ=env, backend=chosen)
    return TensorParallel(mesh=init_device_mesh(device.type, (tp,)), timeout_s=timeout_s)
