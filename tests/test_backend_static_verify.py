"""The static engine's verify_tensor / verify_block_tensor and its confidence rule: token for
token the core's, and traceable."""

from __future__ import annotations

import pytest
import torch
from specsample_backends.static import verify_block_tensor
from specsample_backends.static.verify import confidence_tensor, kept_tensor, verify_tensor

from specsample import verify, verify_block
from specsample.drafters.model import confidence_lengths, token_confidence

V = 37


def _inputs(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    b, k = 64, 4
    q = torch.softmax(torch.randn(b, k, V, generator=gen) * 2, -1).to(dtype)
    p = torch.softmax(torch.randn(b, k + 1, V, generator=gen) * 2, -1).to(dtype)
    p[0, :k] = q[0]  # p = q: no residual mass, every 0/0 threshold
    p[1, :, : V // 2] = 0  # disjoint-ish supports
    p[1] /= p[1].sum(-1, keepdim=True)
    x = torch.multinomial(q.float().reshape(-1, V), 1, generator=gen).reshape(b, k)
    u = torch.rand(b, k + 1, generator=gen, dtype=torch.float64).to(dtype)
    u[2] = 0.0
    lengths = torch.randint(0, k + 1, (b,), generator=gen)
    return x, q, p, u, lengths


@pytest.mark.parametrize(("mine", "core"), [(verify_tensor, verify), (verify_block_tensor, verify_block)],
                         ids=["token", "block"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", range(20))
def test_the_tensor_rules_equal_the_core_rules(seed: int, dtype: torch.dtype, mine, core) -> None:  # type: ignore[no-untyped-def]
    """Token for token, with every row verifying K drafts and with per-row draft lengths."""
    x, q, p, u, lengths = _inputs(seed, dtype)
    for kwargs in ({}, {"draft_lengths": lengths}):
        tokens, n = mine(x, q, p, u, **kwargs)
        want = core(x, q, p, u, check=False, **kwargs)
        assert torch.equal(tokens, want.tokens) and torch.equal(n, want.num_accepted)


def test_verify_block_tensor_compiles_as_one_graph() -> None:
    # No graph break (fullgraph), static shapes; in float64 the compiled graph gives the core's tokens.
    x, q, p, u, lengths = _inputs(0, torch.float64)
    compiled = torch.compile(verify_block_tensor, dynamic=False, fullgraph=True)
    tokens, n = compiled(x, q, p, u, lengths)
    want = verify_block(x, q, p, u, check=False, draft_lengths=lengths)
    assert torch.equal(tokens, want.tokens) and torch.equal(n, want.num_accepted)


def test_the_confidence_rule_is_the_drafters() -> None:
    """`confidence_tensor` and `kept_tensor` give `ModelDrafter`'s confidence and
    `confidence_lengths`, bit for bit; a zero threshold keeps all K (the knob's 'off')."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(64, V, generator=gen, dtype=torch.float64) * 3
    x = torch.randint(0, V, (64,), generator=gen)
    assert torch.equal(confidence_tensor(logits, x), token_confidence(logits, x))
    conf = torch.rand(64, 4, generator=gen, dtype=torch.float64)
    for threshold in (0.1, 0.5, 0.9):
        assert torch.equal(kept_tensor(conf, torch.tensor(threshold, dtype=torch.float64)),
                           confidence_lengths(conf, threshold))
    assert (kept_tensor(conf, torch.tensor(0.0, dtype=torch.float64)) == 4).all()
