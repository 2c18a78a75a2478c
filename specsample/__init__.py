"""specsample: speculative sampling whose output is exactly the target's law.

The core is pure functions over NumPy, torch or JAX arrays (through the array
API): `warp`, `sample`, `verify`, caches, one `round_step`, and the `generate`
loop. Backends are chosen by name: `load(Config(backend=...))` gives a `Runner`
whose `generate` runs on that backend's own engine.
Notation: p is the target's law, q the draft's (Leviathan et al. 2023).
"""

from specsample.backend import Backend, CoreBackend, Tokenizer
from specsample.cache import Cache, ConsumedCacheError, commit, rollback
from specsample.config import Config
from specsample.drafters import ModelDrafter
from specsample.generate import Generation, generate, generate_plain, iterate
from specsample.metrics import Metrics, expected_tokens_per_round, predicted_speedup
from specsample.options import RunOptions
from specsample.params import SamplingParams
from specsample.policy import AdaptiveK, ConstantK, KPolicy
from specsample.protocols import Drafter, Model, Proposal
from specsample.registry import available, get_backend
from specsample.rng import uniforms
from specsample.round import RoundResult, State, round_step, start
from specsample.runner import Runner, load
from specsample.sample import sample
from specsample.verifiers import get_verifier
from specsample.verify import Verdict, verify
from specsample.verify_block import verify_block
from specsample.verify_tree import TreeVerdict, verify_tree
from specsample.warp import warp

__version__ = "0.1.0"

__all__ = [
    "AdaptiveK",
    "Backend",
    "Cache",
    "Config",
    "ConstantK",
    "ConsumedCacheError",
    "CoreBackend",
    "Drafter",
    "Generation",
    "KPolicy",
    "Metrics",
    "Model",
    "ModelDrafter",
    "Proposal",
    "RoundResult",
    "RunOptions",
    "Runner",
    "SamplingParams",
    "State",
    "Tokenizer",
    "TreeVerdict",
    "Verdict",
    "available",
    "commit",
    "expected_tokens_per_round",
    "generate",
    "generate_plain",
    "get_backend",
    "get_verifier",
    "iterate",
    "load",
    "predicted_speedup",
    "rollback",
    "round_step",
    "sample",
    "start",
    "uniforms",
    "verify",
    "verify_block",
    "verify_tree",
    "warp",
]
