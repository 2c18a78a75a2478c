"""The prefix-tree sampler: exact laws per distinct prefix, each row its own uniforms.

Statistics as in tests/test_generate.py: n = 200,000 rows per method, the first 3 tokens
jointly (M = 27 outcomes), goodness_of_fit at alpha = 1e-4 (tau ~= 0.0084, so a law at
TV >= 0.017 is caught with probability >= 1 - 1e-4); fixed seeds keep CI deterministic.
The negative control (resample from p after a rejection) must fail the same test.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_generate import PROMPT, VOCAB, expected_law, models

from specsample import ModelDrafter, SamplingParams, get_backend
from specsample.core.verify import verify
from specsample.core.verify_block import verify_block
from specsample.core.warp import warp
from specsample.testing import PrefixLaws, broken, goodness_of_fit, homogeneity, tree_samples

ROWS = 200_000


def _outcomes(tokens: np.ndarray) -> np.ndarray:
    return tokens[:, 0] * 9 + tokens[:, 1] * 3 + tokens[:, 2]


def _drafter() -> tuple[object, ModelDrafter]:
    target, _ = models()
    return target, get_backend("reference").load_drafter("noisy:0.5", target)


@pytest.mark.parametrize(("params", "k"), [
    (SamplingParams(), 2),
    (SamplingParams(temperature=0.7, top_k=2), 3),
    (SamplingParams(temperature=1.3, top_p=0.8), 1),
])
def test_both_methods_follow_the_target_law(params: SamplingParams, k: int) -> None:
    target, drafter = _drafter()
    spec, plain, counts = tree_samples(target, drafter, np.array([PROMPT]), n=ROWS, k=k,
                                       params=params, seed=5, batch=8192, chunk=50_000)
    law = expected_law(target, params)
    for name, samples in (("speculative", spec), ("plain", plain)):
        assert samples.shape == (ROWS, 3) and samples.min() >= 0
        result = goodness_of_fit(_outcomes(samples), law)
        assert result.passed, f"{name}: {result}"
    assert counts["laws"] <= 2 * (1 + VOCAB + 4 * VOCAB**2)  # per prefix (and chunk), not per row


@pytest.mark.parametrize("name", ["resample-from-p", "p-shifted"])
def test_a_broken_rule_is_caught(name: str) -> None:
    target, drafter = _drafter()
    spec, plain, _ = tree_samples(target, drafter, np.array([PROMPT]), n=ROWS, k=2,
                                  params=SamplingParams(), seed=6, batch=8192,
                                  verifier=broken.VERIFIERS[name],
                                  lookahead=broken.LOOKAHEAD.get(name, 0))
    law = expected_law(target, SamplingParams())
    result = goodness_of_fit(_outcomes(spec), law)
    assert not result.passed and result.tv > 2 * result.tau, str(result)
    assert goodness_of_fit(_outcomes(plain), law).passed
    assert not homogeneity(_outcomes(spec), _outcomes(plain), alpha=1e-4, bins=8).passed


def test_seeds_reproduce_and_differ() -> None:
    target, drafter = _drafter()
    run = [tree_samples(target, drafter, np.array([PROMPT]), n=500, k=2, params=SamplingParams(),
                        seed=s)[:2] for s in (1, 1, 2)]
    assert all(np.array_equal(a, b) for a, b in zip(run[0], run[1], strict=True))
    assert not np.array_equal(run[0][0], run[2][0])
    assert not np.array_equal(run[0][0], run[0][1])  # the two methods use their own uniforms


def test_rows_split_into_calls_give_the_whole_sample() -> None:
    # Each row's uniforms are keyed by its global index, so shards (`check --distributed`)
    # reproduce one call bit for bit; a shard that restarted the counters would not.
    target, drafter = _drafter()
    kwargs = {"k": 2, "params": SamplingParams(temperature=0.7), "seed": 5}
    whole = tree_samples(target, drafter, np.array([PROMPT]), n=500, **kwargs)  # type: ignore[arg-type]
    parts = [tree_samples(target, drafter, np.array([PROMPT]), n=n, first_row=first,
                          **kwargs)  # type: ignore[arg-type]
             for first, n in ((0, 180), (180, 320))]
    for method in range(2):
        assert np.array_equal(np.concatenate([p[method] for p in parts]), whole[method])
    restarted = tree_samples(target, drafter, np.array([PROMPT]), n=320, **kwargs)  # type: ignore[arg-type]
    assert not np.array_equal(restarted[0], whole[0][180:])  # negative control


# A confidence threshold (per-row draft length): each row keeps its drafts up to the first
# below the threshold, as the engine does. Same harness as above (200,000 rows, M = 27,
# tau ~= 0.0084 at false-failure <= 1e-4); the rule that drops that draft must fail.
@pytest.mark.parametrize(("name", "k"), [(None, 3), ("drop-low-confidence", 2)])
def test_a_confidence_threshold_follows_the_target_law_and_dropping_the_low_draft_does_not(
        name: str | None, k: int) -> None:
    target, drafter = _drafter()
    model = drafter.model
    sure = ModelDrafter(model, threshold=0.5) if name is None else broken.DRAFTERS[name](model)
    spec, plain, _ = tree_samples(target, sure, np.array([PROMPT]), n=ROWS, k=k, params=SamplingParams(),
                                  seed=8, batch=8192, chunk=50_000)
    law = expected_law(target, SamplingParams())
    result = goodness_of_fit(_outcomes(spec), law)
    assert result.passed == (name is None), str(result)
    assert goodness_of_fit(_outcomes(plain), law).passed


def test_a_threshold_drafters_rows_are_the_engines_rows() -> None:
    # Row b reads the uniforms and keeps the drafts that row b of `generate` does, so the
    # samples agree token for token; without the threshold they differ (the sampler would
    # otherwise test a fixed K under the threshold's name).
    from specsample.engine.generate import generate

    target, drafter = _drafter()
    sure = ModelDrafter(drafter.model, threshold=0.6)
    params = SamplingParams(temperature=0.9)
    spec, _, _ = tree_samples(target, sure, np.array([PROMPT]), n=400, k=3, params=params, seed=3)
    engine = generate(target, sure, np.array([PROMPT] * 400), max_new_tokens=3, params=params, k=3,
                      seed=3)
    assert 0 < engine.metrics.drafted < 3 * engine.metrics.row_rounds  # rows stopped early
    assert np.array_equal(spec, engine.sequences[:, len(PROMPT):])
    fixed, _, _ = tree_samples(target, drafter, np.array([PROMPT]), n=400, k=3, params=params, seed=3)
    assert not np.array_equal(fixed, spec)


# A hybrid (prompt lookup's copies where the context repeats, the model elsewhere): a prompt
# whose suffix recurs, so that rows mix copies and model drafts from the first round.
HYBRID_PROMPT = [1, 2, 0, 2, 1, 2]


def _law_after(target: object, prompt: list[int], params: SamplingParams) -> np.ndarray:
    """The target's law of 3 tokens after `prompt`: [27], outcome 9 a + 3 b + c."""
    from fractions import Fraction

    from specsample.testing import autoregressive_law

    def law(context: tuple[int, ...]) -> list[Fraction]:
        row = np.array([float(x) for x in target.law(context)])  # type: ignore[attr-defined]
        with np.errstate(divide="ignore"):
            warped = [Fraction(float(x)) for x in warp(np.log(row), params)]
        return [x / sum(warped) for x in warped]

    out = np.zeros(VOCAB**3)
    for (a, b, c), prob in autoregressive_law(law, prompt, length=3, vocab_size=VOCAB).items():
        out[a * 9 + b * 3 + c] = float(prob)
    return out


