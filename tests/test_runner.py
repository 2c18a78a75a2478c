"""The front door: one script on every backend, run options, kept states, flat memory, row invariance."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

import specsample
from specsample import Config, ConsumedCacheError, RunOptions, SamplingParams
from specsample.core.rng import round_uniforms
from specsample.engine.round import round_step

PROMPT = "Once upon a time"


def _toml(tmp_path: Path, backend: str, extra: str = "") -> Path:
    path = tmp_path / "run.toml"
    path.write_text(f'backend = "{backend}"\ntemperature = 0.0\nk = 3\n{extra}')
    return path


def _script(path: Path) -> tuple[specsample.Runner, specsample.Generation]:
    """The README's script, unchanged whatever the backend."""
    config = Config.load(path, environ={})
    runner = specsample.load(config)
    out = runner.generate([PROMPT], max_new_tokens=8)
    return runner, out


def test_script_runs_on_the_reference_backend(tmp_path: Path) -> None:
    runner, out = _script(_toml(tmp_path, "reference"))
    assert out.texts is not None and len(out.texts[0]) == 8
    assert out.new_tokens(0) == runner.generate(PROMPT, max_new_tokens=8).new_tokens(0)
    ids = runner.tokenizer.encode(PROMPT)
    # Ids as lists or as an array give the same tokens as the string.
    assert runner.generate([ids], max_new_tokens=8).new_tokens(0) == out.new_tokens(0)
    assert runner.generate(np.array([ids]), max_new_tokens=8).new_tokens(0) == out.new_tokens(0)
    plain = runner.generate_plain([PROMPT], max_new_tokens=8)
    assert plain.new_tokens(0) == out.new_tokens(0)  # greedy: speculative equals plain


def test_runner_options_and_their_errors(tmp_path: Path) -> None:
    runner, _ = _script(_toml(tmp_path, "reference"))
    run = runner.options(max_new_tokens=5, seed=[1, 2])
    assert run.params == SamplingParams(temperature=0.0) and run.seed == [1, 2]
    with pytest.raises(TypeError, match=r"options: unknown \['top_q'\]"):
        runner.options(top_q=0.5)
    with pytest.raises(ValueError, match=r"seed: expected one seed per row \(2\), got 3"):
        runner.generate(["ab", "cd"], max_new_tokens=4, seed=[1, 2, 3])
    with pytest.raises(ValueError, match="prompts: expected non-empty strings"):
        runner.generate([""], max_new_tokens=4)
    with pytest.raises(ValueError, match=r"verifier: unknown name 'tree-ish'; known: block, token"):
        RunOptions(max_new_tokens=4, verifier="tree-ish")
    with pytest.raises(ValueError, match="max_new_tokens: expected an int >= 1, got 0"):
        RunOptions(max_new_tokens=0)
    with pytest.raises(TypeError, match="config: expected a Config, got dict"):
        specsample.load({"backend": "reference"})  # type: ignore[arg-type]


def _branch_from_a_kept_state(runner: specsample.Runner) -> None:
    """Keep the state after round 0, run round 1, then try to branch from the kept state."""
    steps = runner.iterate([PROMPT], max_new_tokens=12, k=2)
    kept = next(steps)
    next(steps)
    with pytest.raises(ConsumedCacheError, match=r"state\.target_cache: this cache was consumed"):
        round_step(kept.state, runner.target, runner.drafter, k=2, params=SamplingParams(),
                   uniforms=round_uniforms(0, 1, 1, 2, like=kept.state.tokens))


def test_a_kept_state_is_consumed_on_the_reference_backend(tmp_path: Path) -> None:
    runner, _ = _script(_toml(tmp_path, "reference"))
    _branch_from_a_kept_state(runner)
    lookup = specsample.load(Config(backend="reference", draft="lookup"))
    _branch_from_a_kept_state(lookup)


