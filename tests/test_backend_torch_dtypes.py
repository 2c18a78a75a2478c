"""One dtype table for every torch-based backend, and the int8 quantization the draft and its peer share."""

from __future__ import annotations

import pytest
import torch
from specsample_backends.static import backend as static_backend
from specsample_backends.torch import create
from specsample_backends.torch.dtypes import DTYPES, dtype_option
from specsample_backends.torch.quantized import quantize

from specsample import bench


def test_one_table_names_every_dtype() -> None:
    assert static_backend.DTYPES is DTYPES  # the static engine (and cuda, gaudi) read the same table
    assert {name: dtype_option(name) for name in DTYPES} == {
        "float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
    assert create({"dtype": "bfloat16"}).dtype == torch.bfloat16
    assert static_backend.create_cpu({"dtype": "float64"}).dtype == torch.float64
    for bad in ("int8", 32, None):
        with pytest.raises(ValueError, match=r"dtype: expected one of \['float32', 'bfloat16', 'float64'\]"):
            dtype_option(bad)


def test_quantize_makes_int8_linears_and_leaves_the_original() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    quantized = quantize(module)
    assert isinstance(module[0], torch.nn.Linear) and type(quantized[0]) is not torch.nn.Linear
    assert "quantized" in type(quantized[0]).__module__
    x = torch.randn(3, 8)
    assert torch.allclose(quantized(x), module(x), atol=0.05)  # int8 weights: close, not equal


def test_int8_assistant_is_a_quantized_copy() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(8, 4)).to(torch.bfloat16)
    assistant = bench.int8_assistant(module)
    assert module[0].weight.dtype == torch.bfloat16  # the target is untouched
    assert "quantized" in type(assistant[0]).__module__