def test_a_hybrids_rows_are_the_engines_rows() -> None:
    # Copies, model drafts and (with a threshold) per-row lengths, each row's own uniforms:
    # token for token what `generate` gives the same rows.
    from specsample.drafters.hybrid import HybridDrafter
    from specsample.engine.generate import generate

    target, drafter = _drafter()
    params = SamplingParams(temperature=0.9)
    for inner in (drafter, ModelDrafter(drafter.model, threshold=0.6)):
        hybrid = HybridDrafter(inner)
        spec, _, _ = tree_samples(target, hybrid, np.array([HYBRID_PROMPT]), n=400, k=2, params=params,
                                  seed=3)
        engine = generate(target, hybrid, np.array([HYBRID_PROMPT] * 400), max_new_tokens=3,
                          params=params, k=2, seed=3)
        assert engine.metrics.copied_trials_at and engine.metrics.trials_at  # both kinds ran
        assert np.array_equal(spec, engine.sequences[:, len(HYBRID_PROMPT):])
    model_only, _, _ = tree_samples(target, drafter, np.array([HYBRID_PROMPT]), n=400, k=2, params=params,
                                    seed=3)
    assert not np.array_equal(model_only, spec)  # the copies made a difference


@pytest.mark.parametrize("name", [None, "resample-from-p"])
def test_a_hybrid_follows_the_target_law_and_a_broken_rule_does_not(name: str | None) -> None:
    # 200,000 rows, M = 27 outcomes, as above.
    from specsample.drafters.hybrid import HybridDrafter

    target, drafter = _drafter()
    hybrid = HybridDrafter(ModelDrafter(drafter.model, threshold=0.5))
    verifier = verify if name is None else broken.VERIFIERS[name]
    spec, plain, _ = tree_samples(target, hybrid, np.array([HYBRID_PROMPT]), n=ROWS, k=2,
                                  params=SamplingParams(), seed=11, batch=8192, chunk=50_000,
                                  verifier=verifier)
    law = _law_after(target, HYBRID_PROMPT, SamplingParams())
    result = goodness_of_fit(_outcomes(spec), law)
    assert result.passed == (name is None), str(result)
    assert goodness_of_fit(_outcomes(plain), law).passed


