"""warp: temperature, top-k, top-p, min-p; greedy; backends agree; bad logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specsample import SamplingParams, warp


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_temperature_only_is_a_tempered_softmax():
    logits = np.random.default_rng(0).normal(size=(3, 7))
    out = warp(logits, SamplingParams(temperature=0.5))
    assert np.allclose(out, _softmax(logits / 0.5), atol=1e-15)


def test_greedy_is_one_hot_at_the_lowest_argmax():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    out = warp(logits, SamplingParams(temperature=0))
    assert np.array_equal(out, np.array([[0, 1, 0, 0], [1, 0, 0, 0]], dtype=np.float64))


def test_top_k_keeps_k_and_zeroes_the_rest_exactly():
    logits = np.array([[0.1, 2.0, 1.0, -1.0, 3.0]])
    out = warp(logits, SamplingParams(top_k=2))
    assert np.count_nonzero(out) == 2 and out[0, 2] == 0.0 and out[0, 0] == 0.0
    assert np.allclose(out[0, [1, 4]], _softmax(logits[0, [1, 4]]))


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([[0.5, 0.3, 0.15, 0.05]])
    out = warp(np.log(probs), SamplingParams(top_p=0.79))
    assert np.array_equal(out > 0, np.array([[True, True, False, False]]))
    out = warp(np.log(probs), SamplingParams(top_p=0.85))
    assert np.array_equal(out > 0, np.array([[True, True, True, False]]))
    assert np.allclose(out.sum(-1), 1.0)


def test_min_p_scales_with_the_top_probability():
    probs = np.array([[0.6, 0.3, 0.07, 0.03]])
    out = warp(np.log(probs), SamplingParams(min_p=0.1))
    assert np.array_equal(out > 0, np.array([[True, True, True, False]]))


def test_the_order_is_temperature_top_k_top_p_min_p():
    logits = np.random.default_rng(1).normal(size=(5, 50))
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05)
    out = warp(logits, params)
    step = _softmax(logits / 0.7)
    kth = np.sort(step, -1)[:, -20][:, None]
    step = np.where(step >= kth, step, 0)
    step /= step.sum(-1, keepdims=True)
    ranked = -np.sort(-step, -1)
    keep = ((np.cumsum(ranked, -1) - ranked) < 0.9).sum(-1)
    threshold = ranked[np.arange(5), keep - 1][:, None]
    step = np.where(step >= threshold, step, 0)
    step /= step.sum(-1, keepdims=True)
    step = np.where(step >= 0.05 * step.max(-1, keepdims=True), step, 0)
    step /= step.sum(-1, keepdims=True)
    assert np.allclose(out, step, atol=1e-12)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0),
                                    SamplingParams(temperature=0.8, top_k=5, top_p=0.7, min_p=0.02)])
def test_numpy_and_torch_agree(params):
    logits = np.random.default_rng(2).normal(size=(4, 3, 40))
    ref = warp(logits, params)
    out = warp(torch.from_numpy(logits), params)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    assert np.allclose(ref, out.numpy(), atol=1e-14)
    assert np.array_equal(ref == 0, out.numpy() == 0)


def test_minus_inf_marks_a_masked_token():
    out = warp(np.array([[0.0, -np.inf, 1.0]]), SamplingParams())
    assert out[0, 1] == 0.0 and np.isclose(out.sum(), 1.0)


@pytest.mark.parametrize(("logits", "error", "match"), [
    (np.array([[0.0, np.nan]]), ValueError, "logits: expected finite logits"),
    (np.array([[0.0, np.inf]]), ValueError, r"logits: .*1 \+inf"),
    (np.array([[-np.inf, -np.inf]]), ValueError, "logits: expected at least one finite logit"),
    (np.array([[1, 2]]), TypeError, "logits: expected a real floating-point array"),
    (np.zeros((2, 0)), ValueError, "V >= 1"),
])
def test_bad_logits(logits, error, match):
    with pytest.raises(error, match=match):
        warp(logits, SamplingParams())


def test_params_must_be_sampling_params():
    with pytest.raises(TypeError, match="params: expected SamplingParams, got dict"):
        warp(np.zeros((1, 3)), {"temperature": 1.0})  # type: ignore[arg-type]
