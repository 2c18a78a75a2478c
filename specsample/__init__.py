"""specsample: speculative sampling whose output is exactly the target's law.

The core is pure functions over NumPy, torch or JAX arrays (through the array
API): `warp`, `sample`, `verify`, caches, one `round_step`, and the `generate`
loop. Backends are chosen by name: `load(Config(backend=...))` gives a `Runner`
whose `generate` runs on that backend's own engine.
Notation: p is the target's law, q the draft's (Leviathan et al. 2023).

Layout (imports flow one way): `cli`, `bench`, `testing` (tools) -> `api` -> `engine`
-> `drafters` -> `core` -> `kernels`.
"""

from specsample import _moved
from specsample.api.backend import Backend, CoreBackend, Tokenizer
from specsample.api.config import Config
from specsample.api.registry import available, get_backend
from specsample.api.runner import Runner, load
from specsample.core.cache import Cache, ConsumedCacheError, commit, rollback
from specsample.core.metrics import Metrics, expected_tokens_per_round, predicted_speedup
from specsample.core.params import SamplingParams
from specsample.core.protocols import Drafter, Model, Proposal
from specsample.core.rng import uniforms
from specsample.core.sample import sample
from specsample.core.verifiers import get_verifier
from specsample.core.verify import Verdict, verify
from specsample.core.verify_block import verify_block
from specsample.core.verify_tree import TreeVerdict, verify_tree
from specsample.core.warp import warp
from specsample.drafters.model import ModelDrafter
from specsample.engine.generate import generate, generate_plain, iterate
from specsample.engine.options import RunOptions
from specsample.engine.policy import AdaptiveK, ConstantK, KPolicy
from specsample.engine.round import RoundResult, State, round_step, start
from specsample.engine.runs import Generation

__version__ = "0.1.0"

_moved.install()


def __getattr__(name: str) -> object:
    """`specsample.rng` and the other modules of the flat layout, as attributes (see `_moved`)."""
    old = f"{__name__}.{name}"
    if old in _moved.MOVED:
        import importlib

        return importlib.import_module(old)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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