def test_the_tree_sampler_refuses_an_auto_hybrid() -> None:
    from specsample.drafters.hybrid import HybridDrafter
    from specsample.engine.scheduler import Scheduler

    target, drafter = _drafter()
    with pytest.raises(TypeError, match="drafter: an `auto` hybrid's gate"):
        tree_samples(target, HybridDrafter(drafter, scheduler=Scheduler(cost_ratio=0.5)), np.array([PROMPT]),
                     n=10, k=2, params=SamplingParams(), seed=0)


def test_prefix_laws_keep_further_arrays_per_prefix() -> None:
    target, _ = models()
    laws = PrefixLaws(target, np.array([PROMPT]), lambda x: (np.exp(x), np.exp(x), 2 * x), depth=1)
    keys = [(1,), (), (1,)]
    draw, _ = laws.rows(keys)
    assert np.allclose(laws.column(keys, 2), 2 * np.log(draw))
    with pytest.raises(ValueError, match="law: expected \\(the law to sample from"):
        PrefixLaws(target, np.array([PROMPT]), lambda x: (x,), depth=1)


class _Counting:
    """A Model that counts the tokens it is fed."""

    def __init__(self, model: object) -> None:
        self.model, self.fed = model, 0
        self.vocab_size = model.vocab_size  # type: ignore[attr-defined]

    def new_cache(self, batch: int, capacity: int) -> object:
        return self.model.new_cache(batch, capacity)  # type: ignore[attr-defined]

    def forward(self, tokens: np.ndarray, cache: object) -> object:
        self.fed += tokens.size
        return self.model.forward(tokens, cache)  # type: ignore[attr-defined]


