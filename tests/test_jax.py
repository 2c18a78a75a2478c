"""The core on JAX arrays: warp, sample and verify eagerly, under jax.jit and under jax.vmap,
and rounds over the reference toy models, against NumPy on the same inputs and uniforms.

These tests are deterministic (fixed seeds, no statistics): the same inputs and uniforms
must give the same tokens on both libraries, and probabilities equal up to float64
rounding. JAX computes in 32 bits unless `jax_enable_x64` is on, so the float64
comparisons turn it on for their own duration only (the `x64` fixture).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from specsample_backends.reference import random_ngram
from specsample_backends.reference.backend import noisy

from specsample import ModelDrafter, SamplingParams, round_step, sample, start, uniforms, verify, warp
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.testing.broken import accept_if_le

MODES = ["eager", "jit", "vmap"]
# Without x64, JAX has no int64: the core's int64 requests come back int32, with this warning.
NO_INT64 = "ignore:Explicitly requested dtype int64:UserWarning"


@pytest.fixture
def x64() -> Iterator[None]:
    """float64 and int64 on JAX for one test, as NumPy has them."""
    with jax.enable_x64(True):
        yield


def _on_jax(mode: str, fn: Callable[..., tuple[jax.Array, ...]], *arrays: np.ndarray) -> list[jax.Array]:
    """fn(*arrays, check=...) on JAX copies of `arrays` [N, B, ...].

    eager: one call on [N*B, ...] with the input checks on; jit: the same call under
    jax.jit with check=False (the checks read values, which a trace does not have);
    vmap: fn maps over N, each call seeing [B, ...], with check=False. Results come
    back as [N, B, ...].
    """
    n = arrays[0].shape[0]
    if mode == "vmap":
        return list(jax.vmap(lambda *a: fn(*a, check=False))(*map(jnp.asarray, arrays)))
    flat = [jnp.asarray(a.reshape(-1, *a.shape[2:])) for a in arrays]
    call = (lambda *a: fn(*a, check=True)) if mode == "eager" else jax.jit(lambda *a: fn(*a, check=False))
    return [o.reshape(n, -1, *o.shape[1:]) for o in call(*flat)]


WARPS = [
    SamplingParams(temperature=0.7),
    SamplingParams(top_k=5),
    SamplingParams(top_p=0.8),
    SamplingParams(min_p=0.1),
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.8, top_k=10, top_p=0.9, min_p=0.02),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("params", WARPS, ids=repr)
def test_warp_matches_numpy(x64: None, mode: str, params: SamplingParams) -> None:
    rng = np.random.default_rng(0)
    # Logits on a grid of 0.5 (ties for top-k, top-p and greedy) with some -inf entries.
    logits = np.round(rng.normal(size=(2, 6, 40)) * 2) / 2
    logits[rng.random(logits.shape) < 0.1] = -np.inf
    (out,) = _on_jax(mode, lambda x, check: (warp(x, params, check=check),), logits)
    assert isinstance(out, jax.Array) and out.dtype == jnp.float64
    ref = warp(logits, params)
    # float64 rounding only (sums and exps in another order): 1e-14 on values <= 1.
    np.testing.assert_allclose(np.asarray(out), ref, rtol=0, atol=1e-14)
    assert np.array_equal(np.asarray(out) == 0, ref == 0)  # the same tokens masked, exactly 0


@pytest.mark.parametrize("mode", MODES)
def test_sample_matches_numpy(x64: None, mode: str) -> None:
    rng = np.random.default_rng(1)
    probs = rng.random((2, 50, 9)) * (rng.random((2, 50, 9)) > 0.4) * 10  # unnormalised, with zeros
    probs[..., 4] += 0.5  # positive mass in every row
    u = rng.random((2, 50))
    u[:, :5], u[:, 5:10] = 0.0, 1 - 2**-53  # both ends of [0, 1)
    (out,) = _on_jax(mode, lambda p, v, check: (sample(p, v, check=check),), probs, u)
    assert isinstance(out, jax.Array) and out.dtype == jnp.int64
    tokens = np.asarray(out)
    assert np.array_equal(tokens, sample(probs, u))
    assert np.all(np.take_along_axis(probs, tokens[..., None], -1) > 0)  # never a zero-probability token


def _verify_case(rng: np.random.Generator, n: int, batch: int, k: int, vocab: int):
    """drafts [N, B, K] sampled from q [N, B, K, V], p [N, B, K+1, V], uniforms [N, B, K+1].

    p and q have zeros. Edge rows in every batch: the first 8 accept at u = 0 (where a
    draft with p(x) = 0 must still be rejected); the next 8 have p = q (1 - 2^-30) at
    the draft positions and reject at u = 1 - 2^-40, where max(0, p - q) has no mass
    and the final token falls back to p.
    """
    def law(*shape: int) -> np.ndarray:
        raw = rng.dirichlet(np.ones(vocab), size=shape) * (rng.random((*shape, vocab)) > 0.3)
        raw[..., rng.integers(vocab)] += 1e-3
        return raw / raw.sum(-1, keepdims=True)

    p, q = law(n, batch, k + 1), law(n, batch, k)
    p[:, 8:16, :k] = q[:, 8:16] * (1 - 2**-30)
    cdf = np.cumsum(q, -1)
    drafts = (cdf < rng.random((n, batch, k, 1)) * cdf[..., -1:]).sum(-1).astype(np.int64)
    u = rng.random((n, batch, k + 1))
    u[:, :8, :k] = 0.0
    u[:, 8:16, 0] = 1 - 2**-40
    return drafts, q, p, u


def _fields(verdict) -> tuple[jax.Array, jax.Array]:
    # Verdict is a plain dataclass, not a JAX pytree: a traced function returns its fields.
    return verdict.tokens, verdict.num_accepted


def _verify_numpy(drafts, q, p, u) -> tuple[np.ndarray, np.ndarray]:
    n, batch, k = drafts.shape
    flat = [None if a is None else a.reshape(n * batch, *a.shape[2:]) for a in (drafts, q, p, u)]
    ref = verify(*flat)
    return ref.tokens.reshape(n, batch, k + 1), ref.num_accepted.reshape(n, batch)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sampled", [True, False], ids=["sampled-drafts", "deterministic-drafts"])
def test_verify_matches_numpy(x64: None, mode: str, sampled: bool) -> None:
    drafts, q, p, u = _verify_case(np.random.default_rng(2), 3, 200, 4, 12)
    if sampled:
        tokens, n = _on_jax(mode, lambda d, dq, dp, v, check: _fields(verify(d, dq, dp, v, check=check)),
                            drafts, q, p, u)
    else:
        tokens, n = _on_jax(mode, lambda d, dp, v, check: _fields(verify(d, None, dp, v, check=check)),
                            drafts, p, u)
    assert tokens.dtype == jnp.int64 and n.dtype == jnp.int64
    ref_tokens, ref_n = _verify_numpy(drafts, q if sampled else None, p, u)
    assert np.array_equal(np.asarray(tokens), ref_tokens)
    assert np.array_equal(np.asarray(n), ref_n)
    # The inputs reach every branch: rejections, full acceptance (bonus token), and the
    # fall-back to p where the residual has no mass.
    assert 0 < np.mean(ref_n == 4) < 1 and np.any(ref_n == 0)
    if sampled:
        assert np.all(ref_n[:, 8:16] == 0)


def test_the_comparison_bites(x64: None) -> None:
    # Negative control: accepting with u * q(x) <= p(x) (one character off the rule) under
    # jax.jit must disagree with NumPy's verify, on the u = 0 rows only.
    drafts, q, p, u = _verify_case(np.random.default_rng(2), 3, 200, 4, 12)
    tokens, _ = _on_jax("jit", lambda d, dq, dp, v, check: _fields(accept_if_le(d, dq, dp, v, check=check)),
                        drafts, q, p, u)
    differ = np.any(np.asarray(tokens) != _verify_numpy(drafts, q, p, u)[0], axis=-1)  # [N, B]
    assert differ.any() and not differ[:, 8:].any()


def test_checks_need_concrete_values(x64: None) -> None:
    # Input checks read values, which a jax.jit trace does not have: under jit, check=False.
    drafts, q, p, u = (jnp.asarray(a[0]) for a in _verify_case(np.random.default_rng(2), 1, 20, 4, 12))
    with pytest.raises(TypeError, match="traced array"):
        jax.jit(lambda *a: _fields(verify(*a)))(drafts, q, p, u)


def test_mixing_jax_and_numpy_is_an_error(x64: None) -> None:
    drafts, q, p, u = (a[0] for a in _verify_case(np.random.default_rng(2), 1, 20, 4, 12))
    with pytest.raises(TypeError, match=r"expected arrays of one library .* got ArrayImpl, ndarray"):
        verify(jnp.asarray(drafts), q, p, u)


def _dyadic_case(rng: np.random.Generator, n: int, batch: int, k: int, vocab: int):
    """Like _verify_case, with laws in multiples of 2^-8 and uniforms in multiples of 2^-12.

    Every sum, difference and product the core forms is then exact in float32, so float32
    and float64 give the same tokens whatever the order of summation.
    """
    def law(*shape: int) -> np.ndarray:
        cuts = np.sort(rng.integers(0, 257, size=(*shape, vocab - 1)), axis=-1)
        edges = np.concatenate([np.zeros((*shape, 1)), cuts, np.full((*shape, 1), 256)], axis=-1)
        return np.diff(edges, axis=-1) / 256

    p, q = law(n, batch, k + 1), law(n, batch, k)
    cdf = np.cumsum(q, -1)
    drafts = (cdf <= rng.integers(0, 256, size=(n, batch, k, 1)) / 256).sum(-1).astype(np.int64)
    return drafts, q, p, rng.integers(0, 4096, size=(n, batch, k + 1)) / 4096


@pytest.mark.filterwarnings(NO_INT64)
@pytest.mark.parametrize("mode", MODES)
def test_default_float32_gives_the_float64_tokens_on_exact_inputs(mode: str) -> None:
    assert not jax.config.jax_enable_x64  # JAX's default: 32-bit floats and ints
    drafts, q, p, u = _dyadic_case(np.random.default_rng(3), 2, 300, 3, 8)
    f32 = [a.astype(np.float32) for a in (q, p, u)]
    tokens, n = _on_jax(mode, lambda d, dq, dp, v, check: _fields(verify(d, dq, dp, v, check=check)),
                        drafts, *f32)
    assert tokens.dtype == jnp.int32  # JAX's default integer: ids come back int32
    ref_tokens, ref_n = _verify_numpy(drafts, q, p, u)
    assert np.array_equal(np.asarray(tokens), ref_tokens) and np.array_equal(np.asarray(n), ref_n)
    assert 0 < np.mean(ref_n == 3) < 1 and np.any(ref_n == 0)
    (draws,) = _on_jax(mode, lambda dp, v, check: (sample(dp, v, check=check),),
                       f32[1][:, :, 0], f32[2][..., 0])
    assert np.array_equal(np.asarray(draws), sample(p[:, :, 0], u[..., 0]))


@pytest.mark.parametrize("drafter", ["model", "lookup"])
def test_rounds_over_toy_models_match_numpy(x64: None, drafter: str) -> None:
    # Ragged prompts (right-padded), an EOS, per-row stop lengths; five rounds, so that
    # commits, rollbacks and finished rows are all exercised on JAX arrays.
    target = random_ngram(9, order=2, seed=1, concentration=0.5, zeros=0.2)
    draft = ModelDrafter(noisy(target, 0.4)) if drafter == "model" else PromptLookupDrafter()
    params = SamplingParams(temperature=0.9, top_k=6)
    prompt = np.array([[1, 2, 3, 1, 2], [4, 5, 6, 0, 0], [0, 0, 1, 0, 0], [7, 8, 7, 8, 7]])
    lengths, stops = np.array([5, 3, 3, 5]), np.array([20, 9, 20, 20])
    k = 3

    def run(xp):
        state = start(target, draft, xp.asarray(prompt), xp.asarray(lengths), capacity=24,
                      stop_lengths=xp.asarray(stops))
        trace = []
        for step in range(5):
            u = uniforms(7, step, len(prompt), 2 * k + 1, like=state.tokens)
            state, result = round_step(state, target, draft, k=k, params=params, uniforms=u, eos=5)
            trace.append((state.tokens, state.lengths, state.done, state.target_cache.lengths,
                          result.verdict.tokens, result.verdict.num_accepted, result.emitted))
        return trace

    on_jax, on_numpy = run(jnp), run(np)
    assert all(isinstance(a, jax.Array) and a.dtype in (jnp.int64, jnp.bool_) for a in on_jax[-1])
    for got, want in zip(on_jax, on_numpy, strict=True):
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(np.asarray(a), b)
    final_lengths = on_numpy[-1][1]
    assert np.all(final_lengths > lengths) and np.any(on_numpy[-1][2])  # it generated; a row finished


def test_the_docs_jax_example_runs() -> None:
    # The example turns x64 on for its whole process: run it in a process of its own.
    page = (Path(__file__).parents[1] / "docs" / "guide" / "embed.md").read_text()
    code = next((c for c in re.findall(r"```python\n(.*?)```", page, re.DOTALL) if "jax.jit" in c), None)
    assert code is not None
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parents[1])
    assert run.returncode == 0, run.stderr
    assert re.search(r"\[\[\s*-?\d+", run.stdout), run.stdout  # the printed tokens [B, K+1]
