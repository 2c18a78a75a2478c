"""Verification rules by name: "token" (Leviathan et al. 2023) and "block" (Sun et al. 2025)."""

from __future__ import annotations

from collections.abc import Callable

from specsample.core.verify import Verdict, verify
from specsample.core.verify_block import verify_block
from specsample.core.verify_tree import TreeVerdict, verify_tree

__all__ = ["TREE_RULES", "VERIFIERS", "Verifier", "get_verifier", "register_tree_rule", "tree_rule"]

# Every verifier takes (draft_tokens [B, K], draft_probs [B, K, V] | None,
# target_probs [B, K+1, V], uniforms [B, K+1], *, check) and returns a Verdict.
Verifier = Callable[..., Verdict]

VERIFIERS: dict[str, Verifier] = {"token": verify, "block": verify_block}
# Tree rules besides `verify_tree` that a run may name as its verifier (`register_tree_rule`).
TREE_RULES: dict[str, Callable[..., TreeVerdict]] = {}


def get_verifier(name_or_callable: str | Verifier) -> Verifier:
    """The verifier called `name_or_callable` in `VERIFIERS`, or the callable itself.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
        TypeError: neither a str nor a callable.
    """
    if isinstance(name_or_callable, str):
        if name_or_callable not in VERIFIERS:
            raise ValueError(f"verifier: unknown name {name_or_callable!r}; known: "
                             f"{', '.join(sorted(VERIFIERS))}")
        return VERIFIERS[name_or_callable]
    if callable(name_or_callable):
        return name_or_callable
    raise TypeError(f"verifier: expected a name ({', '.join(sorted(VERIFIERS))}) or a callable, "
                    f"got {type(name_or_callable).__name__}")


def register_tree_rule(name: str, rule: Callable[..., TreeVerdict]) -> None:
    """Let `tree_rule` hand back `rule`, a tree rule other than `verify_tree` (same inputs and
    Verdict), when a run names it as its verifier: e.g. the deliberately broken rules that
    `specsample.testing.broken` registers as negative controls, or a user's own rule under
    test. A name registered again must name the same rule."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty str, got {name!r}")
    if not callable(rule):
        raise TypeError(f"rule: expected a callable tree rule, got {type(rule).__name__}")
    if TREE_RULES.get(name, rule) is not rule:
        raise ValueError(f"name: {name!r} is registered for another tree rule")
    TREE_RULES[name] = rule


def tree_rule(verifier: object) -> Callable[..., TreeVerdict]:
    """The tree rule for a run whose `verifier` is `verifier`: `verify_tree` for the chain
    rules ("token", "block", by name or as `VERIFIERS` holds them: a tree has one rule), or a
    tree rule registered by `register_tree_rule`, given as itself."""
    if (isinstance(verifier, str) and verifier in VERIFIERS) or verifier is verify_tree or \
            any(verifier is rule for rule in VERIFIERS.values()):
        return verify_tree
    if any(verifier is rule for rule in TREE_RULES.values()):
        return verifier  # type: ignore[return-value]
    raise ValueError(f"verifier: a tree drafter is verified by the tree rule (verify_tree); got "
                     f"the chain rule {verifier!r}")