def test_prefix_laws_are_the_models_and_computed_once() -> None:
    target, _ = models()
    counting = _Counting(target)
    params = SamplingParams(temperature=0.8)
    laws = PrefixLaws(counting, np.array([PROMPT]), lambda x: (warp(x, params),) * 2, depth=2,
                      batch=4)
    assert counting.fed == len(PROMPT) and len(laws) == 1
    keys = [(0,), (2, 1), (2, 1), (0, 0), ()]
    draw, report = laws.rows(keys)
    assert draw is report and draw.shape == (5, VOCAB)
    fed = counting.fed
    assert fed - len(PROMPT) == laws.forwarded == 1 + 2 * 2  # (0,) once, then (2, 1) and (0, 0)
    assert len(laws) == 5  # (), (0,), (2,), (2, 1), (0, 0): the ancestor (2,) came for free
    for key, row in zip(keys, draw, strict=True):
        exact = np.array([float(x) for x in target.law(tuple(PROMPT) + key)])
        with np.errstate(divide="ignore"):
            assert np.allclose(row, warp(np.log(exact), params))
    laws.rows(keys)
    assert counting.fed == fed  # all known now
    laws.forget(2)
    assert len(laws) == 3 and all(len(k) < 2 for k in laws.table)
    with pytest.raises(ValueError, match="keys: expected prefixes of at most 2 ids, got 3"):
        laws.fill([(0, 0, 0)])


def test_bad_arguments() -> None:
    target, drafter = _drafter()
    prompt = np.array([PROMPT])
    lookup = get_backend("reference").load_drafter("lookup", target)
    with pytest.raises(TypeError, match="drafter: expected a model drafter"):
        tree_samples(target, lookup, prompt, n=10, k=2, params=SamplingParams(), seed=0)
    with pytest.raises(ValueError, match="n: expected an int >= 1"):
        tree_samples(target, drafter, prompt, n=0, k=2, params=SamplingParams(), seed=0)
    with pytest.raises(TypeError, match="params: expected SamplingParams"):
        tree_samples(target, drafter, prompt, n=10, k=2, params=0.7, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"prompt: expected int64 ids \[1, T >= 1\], got shape \[2, 2\]"):
        PrefixLaws(target, np.array([PROMPT, PROMPT]), lambda x: (x, x), depth=1)
    with pytest.raises(TypeError, match="model: expected a specsample Model"):
        PrefixLaws(object(), prompt, lambda x: (x, x), depth=1)  # type: ignore[arg-type]


# Trees: a tiny random Llama (V = 8, float64: the tree sampler's per-prefix laws and the
# engine's tree forward agree to ~1e-15, so no uniform falls between them) with a prompt
# whose suffix recurs, so that the suffix drafter builds trees of several nodes.
TREE_PROMPT = [1, 5, 2, 7, 1, 5, 3, 1, 5, 2]


def _llama() -> object:
    from test_tree import tree_llama

    return tree_llama()


def test_a_tree_drafters_rows_are_the_engines_rows() -> None:
    # Row b of the tree sampler reads the uniforms row b of `generate` reads, and the laws
    # agree: the samples are the same, token for token (a wrong uniform column or node law
    # would break this on most rows).
    import torch

    from specsample.drafters.suffix import SuffixTreeDrafter
    from specsample.engine.generate import generate

    target, drafter = _llama(), SuffixTreeDrafter(nodes=6, depth=3)
    params = SamplingParams(temperature=1.0)
    spec, _, _ = tree_samples(target, drafter, torch.tensor([TREE_PROMPT]), n=300, k=1,
                              params=params, seed=4)
    engine = generate(target, drafter, torch.tensor([TREE_PROMPT] * 300), max_new_tokens=3,
                      params=params, seed=4)
    assert engine.metrics.accepted > 0
    assert np.array_equal(spec, engine.sequences[:, len(TREE_PROMPT):].numpy())
    # A chain rule's name means the tree rule for trees, as in `generate`.
    block, _, _ = tree_samples(target, drafter, torch.tensor([TREE_PROMPT]), n=300, k=1, params=params,
                               seed=4, verifier=verify_block)
    assert np.array_equal(block, spec)


