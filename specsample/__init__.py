"""specsample: speculative sampling whose output is exactly the target's law.

The core is pure functions over NumPy arrays or torch tensors (through the
array API): `warp`, `sample`, `verify` (or `verify_block`), caches as values, one
`round_step`, and the `generate` loop. Backends are chosen by name (`Config(backend=...)`).
Notation: p is the target's law, q the draft's (Leviathan et al. 2023).
"""

from specsample.cache import Cache, commit, rollback
from specsample.config import Config
from specsample.drafters import ModelDrafter
from specsample.generate import Generation, generate, generate_plain, iterate
from specsample.metrics import Metrics, expected_tokens_per_round, predicted_speedup
from specsample.params import SamplingParams
from specsample.policy import AdaptiveK, ConstantK, KPolicy
from specsample.protocols import Drafter, Model, Proposal
from specsample.registry import available, get_backend
from specsample.rng import uniforms
from specsample.round import RoundResult, State, round_step, start
from specsample.sample import sample
from specsample.verifiers import get_verifier
from specsample.verify import Verdict, verify
from specsample.verify_block import verify_block
from specsample.warp import warp

__version__ = "0.1.0"

__all__ = [
    "AdaptiveK", "Cache", "Config", "ConstantK", "Drafter", "Generation", "KPolicy", "Metrics",
    "Model", "ModelDrafter", "Proposal", "RoundResult", "SamplingParams", "State", "Verdict",
    "available", "commit", "expected_tokens_per_round", "generate", "generate_plain",
    "get_backend", "get_verifier", "iterate", "predicted_speedup", "rollback", "round_step", "sample",
    "start", "uniforms", "verify", "verify_block", "warp",
]
