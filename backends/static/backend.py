"""The backend object of the static engine, shared by static-cpu, cuda and gaudi."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from specsample_backends.torch import DEFAULT_TARGET, loading
from specsample_backends.torch._fast import ARCHITECTURES
from specsample_backends.torch.dtypes import DTYPES, dtype_option
from specsample_backends.torch.head import HeadModel
from specsample_backends.torch.model import HFModel
from torch import Tensor, nn

from specsample.api.backend import CoreBackend
from specsample.core.protocols import Drafter, Model, StatefulTreeDrafter, TreeDrafter
from specsample.drafters.model import ModelDrafter
from specsample.engine.options import RunOptions
from specsample.engine.runs import Generation, Step, finish, prepare_prompt

from .engine import Capture, Engine, EngineOptions, static_stack
from .pieces import RULES
from .steps import HeadLinears

__all__ = ["DTYPES", "CompileCapture", "ReplayCapture", "StaticBackend", "create_cpu", "engine_options",
           "static_inputs"]

DEFAULT_DRAFT = "int8"  # the graphs draft from a model every round
OPTIONS = ("buckets", "dtype", "sync_every", "ks", "prefill_chunk", "strict", "pieces", "cpp_wrapper",
           "compiler")
COMPILERS = ("inductor", "aot_eager")


class CompileCapture:
    """`torch.compile(dynamic=False, fullgraph=True)`; after a step's first call, a recompile is an error.

    Args:
        backend: the torch.compile backend ("inductor"; "aot_eager" for fast tests).
        mode: the torch.compile mode (None; "reduce-overhead" gives CUDA graphs).
        strict: run warm steps under `set_stance("fail_on_recompile")`.
        pieces: compile small pieces (one decoder layer, shared by every layer; the
            head; warp and verify) and loop in Python, rather than the whole round as
            one graph (~150 unrolled layers for a 30-layer target: a cold compile of
            many minutes on CPU).
        cpp_wrapper: inductor's C++ wrapper (one C++ file per graph). It saves a
            little per call but makes a cold compile of a big graph far slower.
    """

    def __init__(self, *, backend: str = "inductor", mode: str | None = None, strict: bool = True,
                 pieces: bool = True, cpp_wrapper: bool = False) -> None:
        self.backend, self.mode, self.strict = backend, mode, strict
        self.pieces, self.cpp_wrapper = pieces, cpp_wrapper

    def capture(self, module: nn.Module, example: Sequence[Tensor]) -> Callable[..., Any]:
        """The compiled module; its first call compiles (warm-up)."""
        inductor = self.backend == "inductor" and self.mode is None
        options: dict[str, Any] | None = {"cpp_wrapper": True} if inductor and self.cpp_wrapper \
            else None
        compiled = torch.compile(module, backend=self.backend, mode=self.mode, dynamic=False,
                                 fullgraph=True, options=options)
        calls = [0]

        def run(*args: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1 or not self.strict:
                # One code object serves every (shape, bucket, K): raise Dynamo's per-code limit.
                with torch._dynamo.config.patch(recompile_limit=256):
                    return compiled(*args)
            with torch.compiler.set_stance("fail_on_recompile"):
                return compiled(*args)

        return run

    def boundary(self) -> None:
        """Nothing to do between rounds."""


Recorder = Callable[[nn.Module, tuple[Tensor, ...]], Callable[[], Any]]


class ReplayCapture:
    """Graph-replay semantics (CUDA graphs): a step is recorded once over fixed input buffers,
    and each call copies its arguments into those buffers and replays, returning the same
    output tensors every time (the engine clones what it keeps).

    Inputs that share memory in `example` (one tensor passed twice, or two views of one
    storage) get buffers of their own: a replay copies its arguments in turn, so aliased
    buffers would hand the graph the last argument in every aliased place. Arguments that
    are the buffers themselves are not copied.

    Args:
        record: (module, buffers) -> a function that replays the module over the buffers and
            returns its fixed outputs (the cuda backend records a CUDA graph). By default the
            module runs eagerly at each call, its results copied into the first call's
            outputs: the same contract on any device, which is how the CPU tests hold the
            engine to it.
    """

    pieces = False

    def __init__(self, record: Recorder | None = None) -> None:
        if record is not None and not callable(record):
            raise TypeError(f"record: expected a function (module, buffers) -> replay, got "
                            f"{type(record).__name__}")
        self.record: Recorder = record or record_eagerly

    def capture(self, module: nn.Module, example: Sequence[Tensor]) -> Callable[..., Any]:
        """The replayer of `module` recorded over its own input buffers."""
        buffers = static_inputs(example)
        run = self.record(module, buffers)

        def replay(*args: Tensor) -> Any:
            if len(args) != len(buffers):
                raise ValueError(f"args: expected {len(buffers)} inputs, as captured, got {len(args)}")
            for dst, src in zip(buffers, args, strict=True):
                if dst is not src:
                    dst.copy_(src)
            return run()

        return replay

    def boundary(self) -> None:
        """Nothing to do between rounds."""


def record_eagerly(module: nn.Module, buffers: tuple[Tensor, ...]) -> Callable[[], Any]:
    """A function that runs `module` over `buffers` and returns its (fixed) outputs. The
    first run, which makes the outputs, leaves the module's state as it found it (as a
    CUDA graph's recording, which runs nothing)."""
    out = state_kept(module, lambda: module(*buffers))

    def run() -> Any:
        fresh = module(*buffers)
        for dst, src in zip(_flat(out), _flat(fresh), strict=True):
            dst.copy_(src)
        return out

    return run


