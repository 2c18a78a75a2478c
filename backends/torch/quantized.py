"""A quantized self-draft: the target's linears as int8 (dynamic activations, fbgemm)."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import Tensor, nn

from ._fast import DenseLinear
from .model import HFModel

__all__ = ["Int8Linear", "int8_draft", "quantize"]


def quantize(module: nn.Module) -> nn.Module:
    """A copy of `module` with its `nn.Linear`s as dynamic int8 linears (fbgemm, CPU, float32)."""
    # torch.ao.quantization is deprecated in favour of torchao but still ships
    # the fbgemm dynamic int8 GEMM, which is what makes the draft fast on CPU.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized: nn.Module = torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            module, {nn.Linear}, dtype=torch.qint8)  # (unannotated in torch)
        return quantized


class Int8Linear:
    """y ≈ x W^T + b with W int8 per tensor and x quantized on the fly (fbgemm)."""

    def __init__(self, dense: DenseLinear) -> None:
        out_features, in_features = dense.weight.shape
        self.out_features = int(out_features)
        linear = nn.Linear(in_features, out_features, bias=dense.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(dense.weight.float())
            if dense.bias is not None:
                linear.bias.copy_(dense.bias.float())
        quantized = quantize(nn.Sequential(linear))
        assert isinstance(quantized, nn.Sequential)  # quantize_dynamic keeps the container's type
        self.module: nn.Module = quantized[0]

    def __call__(self, x: Tensor) -> Tensor:
        """x [B, T, D] -> [B, T, N] in x's dtype."""
        out: Tensor = self.module(x.float())
        return out.to(x.dtype)


def int8_draft(target: HFModel) -> HFModel:
    """The target with every linear (and the head) in int8; embeddings and norms shared.

    Llama models reuse the fast path with int8 linears; other models get a
    quantized copy of the module. CPU only (the fbgemm/x86 int8 kernels).
    """
    if target.device.type != "cpu":
        raise ValueError(f"target: the int8 draft runs on CPU, got a model on {target.device}")
    if target.stack is not None:
        return target.derive(linear=Int8Linear)
    return HFModel(quantize(copy.deepcopy(target.module).float()), fast=False,
                   vocab_size=target.vocab_size)