@pytest.mark.slow
def test_script_runs_on_torch_and_static_cpu_with_the_same_tokens(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    runner, eager = _script(_toml(tmp_path, "torch"))
    assert eager.texts is not None and eager.texts[0].strip()
    _branch_from_a_kept_state(runner)
    before = counters["stats"]["unique_graphs"]
    static, compiled = _script(_toml(tmp_path, "static-cpu", "[options]\nbuckets = [128]\n"))
    assert counters["stats"]["unique_graphs"] > before  # the static engine compiled and ran
    assert compiled.new_tokens(0) == eager.new_tokens(0)  # greedy, float32: no near-tie here
    assert compiled.texts == eager.texts
    _branch_from_a_kept_state(static)


def test_generate_memory_stays_flat_at_b64_and_2000_tokens() -> None:
    """Every round's state used to stay alive (+1.7 GB here); now only the last one is kept.

    NumPy reports its allocations to tracemalloc, so the peak is exact (no noise).
    """
    runner = specsample.load(Config(backend="reference", temperature=0.8))
    prompts = [[i % 8, (i + 1) % 8] for i in range(64)]
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        out = runner.generate(prompts, max_new_tokens=2000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    result = out.sequences.nbytes + out.lengths.nbytes
    # The live state is a few [64, ~2010] int64 arrays (tokens and two caches' histories,
    # ~1 MB each, plus temporaries of a round); 12 MB bounds it with room to spare.
    assert peak - base < result + 12 * 2**20, (peak - base, result)
    assert int(out.lengths.min()) == 2002


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096


def test_torch_generation_soak_stays_flat_over_4000_tokens() -> None:
    from specsample_backends.torch import HFModel
    from specsample_backends.torch.early_exit import early_exit_draft
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    module = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                          max_position_embeddings=8192)).eval()
    target = HFModel(module)
    drafter = specsample.ModelDrafter(early_exit_draft(target, 1))
    steps = specsample.iterate(target, drafter, torch.tensor([[1, 2, 3]]), max_new_tokens=4000,
                               params=SamplingParams(temperature=1.0), k=3)
    samples = []
    for step in steps:
        if step.index % 100 == 99:
            samples.append(_rss())
    assert int(step.state.lengths[0]) == 4003
    # After warm-up (the first samples), resident memory may wobble with the allocator,
    # not grow with the rounds: a leak of one round's logits would add MBs per 100 rounds.
    growth = max(samples[2:]) - samples[2]
    assert growth < 16 * 2**20, [s // 2**20 for s in samples]


def _rows_alone_and_together(runner: specsample.Runner, prompts: list[list[int]], seeds: list[int],
                             **run: object) -> tuple[list[list[int]], list[list[int]]]:
    together = runner.generate(prompts, max_new_tokens=12, seed=seeds, **run)
    alone = [runner.generate([p], max_new_tokens=12, seed=[s], **run).new_tokens(0)
             for p, s in zip(prompts, seeds, strict=True)]
    return alone, [together.new_tokens(i) for i in range(len(prompts))]


@pytest.mark.parametrize("draft", ["noisy:0.3", "lookup", "noisy:0.3@0.3", "hybrid", "hybrid@0.3", "auto"])
def test_a_rows_tokens_do_not_depend_on_its_neighbours(draft: str) -> None:
    runner = specsample.load(Config(backend="reference", draft=draft, temperature=0.8,
                                    target="ngram:vocab=8,order=2,seed=3"))
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, 8, size=n)] for n in (1, 7, 3, 12, 5, 2, 9, 4)]
    seeds = [11, 5, 0, 2**40, 7, 7, 123, 9]
    alone, together = _rows_alone_and_together(runner, prompts, seeds)
    assert together == alone  # float64, NumPy: no exception at all
    # The test bites: one int seed for the batch keys rows by position.
    positional = runner.generate(prompts, max_new_tokens=12, seed=11)
    assert [positional.new_tokens(i) for i in range(8)] != alone


TEXTS = ["Name a colour.", "Write a haiku about rain.", "What is 2 + 2?", "Say hello in French.",
         "List three fruits: apple, banana, cherry. Repeat the list.", "Why is the sky blue?",
         "Count from one to five.", "Give a synonym for happy."]


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["int8", "lookup"])
def test_rows_of_a_real_model_do_not_depend_on_their_neighbours(draft: str) -> None:
    """SmolLM2 in float32 at T=0.8 with per-row seeds: a ragged batch of 8 gives each row its
    single-prompt tokens. A float32 matrix product of another batch size can move a logit by
    ~1e-6 and so flip a draw that falls within that distance of an interval boundary (a
    near-tie): with 8 rows x 12 tokens such an event is rare, and at most one row may show it.
    The int8 draft quantizes each row with its own scale, so its integer products are the
    row's own; its float parts (attention over another span) can still move an activation
    by a last bit, which may round it to the next int8 level and move q by ~1e-3 rather than
    1e-6: a wider near-tie, so up to two rows are counted there (0 of 8 with two threads,
    2 of 8 with one, measured)."""
    runner = specsample.load(Config(backend="torch", draft=draft, temperature=0.8, k=3))
    prompts = [runner.encode(t)[0][0].tolist() for t in TEXTS]
    seeds = [31 * i + 5 for i in range(8)]
    alone, together = _rows_alone_and_together(runner, prompts, seeds)
    differing = sum(a != b for a, b in zip(alone, together, strict=True))
    assert differing <= (2 if draft == "int8" else 1), (alone, together)


def test_block_verification_is_chosen_by_config() -> None:
    """`Config(verifier="block")` reaches the loop: greedy output still equals plain decoding,
    and the rule differs from token-wise on the same sampled run (it accepts other drafts)."""
    block = specsample.load(Config(backend="reference", verifier="block", temperature=0.0))
    assert block.options(max_new_tokens=1).verifier == "block"
    out = block.generate(["abcabc", "hello"], max_new_tokens=16)
    plain = block.generate_plain(["abcabc", "hello"], max_new_tokens=16)
    assert [out.new_tokens(i) for i in range(2)] == [plain.new_tokens(i) for i in range(2)]
    sampled = dict(max_new_tokens=64, params=SamplingParams(temperature=1.0), seed=3)
    by_block = block.generate(["abcabc"], **sampled)
    by_token = block.generate(["abcabc"], verifier="token", **sampled)
    assert by_block.metrics.accepted != by_token.metrics.accepted or \
        by_block.new_tokens(0) != by_token.new_tokens(0)


