"""proofs/exact/check.py: the implementation's verify realises the proved law, exactly."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from specsample.testing import broken

_PATH = pathlib.Path(__file__).resolve().parents[1] / "proofs" / "exact" / "check.py"
_spec = importlib.util.spec_from_file_location("proofs_exact_check", _PATH)
assert _spec is not None and _spec.loader is not None
checker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checker)


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
