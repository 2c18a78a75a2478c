"""The cuda backend: a clear error without CUDA; on a GPU, CUDA-graph parity with eager."""

from __future__ import annotations

import pytest
import torch

import specsample
from specsample import Config
from specsample.api.registry import get_backend
from specsample.core.params import SamplingParams
from specsample.engine.generate import generate
from specsample.engine.options import RunOptions

CUDA = torch.cuda.is_available()


@pytest.mark.skipif(CUDA, reason="CUDA is available here")
def test_without_cuda_the_error_says_so_and_lists_devices() -> None:
    with pytest.raises(ValueError, match=r"no CUDA device.*devices here: cpu"):
        get_backend("cuda")
    # The front door reaches the same backend and the same error.
    with pytest.raises(ValueError, match=r"no CUDA device.*devices here: cpu"):
        specsample.load(Config(backend="cuda"))


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_cuda_graphs_match_eager_and_do_not_move_buffers() -> None:
    backend = get_backend("cuda", {"buckets": [128], "dtype": "float32"})
    target = backend.load_target("smollm2")
    drafter = backend.load_drafter("early-exit:8", target)
    ids = backend.asarray([[1, 9690, 42, 2683, 314, 253, 1345, 30], [1, 42, 7, 9, 11, 12, 13, 14]])
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_p=0.9)):
        run = dict(max_new_tokens=24, k=4, params=params, seed=1)
        got = backend.generate(target, drafter, ids, RunOptions(**run))
        want = generate(target, drafter, ids, **run)
        same = sum(got.new_tokens(b) == want.new_tokens(b) for b in range(2))
        assert same >= 1 if params.temperature else same == 2  # float32 near-ties are rare
    slot = next(iter(backend.engine(target, drafter).slots.values()))
    pointers = slot.pointers()
    backend.generate(target, drafter, ids, RunOptions(max_new_tokens=8, k=4))
    assert slot.pointers() == pointers


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_the_shipped_head_drafts_for_a_bfloat16_target_on_the_gpu() -> None:
    # Its layers on the target's device; the card's bfloat16 fingerprint names this target.
    runner = specsample.load(Config(backend="torch", options={"device": "cuda", "dtype": "bfloat16"},
                                    draft="head"))
    out = runner.generate(["Write a haiku about the sea."], max_new_tokens=32,
                          params=SamplingParams(temperature=0))
    assert out.metrics.accepted > 0