def test_load_settles_the_default_k_by_the_drafter() -> None:
    """K left unset is AUTO_K for a drafter that narrows each round itself (torch's `auto`),
    the K Thm 3.8 rates fastest here for a torch model drafter that verifies all K (its
    costs measured at load, the rating in the drafter note), and DEFAULT_K for the others
    (the reference backend's noisy draft, torch's lookup, a thresholded model draft); a K
    given is kept."""
    from specsample_backends.torch import loading

    from specsample.api.config import AUTO_K, DEFAULT_K
    from specsample.core.metrics import Costs
    from specsample.drafters.model import DraftRating, ModelDrafter
    from specsample.engine.scheduler import PRIOR, RATED_K_MAX

    assert specsample.load(Config()).config.k == DEFAULT_K
    assert specsample.load(Config(k=2)).config.k == 2
    assert specsample.load(Config(backend="torch", draft="lookup")).config.k == DEFAULT_K
    assert specsample.load(Config(backend="torch", draft="early-exit:10@0.5")).config.k == DEFAULT_K
    auto = specsample.load(Config(backend="torch"))
    assert auto.config.k == AUTO_K and auto.options(max_new_tokens=1).k.k_max == AUTO_K
    assert specsample.load(Config(backend="torch", k=3)).config.k == 3
    assert specsample.load(Config(backend="torch", draft="early-exit:10", k=3)).config.k == 3
    rated = specsample.load(Config(backend="torch", draft="early-exit:10"))
    k = rated.config.k
    assert isinstance(k, int) and 1 <= k <= RATED_K_MAX
    note = rated.drafter_note()
    assert f"K = {k} (none given): Thm 3.8 rates K = 1.." in note
    assert f"prior alpha of {PRIOR.alpha:.2f}" in note
    # The note's rates are the rating the choice came from: K's is their maximum (at the
    # note's two decimals, a near-tie of two K reads as a tie).
    rates = [float(r) for r in note.split(" at ")[1].split(" plain")[0].split(", ")]
    assert rates[k - 1] == max(rates)
    sure = rated.backend.load_drafter("early-exit:10@0.5", rated.target)
    assert loading.rated_k(rated.target, sure) is None
    # What a head kept as a chain measured at load (its rating's costs) is rated, not measured again.
    loaded = rated.backend.load_drafter("early-exit:10", rated.target)
    asked: list[tuple[int, int]] = []
    measured = Costs(c=0.25, width=lambda batch, width: asked.append((batch, width)) or 1.0 + 0.1 * width)
    chain = ModelDrafter(loaded.model, rating=DraftRating(costs=measured))  # type: ignore[attr-defined]
    told = loading.rated_k(rated.target, chain)
    assert told is not None and "c = 0.25" in told[1]
    assert asked == [(1, positions) for positions in range(2, RATED_K_MAX + 2)]
    # Another drafter on the same loaded target gets the K `load` would give it.
    other = rated.with_drafter("lookup")
    assert other.target is rated.target and other.backend is rated.backend
    assert (other.config.draft, other.config.k, other.k_note) == ("lookup", DEFAULT_K, None)
    assert rated.with_drafter("early-exit:10@0.5").config.k == DEFAULT_K


def test_prepare_measures_the_verify_costs_a_batch_reads_before_any_generation() -> None:
    """`load` measures the verify's cost at every width a batch-1 round of `auto` may take;
    `prepare(B)` does the same at B rows, so a generation at B measures nothing."""
    from specsample.api.config import AUTO_K
    from specsample.drafters.hybrid import HybridDrafter
    from specsample.engine.cost import WidthCost, anchor_widths

    runner = specsample.load(Config(backend="torch", temperature=0.7))
    assert isinstance(runner.drafter, HybridDrafter) and runner.drafter.scheduler is not None
    cost = runner.drafter.scheduler.width_cost
    assert isinstance(cost, WidthCost)
    anchors = set(anchor_widths(AUTO_K + 1))
    assert {w for b, w in cost.measured if b == 1} == anchors
    runner.generate([PROMPT], max_new_tokens=24)
    assert {b for b, _ in cost.measured} == {1}
    runner.prepare(2)
    measured = dict(cost.measured)
    assert {w for b, w in measured if b == 2} == anchors
    runner.generate([PROMPT, "The history of paper"], max_new_tokens=24)
    assert cost.measured == measured  # nothing measured during the generation
    with pytest.raises(ValueError, match="batch: expected an int >= 1"):
        runner.prepare(0)
    lookup = specsample.load(Config(backend="torch", draft="lookup"))
    lookup.prepare(4)  # measures nothing per width: returns
