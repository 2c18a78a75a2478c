"""Which kernel the fast path's small forwards use: the choice rule, its setting, and that it
reaches every decoder linear of a target (and of its head) while the logits stay the same up
to float32 rounding."""

from __future__ import annotations

import pytest
import torch
from specsample_backends.torch import HFModel
from specsample_backends.torch._fast import SMALL_ROWS, DenseLinear
from specsample_backends.torch.head import DraftHead, HeadModel
from specsample_backends.torch.kernels import SMALL_ROWS_ENV, faster_plain_rows, small_rows_setting
from transformers import LlamaConfig, LlamaForCausalLM

packs = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                           reason="needs oneDNN (CPU float32 packing)")


def _llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def _decoder_linears(model: HFModel) -> list[DenseLinear]:
    assert model.stack is not None
    names = ("q", "k", "v", "o", "gate", "up", "down")
    return [getattr(layer, n) for layer in model.stack.layers for n in names]


def test_a_row_count_reads_the_plain_weight_only_where_it_measured_faster() -> None:
    times = {(1, "plain"): [3.0, 1.0, 2.0], (1, "packed"): [2.5, 2.5, 2.5],  # medians 2.0 < 2.5
             (2, "plain"): [4.0, 4.0, 4.0], (2, "packed"): [1.0, 9.0, 2.0],  # 4.0 > 2.0
             (3, "plain"): [2.0, 2.0, 2.0], (3, "packed"): [2.0, 2.0, 2.0]}  # a tie: packed
    assert faster_plain_rows(times) == frozenset({1})
    with pytest.raises(ValueError, match="both kernels at 2 rows"):
        faster_plain_rows({(2, "plain"): [1.0]})


def test_the_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SMALL_ROWS_ENV, raising=False)
    assert small_rows_setting() == "auto"
    monkeypatch.setenv(SMALL_ROWS_ENV, " Packed ")
    assert small_rows_setting() == "packed"
    monkeypatch.setenv(SMALL_ROWS_ENV, "fastest")
    wanted = f"{SMALL_ROWS_ENV}: expected one of auto, packed, plain, got 'fastest'"
    with pytest.raises(ValueError, match=wanted):
        small_rows_setting()
    with pytest.raises(ValueError, match=SMALL_ROWS_ENV):
        HFModel(_llama())  # a bad setting fails at load, not in a later forward


@packs
@pytest.mark.parametrize("setting", ["packed", "plain", "auto"])
def test_every_decoder_linear_and_the_heads_follow_the_choice(monkeypatch: pytest.MonkeyPatch,
                                                              setting: str) -> None:
    monkeypatch.setenv(SMALL_ROWS_ENV, setting)
    model = HFModel(_llama(seed=1))
    rows, medians = model.small_rows
    if setting == "auto":  # measured: both kernels at each small row count
        assert set(medians) == {f"{k}@{r}" for r in SMALL_ROWS for k in ("plain", "packed")}
        assert all(v > 0 for v in medians.values())
    else:
        assert rows == (frozenset(SMALL_ROWS) if setting == "plain" else frozenset()) and medians == {}
    assert all(linear.plain_rows == rows for linear in _decoder_linears(model))
    assert model.stack is not None and model.stack.head.plain_rows == frozenset()  # the head: packed always
    head = HeadModel(DraftHead(model))
    assert all(getattr(head.stack.layers[0], n).plain_rows == rows for n in ("q", "o", "down"))


@packs
def test_both_kernels_give_the_same_logits_up_to_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _llama(seed=2)
    ids = torch.tensor([[3, 9, 1, 40, 7, 22]])
    out = {}
    for setting in ("packed", "plain"):
        monkeypatch.setenv(SMALL_ROWS_ENV, setting)
        model = HFModel(module)
        cache = model.new_cache(1, 8)
        _, cache = model.forward(ids[:, :4], cache)
        out[setting] = model.forward(ids[:, 4:5], cache)[0]  # one row: the kernels differ
    torch.testing.assert_close(out["packed"], out["plain"], rtol=1e-5, atol=1e-5)
