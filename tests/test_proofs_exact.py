"""proofs/exact/check.py and tree.py: the implementation's verify, verify_block and verify_tree
realise the proved law, exactly."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

from specsample import verify, verify_block
from specsample.testing import broken

_DIR = pathlib.Path(__file__).resolve().parents[1] / "proofs" / "exact"


def _load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(f"proofs_exact_{name}", _DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checker = _load("check")
tree_checker = _load("tree")


@pytest.mark.parametrize("case", checker.CASES, ids=str)
def test_the_implementation_emits_the_target_law_exactly(case):
    # Context-dependent (order 1-2) n-gram target and draft, V <= 4, K <= 3, the first
    # 3-5 emitted tokens (so across at least two rounds), stochastic and argmax drafts.
    assert checker.check(*case)


@pytest.mark.parametrize("name", ["resample-from-p", "always-accept", "bonus-wrong-position",
                                  "p-shifted", "lenient-0.5"])
def test_broken_variants_fail_the_exact_check(name):
    assert not checker.check(3, 2, 2, 3, False, verifier=broken.VERIFIERS[name])


def test_never_accept_is_exact():
    assert checker.check(3, 2, 2, 3, False, verifier=broken.never_accept)


# --- block verification: the implementation's verify_block, exactly ---------------------------

@pytest.mark.parametrize("case", checker.CASES, ids=str)
def test_verify_block_emits_the_target_law_exactly(case):
    assert checker.check(*case, verifier=verify_block, cuts=checker.block_cuts)


@pytest.mark.parametrize("length", [0, 1, 2])
def test_verify_block_with_draft_lengths_is_exact(length):
    def cut(drafts, q, p, u):
        return verify_block(drafts, q, p, u, draft_lengths=np.full(len(drafts), length))

    assert checker.check(3, 2, 3, 4, False, verifier=cut, cuts=checker.first(length, checker.block_cuts))


@pytest.mark.parametrize(("name", "cuts"), [
    ("block-without-correction", checker.block_cuts),
    ("block-q-one", checker.union(checker.block_cuts, checker.one_hot_cuts(checker.block_cuts))),
])
def test_broken_block_rules_fail_the_exact_check(name, cuts):
    # Two small cases suffice for a control (the V=4, K=3 case costs a minute and adds no bite).
    for case in [(3, 2, 2, 3, False), (2, 2, 2, 3, False)]:
        assert not checker.check(*case, verifier=broken.VERIFIERS[name], cuts=cuts), case


def test_one_hot_rule_on_sampled_drafts_is_exact():
    # Treating the sampled drafts as deterministic (draft_probs=None) is exact: the drafts are
    # independent of the verification uniforms. Only mixing q = 1 into the weights breaks the law.
    def one_hot(drafts, q, p, u):
        return verify_block(drafts, None, p, u)

    assert checker.check(3, 2, 2, 3, False, verifier=one_hot, cuts=checker.one_hot_cuts(checker.block_cuts))


@pytest.mark.parametrize("case", checker.CASES, ids=str)
def test_verify_block_accepts_at_least_as_many_drafts_as_verify(case):
    # The exact E[accepted drafts] of the first round, as each implementation emits it. Equal at
    # K = 1 and for one-hot (deterministic) drafts, where p_i is the token-wise product.
    vocab, order, k, _, det = case
    token = checker.expected_accepted(vocab, order, k, det, verifier=verify, cuts=checker.token_cuts)
    block = checker.expected_accepted(vocab, order, k, det, verifier=verify_block, cuts=checker.block_cuts)
    if k == 1 or det:
        assert block == token
    else:
        assert block > token


# --- per-row draft length from the draft's own confidence (a stopping time) -------------------

@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("case", [(3, 2, 2, 3, False), (3, 2, 3, 5, False)], ids=str)
def test_a_confidence_threshold_is_exact(case, rule):
    # The implementation's `confidence_lengths` decides each row's length from the drafts'
    # probabilities; at THRESHOLD the paths of these cases stop after 1, 2 or 3 drafts.
    _, cuts = checker.RULES[f"{rule}, confidence threshold"]
    lengths = []

    def recorded(drafts, q, p):
        out = checker.confidence_rule(checker.THRESHOLD)(drafts, q, p)
        lengths.extend(out.tolist())
        return out

    plain = verify if rule == "token" else verify_block
    assert checker.check(*case, verifier=checker.stopping(recorded, plain), cuts=cuts)
    assert len(set(lengths)) == case[2], "every length 1..K must occur for the check to bite"


@pytest.mark.parametrize("rule", [checker.dropping_rule(checker.THRESHOLD), checker.peeking_rule],
                         ids=["drops-the-low-draft", "peeks-at-the-target"])
def test_thresholds_that_drop_or_peek_fail_the_exact_check(rule):
    assert not checker.check(3, 2, 2, 3, False, verifier=checker.stopping(rule))


# --- tree verification: the implementation's verify_tree, exactly ------------------------------

@pytest.mark.parametrize("case", tree_checker.CASES, ids=str)
def test_verify_tree_emits_the_target_law_exactly(case):
    # Trees of depth <= 3 and branching <= 2 over V <= 4, composed over at least two rounds:
    # stochastic siblings drawn i.i.d. from q, and deterministic top-ranked candidates.
    assert tree_checker.check(*case)


# Two small cases of each kind suffice for a control (every case fails; the larger ones add time,
# not bite).
_STOCHASTIC = [case for case in tree_checker.CASES if not case[4]][:2]
_DETERMINISTIC = [case for case in tree_checker.CASES if case[4]][:2]


@pytest.mark.parametrize("name", sorted(broken.TREE_VERIFIERS))
def test_broken_tree_rules_fail_the_exact_check(name):
    for case in _STOCHASTIC:
        assert not tree_checker.check(*case, verifier=broken.TREE_VERIFIERS[name]), case


def test_a_residual_that_keeps_rejected_mass_also_fails_for_deterministic_candidates():
    for case in _DETERMINISTIC:
        assert not tree_checker.check(*case, verifier=broken.tree_without_residual), case


def test_one_hot_rule_on_sampled_trees_is_exact():
    # As for chains: candidates independent of the uniforms may be treated as deterministic
    # (draft_probs=None); only mixing q = 1 into the ratio while subtracting q breaks the law.
    for case in _STOCHASTIC:
        assert tree_checker.check(*case, one_hot=True), case


# --- trees grown by the draft's confidence: the implementation's grow_tree and verify_tree ------

@pytest.mark.parametrize("case", tree_checker.GROWN_CASES, ids=str)
def test_trees_grown_by_the_drafts_confidence_keep_the_target_law_exactly(case):
    # Each round's tree is grow_tree's on the draft's laws after that round's context (its
    # shape changes with the context), over at least two rounds.
    assert tree_checker.check_grown(*case)


@pytest.mark.parametrize("case", tree_checker.GROWN_CASES, ids=str)
def test_a_grown_tree_that_peeks_at_the_target_fails_the_exact_check(case):
    # The negative control: the token the target will draw with the final uniform goes first
    # below the root. Cutting the final uniform at the target's CDF without changing the tree
    # is exact, so the failure is the peek's.
    assert not tree_checker.check_grown(*case, peek=True)
    assert tree_checker.check_grown(*case, peek=False)


@pytest.mark.parametrize("case", tree_checker.RATED_CASES, ids=str)
def test_trees_sized_by_a_rated_budget_keep_the_target_law_and_a_peeking_one_does_not(case):
    # The budget stops growing and keeps the node count its rating prefers after each
    # context, none after some (a plain step); the same peek control must fail.
    assert tree_checker.check_grown(*case, budget=tree_checker.RATED)
    assert not tree_checker.check_grown(*case, budget=tree_checker.RATED, peek=True)


def test_a_rated_budget_keeps_trees_of_several_sizes_and_none_after_some_contexts():
    import itertools

    sizes, shapes = set(), set()
    for nodes, depth, branch, vocab, order, _ in tree_checker.RATED_CASES:
        _, q = tree_checker.models(vocab, order)
        grow = tree_checker.grown(q, nodes=nodes, depth=depth, branch=branch, budget=tree_checker.RATED)
        for context in itertools.product(range(vocab), repeat=3):
            tokens, parents, _ = grow(context)[0]
            sizes.add(len(tokens))
            shapes.add(parents)
    assert 0 in sizes and len(sizes - {0}) >= 2 and len(shapes) >= 5, (sizes, shapes)


def test_grown_trees_change_shape_with_the_context():
    import itertools

    _, q = tree_checker.models(4, 2)
    grow = tree_checker.grown(q, nodes=4, depth=3, branch=2)
    shapes = {grow(context)[0][1] for context in itertools.product(range(4), repeat=2)}
    assert len(shapes) > 1, shapes
