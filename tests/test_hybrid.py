"""HybridDrafter and the shared drafter-name syntax, over the reference n-gram models.

The hybrid's law is checked statistically in test_generate.py and its greedy output here;
these tests pin down which rows copy, that a copying round skips the model, and that the
model's cache catches up exactly after copying rounds.
"""

from __future__ import annotations

import numpy as np
import pytest
from specsample_backends.reference import NGramModel, random_ngram

from specsample import SamplingParams, generate, generate_plain, get_backend
from specsample.api.draft_names import compose_drafter
from specsample.core.protocols import SkippingDrafter
from specsample.core.rng import round_uniforms, uniforms
from specsample.drafters.hybrid import HybridDrafter
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.drafters.model import ModelDrafter
from specsample.engine.round import round_step, start
from specsample.engine.scheduler import Prior, Scheduler

CAPACITY = 64


class Counting:
    """A Model that counts the tokens fed to it."""

    def __init__(self, model: NGramModel) -> None:
        self.model, self.fed = model, 0

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def new_cache(self, batch, capacity):  # type: ignore[no-untyped-def]
        return self.model.new_cache(batch, capacity)

    def forward(self, tokens, cache):  # type: ignore[no-untyped-def]
        self.fed += int(tokens.size)
        return self.model.forward(tokens, cache)


def _models() -> tuple[NGramModel, NGramModel]:
    target = random_ngram(5, order=2, seed=4, concentration=0.6, zeros=0.2)
    return target, random_ngram(5, order=2, seed=5, concentration=0.6, zeros=0.2)