def _tree_law(target: object, params: SamplingParams) -> np.ndarray:
    """The target's law of the first 2 tokens after TREE_PROMPT: [64], outcome 8 a + b."""
    import torch

    laws = PrefixLaws(target, torch.tensor([TREE_PROMPT]),  # type: ignore[arg-type]
                      lambda x: (warp(x, params),) * 2, depth=1)
    first = laws.rows([()])[0][0].numpy()
    second = laws.rows([(a,) for a in range(8)])[0].numpy()
    law: np.ndarray = (first[:, None] * second).reshape(-1)
    return law / law.sum()


# n = 200,000 rows, the first 2 tokens (M = 64 outcomes): tau = sqrt((ln(2^64 - 2) + ln(1e4))
# / 2n) ~= 0.0116 at false-failure <= 1e-4 (plus <= 1e-4 for the G-test); a law at TV >= 0.024
# is caught with probability >= 1 - 1e-4. The residual that keeps a rejected sibling's mass
# must fail; q = 1 in the ratio is the one-hot q of deterministic candidates, so for these
# trees that rule is the right one and must pass (it is wrong for sampled siblings).
# "memory": trees also drawn from sequences of earlier calls (the suffix "5 2" continues
# differently there), so more branches are tried.
@pytest.mark.parametrize("rule", [None, "memory", "tree-without-residual", "tree-q-one"])
def test_tree_rounds_follow_the_target_law_and_broken_tree_rules_do_not(rule: str | None) -> None:
    import torch

    from specsample.drafters.suffix import SuffixTreeDrafter

    target, params = _llama(), SamplingParams(temperature=1.0)
    verifier = broken.TREE_VERIFIERS.get(str(rule), verify)
    drafter = SuffixTreeDrafter(nodes=6, depth=3, remember=4 if rule == "memory" else 0)
    if rule == "memory":
        drafter.memory = [np.array(m) for m in ([5, 2, 0, 0, 6], [1, 5, 2, 4, 4, 1], [3, 5, 2, 6, 1])]
    spec, plain, counts = tree_samples(target, drafter,
                                       torch.tensor([TREE_PROMPT]), n=ROWS, k=1, params=params,
                                       seed=9, length=2, verifier=verifier, batch=8192)
    law = _tree_law(target, params)
    result = goodness_of_fit(spec[:, 0] * 8 + spec[:, 1], law)
    assert result.passed == (rule != "tree-without-residual"), str(result)
    assert goodness_of_fit(plain[:, 0] * 8 + plain[:, 1], law).passed
    assert counts["laws"] < 200  # per prefix, not per row


def test_the_tree_sampler_refuses_a_chain_rule_for_trees_and_sampled_trees() -> None:
    import torch

    from specsample.core.protocols import TreeProposal
    from specsample.drafters.suffix import SuffixTreeDrafter

    target, prompt = _llama(), torch.tensor([TREE_PROMPT])
    with pytest.raises(ValueError, match="verifier: a tree drafter is verified by the tree rule"):
        tree_samples(target, SuffixTreeDrafter(), prompt, n=10, k=1, params=SamplingParams(), seed=0,
                     verifier=broken.VERIFIERS["resample-from-p"])

    class Sampled(SuffixTreeDrafter):  # the sampler builds trees with `trees` (no side effect)
        def trees(self, tokens, lengths, nodes, depth):  # type: ignore[no-untyped-def]
            tree = super().trees(tokens, lengths, nodes, depth)
            probs = np.full((*tree.tokens.shape, 8), 1 / 8)
            return TreeProposal(tokens=tree.tokens, parents=tree.parents, sizes=tree.sizes, probs=probs)

    with pytest.raises(TypeError, match="drafter: the tree sampler verifies deterministic trees"):
        tree_samples(target, Sampled(), prompt, n=10, k=1, params=SamplingParams(), seed=0)
