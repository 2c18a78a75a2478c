"""A quantized self-draft: the target's linears as int8 (dynamic activations, fbgemm)."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import Tensor, nn

from ._fast import DenseLinear
from .model import HFModel

__all__ = ["Int8Linear", "int8_draft", "quantize", "scale_rows"]

# Two extra input columns hold +1 and -1 in every row (their weights are zero).
_PAD = 2


def quantize(module: nn.Module) -> nn.Module:
    """A copy of `module` with its `nn.Linear`s as dynamic int8 linears (fbgemm, CPU, float32)."""
    # torch.ao.quantization is deprecated in favour of torchao but still ships
    # the fbgemm dynamic int8 GEMM, which is what makes the draft fast on CPU.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized: nn.Module = torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            module, {nn.Linear}, dtype=torch.qint8)  # (unannotated in torch)
        return quantized


_SIGNS: dict[torch.dtype, Tensor] = {}


def scale_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., D] -> (x / m padded with (+1, -1) [..., D + 2], m [..., 1]) where m = max |row|.

    fbgemm's dynamic GEMM quantizes its whole input with one scale taken from the
    input's range, which would make a row's draft depend on its batch-mates. Every
    prepared row spans exactly [-1, 1], so that range, hence the scale, is the same
    for any batch, and a row's int8 input and integer products are its own.
    """
    m = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True).clamp_min_(1e-30)
    signs = _SIGNS.get(x.dtype)
    if signs is None:
        signs = _SIGNS[x.dtype] = torch.tensor([1.0, -1.0], dtype=x.dtype)
    return torch.cat((x / m, signs.expand(*x.shape[:-1], _PAD)), dim=-1), m


class Int8Linear:
    """y ≈ x W^T + b with W int8 per tensor and each row of x int8 with its own scale (fbgemm).

    A row's output depends on that row alone (see `scale_rows`), bit for bit.
    """

    def __init__(self, dense: DenseLinear) -> None:
        if not isinstance(dense, DenseLinear):
            raise TypeError(f"dense: expected a DenseLinear, got {type(dense).__name__}")
        out_features, in_features = dense.weight.shape
        self.out_features = int(out_features)
        linear = nn.Linear(in_features + _PAD, out_features, bias=False)
        with torch.no_grad():
            linear.weight.zero_()
            linear.weight[:, :in_features].copy_(dense.weight.float())
        self.bias = None if dense.bias is None else dense.bias.detach().float()
        quantized = quantize(nn.Sequential(linear))
        assert isinstance(quantized, nn.Sequential)  # quantize_dynamic keeps the container's type
        self.module: nn.Module = quantized[0]

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor, torch.dtype]:
        """x [B, T, D] -> its rows scaled and padded (`scale_rows`), with x's dtype."""
        return (*scale_rows(x.float()), x.dtype)

    def apply(self, prepared: tuple[Tensor, Tensor, torch.dtype]) -> Tensor:
        """The output [B, T, N] in the input's dtype for a `prepare`d input."""
        scaled, m, dtype = prepared
        out: Tensor = self.module(scaled)
        out = out.mul_(m) if self.bias is None else torch.addcmul(self.bias, out, m)
        return out.to(dtype)

    def __call__(self, x: Tensor) -> Tensor:
        """x [B, T, D] -> [B, T, N] in x's dtype."""
        return self.apply(self.prepare(x))


def int8_draft(target: HFModel) -> HFModel:
    """The target with every linear (and the head) in int8; embeddings and norms shared.

    Llama models reuse the fast path with int8 linears, each row quantized on its own
    (a row's draft does not depend on its batch-mates); other models get a quantized
    copy of the module (fbgemm's per-tensor activation scale). CPU only (the
    fbgemm/x86 int8 kernels).
    """
    if target.device.type != "cpu":
        raise ValueError(f"target: the int8 draft runs on CPU, got a model on {target.device}")
    if target.stack is not None:
        return target.derive(linear=Int8Linear)
    return HFModel(quantize(copy.deepcopy(target.module).float()), fast=False,
                   vocab_size=target.vocab_size)