def state_kept(module: nn.Module, run: Callable[[], Any]) -> Any:
    """`run()`, with the step module's mutable state (`mutable()`) restored afterwards: a
    capture's warm-up calls commit nothing."""
    saved = [t.clone() for t in module.mutable()]  # type: ignore[operator]
    result = run()
    for dst, src in zip(module.mutable(), saved, strict=True):  # type: ignore[operator]
        dst.copy_(src)
    return result


def static_inputs(example: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """`example` as distinct input buffers: a tensor whose storage an earlier one already uses
    is replaced by its own copy."""
    seen: set[int] = set()
    buffers = []
    for tensor in example:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"example: expected tensors, got {type(tensor).__name__}")
        storage = tensor.untyped_storage().data_ptr()
        buffers.append(tensor.clone() if storage in seen else tensor)
        seen.add(storage)
    return tuple(buffers)


def _flat(out: Any) -> list[Tensor]:
    """The tensors of a step's output (a tensor or a tuple of tensors), in order."""
    return [out] if isinstance(out, Tensor) else [t for t in out if isinstance(t, Tensor)]


def engine_options(options: Mapping[str, object], known: Sequence[str]) -> EngineOptions:
    """EngineOptions from a backend's options mapping (unknown keys are an error)."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"options: unknown {unknown}; known: {list(known)}")
    values: dict[str, Any] = {}
    for name in ("buckets", "ks"):
        if name in options:
            raw = options[name]
            if not isinstance(raw, (list, tuple)):
                raise ValueError(f"{name}: expected a list of ints, got {raw!r}")
            values[name] = tuple(raw)
    for name in ("sync_every", "prefill_chunk"):
        if name in options:
            values[name] = options[name]
    return EngineOptions(**values)


class StaticBackend(CoreBackend):
    """Loads models like the torch backend and runs them on the static engine.

    Args:
        name: the backend's registry name.
        device: where buffers and weights live.
        dtype: the model and cache dtype.
        capture: how steps become graphs.
        options: engine options.
    """

    def __init__(self, *, name: str, device: torch.device, dtype: torch.dtype, capture: Capture,
                 options: EngineOptions) -> None:
        self.name, self.device, self.dtype = name, device, dtype
        self.capture, self.options = capture, options
        self._engines: dict[tuple[int, int], Engine] = {}

    def asarray(self, ids: Any) -> Tensor:
        """Token ids as an int64 tensor on the device."""
        return torch.as_tensor(ids, dtype=torch.int64, device=self.device)

    def load_target(self, spec: str | None = None) -> HFModel:
        """The target model ("smollm2", the default; a directory, a .gguf file); a Llama architecture."""
        return loading.load_target(spec or DEFAULT_TARGET, dtype=self.dtype, device=str(self.device))

    def load_drafter(self, name: str | None, target: HFModel) -> ModelDrafter | TreeDrafter:
        """A model drafter: "int8" (the default; compiled pieces only), "early-exit:N", a draft
        model spec or a feature-level draft head ("head[:FILE]"; compiled pieces only); or a
        tree drafter ("suffix-tree[:N[xD]]"), whose trees the engine verifies with one graph
        set per tree budget."""
        drafter = loading.load_drafter(name or DEFAULT_DRAFT, target, fan_out=False)  # a head: its chain
        if not isinstance(drafter, (ModelDrafter, TreeDrafter)):
            raise ValueError(f"name: the static engine needs a draft model ('early-exit:N', 'head' or a "
                             f"model spec) or a tree drafter ('suffix-tree'), got {name!r}")
        _models(self.name, target, drafter)
        self.engine(target, drafter)  # validates now rather than at the first round
        return drafter

    def tokenizer(self, spec: str | None = None) -> Any:
        """The tokenizer of a model spec (default: the default target's)."""
        return loading.load_tokenizer(spec or DEFAULT_TARGET)

    def default_k(self, target: Model, drafter: Drafter) -> tuple[int, str] | None:
        """As the torch backend's (`loading.rated_k`): the costs are measured on the eager
        models, which the compiled pieces run at about the same speed on CPU."""
        model, draft = _models(self.name, target, drafter)
        return None if isinstance(draft, TreeDrafter) else loading.rated_k(model, draft)

    def engine(self, target: HFModel, drafter: ModelDrafter | TreeDrafter) -> Engine:
        """The engine for (target, drafter), built once and kept (its graphs with it); a tree
        drafter's engine has no draft model (every tree drafter of a target shares it)."""
        draft = None if isinstance(drafter, TreeDrafter) else drafter.model
        key = (id(target), id(draft))
        if key not in self._engines:
            pieces = bool(getattr(self.capture, "pieces", False))
            head, stack = None, None if draft is None else _stack("drafter", draft, pieces)
            if isinstance(draft, HeadModel):  # its stack: the head's one layer over the target's
                if draft.head.fuse is not None:
                    raise ValueError(f"drafter: the static engine's graphs carry the target's top "
                                     f"feature alone, got a head that fuses layers "
                                     f"{draft.head.taps.tolist()} with it (recipe v3): run it on the torch "
                                     f"backend, or use a head without taps")
                if draft.head.layers != 1:
                    raise ValueError(f"drafter: the static engine's graphs run a one-layer head, got "
                                     f"a head of {draft.head.layers} layers: run it on the torch "
                                     f"backend")
                out, ids = draft.projection
                head = HeadLinears(fc=draft.head.fc, out=out, ids=ids)
            self._engines[key] = Engine(_stack("target", target, pieces), stack,
                                        dtype=target.dtype, device=target.device,
                                        capture=self.capture, options=self.options, head=head)
            if draft is not None and self._engines[key].vocab != draft.vocab_size:
                raise ValueError(f"drafter: expected the target's vocabulary "
                                 f"{self._engines[key].vocab}, got {draft.vocab_size}")
        return self._engines[key]

    def iterate(self, target: Model, drafter: Drafter, input_ids: Any,
                run: RunOptions) -> Iterator[Step]:
        """Rounds on the static engine, as core `Step`s (one per round, or per host sync).

        Every RunOptions field runs as in the core loop except `verifier`, which must
        name a compiled rule ("token" or "block", not a callable), and `check` (inputs
        are validated once, before the graphs, whatever its value). `capacity` is a lower
        bound on the bucket taken.
        """
        model, draft = _models(self.name, target, drafter)
        run = self._run(run)
        if run.verifier not in RULES:
            raise ValueError(f"verifier: the {self.name} backend compiles {sorted(RULES)} (by name), "
                             f"got {run.verifier!r}")
        prompt, lengths = prepare_prompt(self.asarray(input_ids), run.prompt_lengths, model.vocab_size)
        run.rows(int(prompt.shape[0]))
        engine = self.engine(model, draft)
        with torch.no_grad():
            if isinstance(draft, TreeDrafter):
                yield from engine.iterate_tree(prompt, lengths, run, draft)
            else:
                yield from engine.iterate(prompt, lengths, run, threshold=draft.threshold)

    def generate(self, target: Model, drafter: Drafter, input_ids: Any,
                 run: RunOptions) -> Generation:
        """Rounds to completion on the static engine, keeping only the last state."""
        ids = self.asarray(input_ids)
        return finish(self.iterate(target, drafter, ids, run), ids, self._run(run), target.vocab_size)


def _models(backend: str, target: Model, drafter: Drafter | TreeDrafter
            ) -> tuple[HFModel, ModelDrafter | TreeDrafter]:
    """(target, drafter) as the static engine takes them (the core types are wider)."""
    if not isinstance(target, HFModel):
        raise TypeError(f"target: the {backend} backend expected an HFModel, got {type(target).__name__}")
    if not isinstance(drafter, (ModelDrafter, TreeDrafter)):
        raise TypeError(f"drafter: the {backend} backend expected a ModelDrafter or a TreeDrafter, "
                        f"got {type(drafter).__name__}")
    if isinstance(drafter, StatefulTreeDrafter):
        raise TypeError(f"drafter: the {backend} backend's graphs take trees from a drafter without "
                        f"state (a suffix tree); a {type(drafter).__name__} drafts from its own cache "
                        f"each round: run it on the torch backend")
    return target, drafter


def _stack(name: str, model: Any, pieces: bool) -> Any:
    """The model's stack: as it is for compiled pieces (which call its linears through an
    opaque op), with plain dense linears for a whole-round capture (which traces them). A
    draft head's is its one decoder layer over the target's settings."""
    if isinstance(model, HeadModel):
        return model.stack if pieces else static_stack(model.stack)
    if not isinstance(model, HFModel) or model.stack is None:
        raise ValueError(f"{name}: the static engine needs an HFModel on the fast path (one of "
                         f"{sorted(ARCHITECTURES)}), got {type(getattr(model, 'module', model)).__name__}")
    return model.stack if pieces else static_stack(model.stack)


def create_cpu(options: Mapping[str, object]) -> StaticBackend:
    """The static engine under `torch.compile(dynamic=False)` on CPU.

    Options: buckets (default 256 ... 4096), ks, sync_every, prefill_chunk, dtype
    ("float32", "float64", "bfloat16"), strict (default True: a recompile
    after warm-up raises), pieces (default True: per-layer graphs; False: the
    whole round as one graph), cpp_wrapper (default False), compiler ("inductor",
    the default, or "aot_eager": the same graphs run with eager kernels, which
    compile in seconds rather than minutes; for debugging numerics and quick tests).
    """
    flags: dict[str, Any] = {name: options.get(name, default) for name, default in
             (("strict", True), ("pieces", True), ("cpp_wrapper", False))}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name}: expected a bool, got {value!r}")
    compiler = options.get("compiler", "inductor")
    if compiler not in COMPILERS:
        raise ValueError(f"compiler: expected one of {list(COMPILERS)}, got {compiler!r}")
    return StaticBackend(name="static-cpu", device=torch.device("cpu"),
                         dtype=dtype_option(options.get("dtype", "float32")),
                         capture=CompileCapture(backend=str(compiler), **flags),
                         options=engine_options(options, OPTIONS))
