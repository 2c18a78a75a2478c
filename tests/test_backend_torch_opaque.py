"""`specsample::linear`: our linears as one opaque op, in eager mode and inside compiled graphs."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from specsample_backends.torch import opaque
from specsample_backends.torch._fast import DenseLinear
from specsample_backends.torch.quantized import Int8Linear
from torch._dynamo.utils import counters


def _dense(n: int = 12, d: int = 8, seed: int = 0, **kw: bool) -> DenseLinear:
    gen = torch.Generator().manual_seed(seed)
    return DenseLinear(torch.randn(n, d, generator=gen), torch.randn(n, generator=gen), **kw)


def test_call_is_the_linear_itself() -> None:
    for linear in (_dense(), _dense(pack=False), Int8Linear(_dense(seed=1))):
        key = opaque.key_of(linear)
        assert opaque.key_of(linear) is key  # one key per linear
        for rows in (1, 3):
            x = torch.randn(1, rows, 8)
            assert torch.equal(opaque.call(x, key, 12), linear(x))


def test_keys_are_distinct_and_die_with_their_linear() -> None:
    a, b = _dense(seed=2), _dense(seed=3)
    key_a, key_b = opaque.key_of(a), opaque.key_of(b)
    assert int(key_a) != int(key_b)
    x = torch.randn(1, 2, 8)
    del a
    gc.collect()
    with pytest.raises(RuntimeError, match="no live linear"):
        opaque.call(x, key_a, 12)
    assert torch.equal(opaque.call(x, key_b, 12), b(x))


def test_bad_arguments_are_named() -> None:
    linear = _dense()
    key = opaque.key_of(linear)
    x = torch.randn(1, 1, 8)
    with pytest.raises(TypeError, match="key: expected an int64"):
        opaque.call(x, key.double(), 12)
    with pytest.raises(TypeError, match="key: expected an int64"):
        opaque.call(x, key.repeat(2), 12)
    with pytest.raises(ValueError, match="out_features: expected an int >= 1"):
        opaque.call(x, key, 0)
    with pytest.raises(RuntimeError, match="out_features: the graph expects 5"):
        opaque.call(x, key, 5)
    with pytest.raises(TypeError, match="linear: expected a callable with an int out_features"):
        opaque.key_of(F.relu)  # type: ignore[arg-type]


def test_one_graph_serves_every_linear_of_a_shape() -> None:
    """Keys are tensors, not constants: switching linears compiles nothing new."""
    def two(x: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        return opaque.call(torch.relu(opaque.call(x, first, 12)), second, 8)

    compiled = torch.compile(two, backend="aot_eager", dynamic=False, fullgraph=True)
    ups = [_dense(12, 8, seed=s) for s in range(3)]
    downs = [_dense(8, 12, seed=10 + s) for s in range(3)]
    x = torch.randn(1, 3, 8)
    counters.clear()
    for up, down in zip(ups, downs, strict=True):
        got = compiled(x, opaque.key_of(up), opaque.key_of(down))
        assert torch.equal(got, down(torch.relu(up(x))))
    assert counters["stats"]["unique_graphs"] == 1


def test_packed_one_row_matches_the_plain_weight() -> None:
    """`one_row=True` (the output head) uses the packed weight for a single row: same numbers
    up to float32 rounding."""
    plain, packed = _dense(300, 64, seed=4, pack=False), _dense(300, 64, seed=4, one_row=True)
    x = torch.randn(1, 1, 64)
    torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed(x), F.linear(x, plain.weight, plain.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (CPU float32 packing)")
def test_decoder_linears_read_the_plain_weight_below_four_rows() -> None:
    """A decoder linear not yet measured (`kernels.choose_small_rows`) reads its plain weight
    for B*T <= 3 rows (decode, a verify of one or two drafts) and its packed copy from 4 rows
    on, in batch and in width alike."""
    dense = _dense(300, 64, seed=5)
    assert dense.packed is not None
    for batch, width in ((1, 1), (1, 2), (1, 3), (3, 1), (1, 4), (2, 2), (1, 9), (8, 1)):
        x = torch.randn(batch, width, 64)
        packed = torch.ops.mkldnn._linear_pointwise(x, dense.packed, dense.bias, "none", [], "")
        expected = F.linear(x, dense.weight, dense.bias) if batch * width <= 3 else packed
        assert torch.equal(dense(x), expected), (batch, width)