def _prompt(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = row
    return tokens, np.array([len(r) for r in rows], dtype=np.int64)


def _greedy_is_plain(target: NGramModel, drafter: HybridDrafter) -> None:
    """Greedy speculative output equals plain greedy decoding on 3 ragged prompts."""
    prompt, lengths = _prompt([[1, 2, 3, 1, 2], [4], [0, 1, 0, 1, 0, 1, 2]])
    params = SamplingParams(temperature=0.0)
    out = generate(target, drafter, prompt, prompt_lengths=lengths, max_new_tokens=30, params=params, k=3)
    plain = generate_plain(target, prompt, prompt_lengths=lengths, max_new_tokens=30, params=params)
    assert [out.new_tokens(i) for i in range(3)] == [plain.new_tokens(i) for i in range(3)]


@pytest.mark.parametrize("name", ["hybrid", "hybrid@0.4", "hybrid:noisy:0.2@0.6"])
def test_greedy_equals_plain_greedy(name: str) -> None:
    target, _ = _models()
    drafter = get_backend("reference").load_drafter(name, target)
    assert isinstance(drafter, HybridDrafter)
    _greedy_is_plain(target, drafter)


def test_matching_rows_copy_the_others_draft_from_the_model() -> None:
    _, draft = _models()
    hybrid = HybridDrafter(ModelDrafter(draft))
    tokens, lengths = _prompt([[1, 2, 3, 4, 2, 3], [1, 2, 3, 4, 0, 1]])  # row 0 ends in a seen bigram
    state = hybrid.start(tokens, lengths, CAPACITY)
    u = uniforms(0, 0, 2, 3, like=tokens)
    proposal = hybrid.propose(state, np.pad(tokens, ((0, 0), (0, 10))), lengths, 3, SamplingParams(), u)
    copied = PromptLookupDrafter().propose(None, np.pad(tokens, ((0, 0), (0, 10))), lengths, 3,
                                           SamplingParams(), u)
    assert proposal.tokens[0].tolist() == copied.tokens[0].tolist() == [4, 2, 3]
    assert proposal.probs is not None and (proposal.probs[0].max(axis=-1) == 1).all()  # one-hot q
    np.testing.assert_allclose(proposal.probs[1].sum(axis=-1), 1)
    assert proposal.probs[1].max() < 1  # row 1's q is the model's law
    assert proposal.lengths is not None and proposal.lengths.tolist() == [3, 3]


class Recording(HybridDrafter):
    """A HybridDrafter that keeps its last proposal."""

    def propose(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.last = super().propose(*args, **kwargs)
        return self.last


def test_a_round_where_every_row_copies_skips_the_model_and_the_cache_catches_up() -> None:
    """A repetitive prompt makes every row copy for a while; the model is then not run at all
    (nor prefilled at the start), and when it drafts its laws equal those of a draft model
    prefilled afresh on the committed tokens (its cache caught up exactly, in one wider
    forward)."""
    target, draft = _models()
    counting = Counting(draft)
    hybrid = Recording(ModelDrafter(counting))  # type: ignore[arg-type]
    prompt, lengths = _prompt([[1, 2, 3, 4] * 4, [2, 3, 4, 1] * 4])
    state = start(target, hybrid, prompt, lengths, capacity=CAPACITY, stop_lengths=lengths + 40)
    params, skipped, caught_up = SamplingParams(temperature=0.0), 0, 0
    assert isinstance(hybrid, SkippingDrafter)  # it may sit out a round: a plain step first
    state, _ = round_step(state, target, hybrid, k=0, params=params,
                          uniforms=round_uniforms(0, 99, 2, 0, like=prompt))
    assert counting.fed == 0  # no prefill: the model reads the prompt when it first drafts
    for index in range(30):
        if state.done.all():
            break
        before, tokens, current = counting.fed, state.tokens, state.lengths
        copy = PromptLookupDrafter().draft_lengths(tokens, current, 3) == 3
        behind = int((current - state.draft_state.seen).max())
        u = round_uniforms(0, index, 2, 3, like=tokens)
        state, _ = round_step(state, target, hybrid, k=3, params=params, uniforms=u)
        if copy.all():
            assert counting.fed == before, "a round where every row copies ran the model"
            skipped += 1
        elif behind > 2:  # the model drafted after falling behind: compare with a fresh prefill
            fresh = ModelDrafter(draft)
            theirs = fresh.propose(fresh.start(tokens, current, CAPACITY), tokens, current, 3, params,
                                   u[:, :3])
            rows = ~copy
            np.testing.assert_array_equal(hybrid.last.tokens[rows], theirs.tokens[rows])
            np.testing.assert_allclose(hybrid.last.probs[rows], theirs.probs[rows])
            caught_up += 1
    assert skipped >= 1 and caught_up >= 1, (skipped, caught_up)


def test_names_and_their_errors() -> None:
    target, _ = _models()
    backend = get_backend("reference")
    sure = backend.load_drafter("noisy:0.3@0.25", target)
    assert isinstance(sure, ModelDrafter) and sure.threshold == 0.25
    assert isinstance(backend.load_drafter("lookup", target), PromptLookupDrafter)
    with pytest.raises(ValueError, match="threshold: expected a number in \\(0, 1\\) after '@'"):
        backend.load_drafter("noisy:0.3@1.5", target)
    with pytest.raises(ValueError, match="draft: expected NAME@THRESHOLD with a number after '@'"):
        backend.load_drafter("noisy:0.3@high", target)
    with pytest.raises(ValueError, match=r"draft: 'lookup@0\.4' needs a model draft for 'lookup'"):
        backend.load_drafter("lookup@0.4", target)
    with pytest.raises(ValueError, match="draft: 'hybrid:lookup' needs a model draft"):
        backend.load_drafter("hybrid:lookup", target)
    with pytest.raises(TypeError, match="draft: expected a name"):
        compose_drafter(3, lambda n: PromptLookupDrafter(), default_model="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model: expected a ModelDrafter, got PromptLookupDrafter"):
        HybridDrafter(PromptLookupDrafter())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lookup: expected a PromptLookupDrafter with confident set"):
        HybridDrafter(ModelDrafter(target), PromptLookupDrafter(confident=None))


# ---------------------------------------------------------------- auto: the gated hybrid

class Lengths(HybridDrafter):
    """A gated HybridDrafter that records each round's per-row lengths, copy flags and which
    rows drafted from the model."""

    rounds: list[tuple[list[int], list[bool]]]
    modelled: list[list[bool]]

    def propose(self, state, tokens, lengths, k, params, uniforms):  # type: ignore[no-untyped-def]
        out = super().propose(state, tokens, lengths, k, params, uniforms)
        copy = (self.lookup.draft_lengths(tokens, lengths, k) == k).tolist()
        kept = [k] * len(copy) if out.lengths is None else out.lengths.tolist()
        self.rounds.append((kept, copy))
        self.modelled.append(out.state.modelled.tolist())
        return out


def _gated(cost: float, prior: float, weight: float, counting: Counting) -> Lengths:
    drafter = Lengths(ModelDrafter(counting),  # type: ignore[arg-type]
                      scheduler=Scheduler(cost_ratio=cost, prior=Prior(prior, weight)))
    drafter.rounds, drafter.modelled = [], []
    return drafter


def test_a_row_drafts_from_the_model_only_while_thm_3_8_predicts_a_speedup() -> None:
    """c = 0.3: at the prior alpha 0.9 the model is worth it (Thm 3.8: 1.81x at K = 3); a draft
    far from the target is rejected often, and each row then turns to plain steps on its own
    evidence.
    A prohibitive c never runs the model; c = 0 always does (the plain hybrid)."""
    target, _ = _models()
    far = random_ngram(5, order=2, seed=99, concentration=0.3)  # disagrees with the target
    prompt, lengths = _prompt([[1, 2, 3, 4, 0], [4, 3], [0, 4, 1, 2, 3, 2]])
    params = SamplingParams(temperature=1.0)
    run = dict(prompt_lengths=lengths, max_new_tokens=60, params=params, k=3, seed=2)

    counting = Counting(far)
    gated = _gated(0.3, 0.9, 1.0, counting)
    generate(target, gated, prompt, **run)  # type: ignore[arg-type]
    modelled = gated.modelled
    assert any(modelled[0]), "at the prior the model is worth drafting"
    late = modelled[len(modelled) // 2:]
    assert not any(any(r) for r in late), "rows with poor acceptance must have turned to plain steps"

    never = _gated(1e3, 0.9, 1.0, Counting(far))
    generate(target, never, prompt, **run)  # type: ignore[arg-type]
    assert never.model.model.fed == 0, "the model never runs, not even its prefill"
    for kept, copy in never.rounds:  # prompt lookup's own lengths: 1 after a short match, else 0
        assert all(n in (0, 1) for n, c in zip(kept, copy, strict=True) if not c)
    fresh = np.array([[0, 1, 2, 3, 4]])  # its last token occurred nowhere before: no match
    k_counts = generate(target, _gated(1e3, 0.9, 1.0, Counting(far)), fresh, max_new_tokens=4,  # type: ignore[arg-type]
                        params=params, k=3, seed=2).metrics.k_counts
    assert k_counts[0] > 0, "a round where nothing matches is a plain step (K = 0)"

    always = _gated(0.0, 0.9, 1.0, Counting(far))
    generate(target, always, prompt, **run)  # type: ignore[arg-type]
    for kept, _ in always.rounds:
        assert all(n == 3 for n in kept), "c = 0: every row drafts (copies or the model)"


def test_auto_by_name_measures_c_and_keeps_greedy_output() -> None:
    target, _ = _models()
    auto = get_backend("reference").load_drafter("auto", target)
    assert isinstance(auto, HybridDrafter) and isinstance(auto.scheduler, Scheduler)
    assert auto.scheduler.cost_ratio >= 0
    assert "Thm 3.8" in auto.describe(4) and f"c = {auto.scheduler.cost_ratio:.2f}" in auto.describe(4)
    _greedy_is_plain(target, auto)


def test_gate_arguments_are_checked() -> None:
    target, _ = _models()
    with pytest.raises(ValueError, match="cost_ratio: expected a finite number >= 0, got -1"):
        Scheduler(cost_ratio=-1)
    with pytest.raises(ValueError, match=r"prior: expected a rate in \[0, 1\] and a weight >= 0, got 1.5"):
        Scheduler(cost_ratio=0.5, prior=Prior(1.5, 8.0))
    with pytest.raises(TypeError, match="scheduler: expected None or a Gate"):
        HybridDrafter(ModelDrafter(target), scheduler=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draft: 'auto' needs a backend that measures the draft's cost"):
        compose_drafter("auto", lambda n: ModelDrafter(target), default_model="x")
    with pytest.raises(ValueError, match="draft: 'auto:lookup' needs a model draft for 'lookup'"):
        get_backend("reference").load_drafter("auto:lookup", target)


def _widths(drafter: HybridDrafter, rows: list[list[int]],
            **run: object) -> tuple[list[int], list[list[int]]]:
    """The K of every round and each row's greedy tokens."""
    target, _ = _models()
    prompt, lengths = _prompt(rows)
    from specsample.engine.generate import iterate

    ks, out = [], None
    for step in iterate(target, drafter, prompt, prompt_lengths=lengths, max_new_tokens=40,
                        params=SamplingParams(temperature=0.0), k=3, **run):  # type: ignore[arg-type]
        ks.append(step.k)
        out = step
    assert out is not None
    new = [out.state.tokens[b, int(lengths[b]):int(out.state.lengths[b])].tolist() for b in range(len(rows))]
    return ks, new


def test_a_batch_round_narrows_where_its_width_costs_more_than_it_gains() -> None:
    """`width_cost` (the auto drafter's, measured by the backend): a free width leaves the
    rounds as they were; a prohibitive one turns every round into a plain step, of a batch
    or of a single row, and greedy output stays plain decoding's."""
    target, _ = _models()
    rows = [[1, 2, 3, 1, 2], [4], [0, 1, 0, 1, 0, 1, 2]]

    def auto(width_cost: object) -> HybridDrafter:
        return HybridDrafter(ModelDrafter(target),
                             scheduler=Scheduler(cost_ratio=1e3, width_cost=width_cost))  # type: ignore[arg-type]

    free_ks, free = _widths(auto(lambda b, w: 1.0), rows)
    base_ks, base = _widths(HybridDrafter(ModelDrafter(target), scheduler=Scheduler(cost_ratio=1e3)), rows)
    assert (free_ks, free) == (base_ks, base) and max(base_ks) == 3

    asked: list[tuple[int, int]] = []
    costly_ks, costly = _widths(auto(lambda b, w: asked.append((b, w)) or 50.0), rows)
    assert set(costly_ks) == {0} and costly == base
    # Rounds ask at the batch's size; the model's gate asks once for one draft at batch 1.
    assert asked and all((b, w) == (1, 2) or (b == 3 and w in (2, 3, 4)) for b, w in asked)

    alone_ks, alone = _widths(auto(lambda b, w: 50.0), rows[:1])
    base_alone_ks, base_alone = _widths(
        HybridDrafter(ModelDrafter(target), scheduler=Scheduler(cost_ratio=1e3)), rows[:1])
    assert set(alone_ks) == {0} and max(base_alone_ks) == 3 and alone == base_alone
    free_alone_ks, _ = _widths(auto(lambda b, w: 1.0), rows[:1])
    assert free_alone_ks == base_alone_ks
    with pytest.raises(TypeError, match="width_cost: expected None or a function"):
        Scheduler(cost_ratio=0.5, width_cost=3)  # type: ignore[arg-type]


def test_draft_plan_says_what_propose_drafts() -> None:
    """Before the round, `draft_plan` gives each row's length and whether it copies, as
    `propose` then drafts them: a row ending in a seen bigram copies K, one ending in a seen
    token only copies 1 when the model is gated off for it, and a row without a match
    drafts K from the model where its own acceptance clears the break-even, else nothing."""
    _, draft = _models()
    rows = [[1, 2, 3, 4, 2, 3], [1, 2, 3, 4, 0, 1], [0, 1, 2, 3, 4, 2], [4, 3]]
    tokens, lengths = _prompt(rows)
    tokens = np.pad(tokens, ((0, 0), (0, 10)))
    for cost_ratio, prior in ((0.05, 0.8), (0.05, 0.1), (0.9, 0.8)):
        hybrid = HybridDrafter(ModelDrafter(draft), scheduler=Scheduler(
            cost_ratio=cost_ratio, prior=Prior(prior, 8.0), width_cost=lambda b, w: 1.0 + 0.05 * (w - 1)))
        state = hybrid.start(tokens, lengths, CAPACITY)
        planned, copies = hybrid.draft_plan(state, tokens, lengths, 3)
        u = uniforms(0, 0, 4, 3, like=tokens)
        proposal = hybrid.propose(state, tokens, lengths, 3, SamplingParams(), u)
        drafted = proposal.lengths if proposal.lengths is not None else np.full(4, 3)
        assert planned.tolist() == drafted.tolist(), (cost_ratio, prior)
        modelled = proposal.probs is not None and np.asarray(
            (proposal.probs.max(axis=-1) < 1).any(axis=-1))
        gated_on = prior > cost_ratio + 0.05
        assert copies.tolist() == [True, not gated_on, not gated_on, False], (cost_ratio, prior)
        assert planned.tolist() == [3, 3 if gated_on else 1, 3 if gated_on else 1, 3 if gated_on else 0]
        if gated_on:  # the model's q is not one-hot on the rows it drafts for
            assert modelled.tolist() == [False, True, True, True]


def test_a_copying_round_is_rated_without_the_models_cost_and_filed_as_a_copy() -> None:
    """The auto hybrid's first round on a prompt that repeats copies: it is not charged the
    model's drafts (3 c = 1.5 plain steps would make it lose to a plain step), and its
    acceptance is filed with the copies (`Metrics.copied_trials_at`), apart from the
    model's drafts of the same length."""
    target, draft = _models()
    from specsample.engine.generate import iterate

    prompt, lengths = _prompt([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
    gate = Scheduler(cost_ratio=0.5, width_cost=lambda b, w: 1.0 + 0.1 * (w - 1))
    hybrid = HybridDrafter(ModelDrafter(draft), scheduler=gate)
    assert not hybrid._never(3)  # the model may run: 0.8 > 0.5 + 0.1
    said = hybrid.describe(3)
    assert "(c = 0.50, cost 1.10: 0.60)" in said and "start with the draft model" in said
    steps = list(iterate(target, hybrid, prompt, prompt_lengths=lengths, max_new_tokens=30,
                         params=SamplingParams(temperature=0.0), k=3))
    first = steps[0].metrics
    assert steps[0].k >= 1 and sum(first.copied_trials_at) >= 1 and first.trials_at == ()
    # Negative control: charged the model's drafts, the same round rates below a plain step.
    from specsample.engine.ratings import batch_width
    from specsample.engine.scheduler import WIDTH_PRIOR

    assert batch_width([3], [30], 1, WIDTH_PRIOR.alpha, gate.round_cost) == 0
    assert batch_width([3], [30], 1, WIDTH_PRIOR.alpha,
                       lambda b, w: gate.round_cost(b, w, modelled=False)) == steps[0].k
    plain = generate_plain(target, prompt, prompt_lengths=lengths, max_new_tokens=30,
                           params=SamplingParams(temperature=0.0))
    assert steps[-1].state.tokens[0, 10:40].tolist() == plain.new_tokens(0)
