"""The static-shape engine: fixed buffers per bucket, one captured graph per (bucket, K).

Shapes never depend on data: K/V caches are allocated once per (batch,
capacity bucket) and written by position (`scatter_`, `index_put_`), attention is masked by
absolute position, the prompt is prefilled in fixed-width chunks, and a round
(K draft forwards, the target forward, warp, verify, commit) is one function
of fixed-shape tensors whose inputs are the uniforms and the sampling knobs.
How a step is captured (torch.compile, CUDA graphs, HPU graphs) is a `Capture`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from specsample_backends.torch._fast import DenseLinear, LlamaStack
from torch import Tensor, nn

from specsample.core.cache import Cache
from specsample.core.metrics import Metrics, tally
from specsample.core.params import SamplingParams
from specsample.core.protocols import TreeDrafter
from specsample.core.rng import round_uniforms
from specsample.core.verify import Verdict
from specsample.drafters.model import DraftState
from specsample.engine.options import RunOptions
from specsample.engine.round import RoundResult, State
from specsample.engine.runs import Step

from .pieces import (
    DraftSampleStep,
    EmbedStep,
    FeatureStep,
    HeadInputStep,
    HeadOutputStep,
    HeadStep,
    LayerStep,
    VerifyStep,
    stack_config,
)
from .steps import KV, HeadLinears, PiecewisePrefill, PiecewiseRound, PrefillStep, RoundStep, Slot
from .tree import (
    MovePathStep,
    PiecewiseTreeRound,
    TreeEmbedStep,
    TreeRoundStep,
    TreeVerifyStep,
    checked_tree,
    tree_widths,
)
from .warp import knobs

__all__ = ["BUCKETS", "Capture", "Engine", "EngineOptions", "Slot"]

BUCKETS = (256, 512, 1024, 2048, 4096)


class Capture(Protocol):
    """How a step module becomes a replayable graph on a device.

    A capture whose `pieces` attribute is True (`torch.compile`) gets small
    pieces (one decoder layer, the head, warp + verify, ...) with the loops over
    layers and draft steps in Python; otherwise (CUDA graphs, HPU graphs, where
    recording is cheap) the whole round is one step module.
    """

    def capture(self, module: nn.Module, example: Sequence[Tensor]) -> Callable[..., Any]:
        """A callable equivalent to `module` (compiled, graph-captured, ...)."""
        ...

    def boundary(self) -> None:
        """Called once after every round and after the prefill (HPU lazy mode: mark_step)."""
        ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """Engine settings.

    Attributes:
        buckets: cache capacities, ascending; a run takes the smallest that fits.
        ks: K values to capture for a dynamic-K policy (the nearest below is used).
        sync_every: read the stop flags (and metrics) every this many rounds.
        prefill_chunk: width of the prefill graph's chunk.
    """

    buckets: tuple[int, ...] = BUCKETS
    ks: tuple[int, ...] = ()
    sync_every: int = 1
    prefill_chunk: int = 64

    def __post_init__(self) -> None:
        b = self.buckets
        if not b or any(isinstance(c, bool) or not isinstance(c, int) or c < 2 for c in b) or \
                list(b) != sorted(set(b)):
            raise ValueError(f"buckets: expected ascending distinct ints >= 2, got {b!r}")
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.ks):
            raise ValueError(f"ks: expected ints >= 1, got {self.ks!r}")
        for name in ("sync_every", "prefill_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")


def static_stack(stack: LlamaStack) -> LlamaStack:
    """The same weights with plain (unpacked) dense linears, which every compiler traces.

    Raises:
        ValueError: a linear is not dense (e.g. the fbgemm int8 draft).
    """
    def plain(linear: Any) -> DenseLinear:
        if not isinstance(linear, DenseLinear):
            raise ValueError(f"drafter: the static engine captures dense Llama layers, got a "
                             f"{type(linear).__name__} (use 'early-exit:N' or a draft model, not "
                             f"'int8': fbgemm's dynamic int8 kernels cannot be captured)")
        return DenseLinear(linear.weight, linear.bias, pack=False)

    return stack.derive(linear=plain)


class Engine:
    """Speculative rounds over fixed-shape buffers, captured once per (batch, bucket, K).

    Args:
        target: the target's Llama stack.
        draft: the draft's Llama stack (same vocabulary), or None for a tree drafter, which
            proposes on the host (`iterate_tree`); for a feature-level draft head, its
            one-layer stack.
        dtype, device: of the K/V buffers.
        capture: turns step modules into graphs.
        options: buckets, K values, sync cadence.
        head: a draft head's FC and output (`draft` is then its stack): it drafts from the
            target's features, kept in a feature buffer per slot. Compiled pieces only.
    """

    def __init__(self, target: LlamaStack, draft: LlamaStack | None, *, dtype: torch.dtype,
                 device: torch.device, capture: Capture, options: EngineOptions,
                 head: HeadLinears | None = None) -> None:
        if head is not None and (draft is None or len(draft.layers) != 1):
            raise ValueError("head: a draft head needs its one-layer stack as the draft")
        if head is not None and not getattr(capture, "pieces", False):
            raise ValueError("drafter: a draft head runs on compiled pieces (the option pieces=True, "
                             "the default), not as one whole-round graph")
        self.target, self.draft, self.head = target, draft, head
        self.dtype, self.device, self.capture, self.options = dtype, device, capture, options
        self.vocab = int(target.embed.shape[0])
        self.slots: dict[tuple[int, int], Slot] = {}
        self.pieces = bool(getattr(capture, "pieces", False))
        self._modules: dict[tuple[Any, ...], nn.Module] = {}
        self._captured: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def piece(self, kind: str, stack: LlamaStack | None, width: int, kv: KV) -> Callable[..., Any]:
        """The captured piece `kind` ("embed", "layer", "head", "sample", "verify-RULE"; for
        trees "tree-embed", "tree-verify-D", "move-path"; for a draft head "features",
        "head-in", "head-out-S") for a model's configuration, a width
        T and a K/V buffer shape; captured on first use, then shared."""
        config = None if stack is None else stack_config(stack)
        key = (kind, config, width, tuple(kv[0][0].shape))
        if key not in self._captured:
            if (kind, config) not in self._modules:
                module: nn.Module
                if stack is None:
                    if kind.startswith("tree-verify-"):
                        module = TreeVerifyStep(int(kind.removeprefix("tree-verify-")))
                    elif kind.startswith("verify-"):
                        module = VerifyStep(kind.removeprefix("verify-"))
                    else:
                        module = {"sample": DraftSampleStep, "move-path": MovePathStep}[kind]()
                elif kind.startswith("head-out-"):
                    module = HeadOutputStep(stack, int(kind.removeprefix("head-out-")))
                else:
                    module = {"embed": EmbedStep, "layer": LayerStep, "head": HeadStep,
                              "tree-embed": TreeEmbedStep, "features": FeatureStep,
                              "head-in": HeadInputStep}[kind](stack)
                self._modules[(kind, config)] = module
            self._captured[key] = self.capture.capture(self._modules[(kind, config)], ())
        return self._captured[key]

    def bucket(self, needed: int) -> int:
        """The smallest bucket capacity >= needed."""
        for capacity in self.options.buckets:
            if capacity >= needed:
                return capacity
        raise ValueError(f"prompt + max_new_tokens + K + 1 = {needed} positions: expected at most "
                         f"the largest bucket {self.options.buckets[-1]} (options.buckets = "
                         f"{list(self.options.buckets)}); add a larger bucket or shorten the run")

    def _kv(self, stack: LlamaStack, batch: int, capacity: int) -> KV:
        shape = (batch, stack.kv_heads, capacity, stack.head_dim)
        return tuple((torch.zeros(shape, dtype=self.dtype, device=self.device),
                      torch.zeros(shape, dtype=self.dtype, device=self.device))
                     for _ in stack.layers)

    def slot(self, batch: int, capacity: int) -> Slot:
        """The slot for (batch, capacity), allocated on first use."""
        key = (batch, capacity)
        if key not in self.slots:
            ints: dict[str, Any] = dict(dtype=torch.int64, device=self.device)
            with torch.inference_mode(False), torch.no_grad():
                self.slots[key] = Slot(
                    tokens=torch.zeros(batch, capacity, **ints), lengths=torch.ones(batch, **ints),
                    stop=torch.ones(batch, **ints), done=torch.ones(batch, dtype=torch.bool,
                                                                     device=self.device),
                    target_kv=self._kv(self.target, batch, capacity),
                    draft_kv=() if self.draft is None else self._kv(self.draft, batch, capacity),
                    knob=knobs(SamplingParams(), self.vocab, dtype=self._logits_dtype(),
                               device=self.device),
                    eos=torch.tensor(-1, **ints),
                    features=None if self.head is None else torch.zeros(
                        batch, capacity, int(self.target.embed.shape[1]), dtype=self.dtype,
                        device=self.device))
        return self.slots[key]

    def _logits_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == torch.float64 else torch.float32

    def _round(self, slot: Slot, k: int, rule: str) -> Callable[..., Any]:
        if (k, rule) not in slot.rounds:
            if k not in slot.uniforms:
                slot.uniforms[k] = torch.zeros(slot.tokens.shape[0], 2 * k + 1, dtype=torch.float64,
                                               device=self.device)
            slot.rounds[(k, rule)] = (PiecewiseRound(self, slot, k, rule) if self.pieces else
                                      self.capture.capture(RoundStep(self, slot, k, rule),
                                                           (slot.uniforms[k], slot.knob, slot.eos)))
        return slot.rounds[(k, rule)]

    def _tree_round(self, slot: Slot, width: int, depth: int
                    ) -> tuple[Callable[..., Any], tuple[Tensor, ...]]:
        """The captured tree round of `width` nodes and depth D, and its input buffers (nodes,
        parents, sizes, uniforms), built on first use and warmed up at once: run with every
        row done, it compiles its graphs and commits nothing (done rows emit nothing, and
        what it writes to the K/V lies past the valid lengths, or at the last committed
        token's slot, which every round writes again)."""
        key = (width, depth)
        if key not in slot.trees:
            batch, dev = int(slot.tokens.shape[0]), self.device
            buffers = (torch.zeros(batch, width, dtype=torch.int64, device=dev),
                       torch.full((batch, width), -1, dtype=torch.int64, device=dev),
                       torch.zeros(batch, dtype=torch.int64, device=dev),
                       torch.zeros(batch, width + 1, dtype=torch.float64, device=dev))
            round_ = (PiecewiseTreeRound(self, slot, width, depth) if self.pieces else
                      self.capture.capture(TreeRoundStep(self, slot, depth), (*buffers, slot.knob, slot.eos)))
            done = slot.done.clone()
            slot.done.fill_(True)
            try:
                round_(*buffers, slot.knob, slot.eos)
            finally:
                slot.done.copy_(done)
            slot.trees[key] = (round_, buffers)
        return slot.trees[key]

    def iterate_tree(self, prompt: Tensor, lengths: Tensor, run: RunOptions,
                     drafter: TreeDrafter) -> Iterator[Step]:
        """Tree rounds until every row stops, yielding a core `Step` after each (the drafter
        reads the committed tokens every round, so the host syncs every round).

        A round runs the graphs of the smallest width in `tree_widths(N)` that holds its
        widest active tree (rows with smaller trees are masked by their size), so a round of
        one-node trees does not pay for an N-node verify; every width's graphs are built and
        warmed up at the first run of each (batch, bucket). Round r reads the verification columns of
        `round_uniforms(seed, r, B, N)` (the first `width` and the final one), as
        `run_tree_rounds` does: the same tokens as the core loop.
        """
        if self.target.window is not None:
            raise ValueError(f"drafter: a tree verify needs full attention, the target has a "
                             f"sliding window of {self.target.window}")
        batch, nodes, depth = int(prompt.shape[0]), int(drafter.nodes), int(drafter.depth)
        longest = int(lengths.max())
        slot = self.slot(batch, self.bucket(max(longest + run.max_new_tokens + nodes + 1, run.capacity or 0)))
        self.load(slot, prompt, lengths, run.max_new_tokens, run.params, run.eos_token_id)
        if longest > 1:
            self.prefill(slot, prompt, longest - 1)
        ladder = tree_widths(nodes)
        rounds = {w: self._tree_round(slot, w, depth) for w in ladder}
        metrics, index = Metrics(), 0
        state = drafter.start(slot.tokens, slot.lengths, slot.capacity)
        while True:
            began = time.perf_counter()
            tree = checked_tree(drafter.propose_tree(slot.tokens, slot.lengths, nodes, depth), batch,
                                nodes, depth)
            widest = int(torch.where(slot.done, 0, tree.sizes.to(slot.done.device)).max())
            w = next(w for w in ladder if w >= widest)
            round_, (tree_tokens, tree_parents, tree_sizes, u) = rounds[w]
            tree_tokens.copy_(tree.tokens[:, :w])
            tree_parents.copy_(tree.parents[:, :w])
            tree_sizes.copy_(tree.sizes.clamp(max=w))  # only done rows are clamped
            columns = torch.from_numpy(round_uniforms(run.seed, index, batch, nodes))  # [B, 2N+1]
            u.copy_(torch.cat([columns[:, nodes:nodes + w], columns[:, 2 * nodes:]], dim=1))
            slot.lineage.generation += 1
            out = tuple(t.clone() for t in round_(tree_tokens, tree_parents, tree_sizes, u, slot.knob,
                                                   slot.eos))
            self.capture.boundary()
            state = drafter.advance(state, slot.lengths)
            finished, steps, metrics = self._sync(slot, [(index, nodes, out, time.perf_counter() - began)],
                                                  metrics)
            index += 1
            yield from steps
            if finished:
                return

    def pick_k(self, wanted: int) -> int:
        """The captured K to run for a wanted K: the largest captured <= wanted (else the smallest)."""
        ks = sorted(self.options.ks)
        if not ks or wanted in ks:
            return wanted
        below = [k for k in ks if k <= wanted]
        return below[-1] if below else ks[0]

    def prefill(self, slot: Slot, prompt: Tensor, width: int) -> None:
        """Write the K/V of prompt positions [0, width) in fixed chunks (positions clipped to C-1)."""
        chunk = min(self.options.prefill_chunk, slot.capacity)
        if slot.prefill is None:
            example = torch.zeros(prompt.shape[0], chunk, dtype=torch.int64, device=self.device)
            slot.prefill = (PiecewisePrefill(self, slot) if self.pieces else
                            self.capture.capture(PrefillStep(self, slot), (example, example)))
        span = torch.arange(chunk, device=self.device)
        for start in range(0, width, chunk):
            positions = (start + span).clamp(max=slot.capacity - 1).expand(prompt.shape[0], chunk)
            ids = slot.tokens.gather(1, positions)  # tokens beyond a prompt are padding, masked later
            slot.prefill(ids.contiguous(), positions.contiguous())
        self.capture.boundary()

    def load(self, slot: Slot, prompt: Tensor, lengths: Tensor, max_new_tokens: int,
             params: SamplingParams, eos_token_id: int | None, threshold: float | None = None) -> None:
        """Copy a run's inputs into the slot's buffers (no reallocation)."""
        slot.tokens.zero_()
        slot.tokens[:, : prompt.shape[1]].copy_(prompt)
        slot.lengths.copy_(lengths)
        slot.stop.copy_(lengths + max_new_tokens)
        slot.done.copy_(lengths >= slot.stop)
        slot.knob.copy_(knobs(params, self.vocab, dtype=slot.knob.dtype, device=self.device,
                              threshold=threshold))
        slot.eos.fill_(-1 if eos_token_id is None else eos_token_id)
        slot.head_k = 0  # a head's K/V holds the target's features only, up to L - 1

    def iterate(self, prompt: Tensor, lengths: Tensor, run: RunOptions,
                threshold: float | None = None) -> Iterator[Step]:
        """Rounds until every row stops, yielding core `Step`s after each host sync.

        The host reads device values once per `sync_every` rounds (stop flags and
        the per-round counts together). Between syncs a finished batch runs idle
        rounds (every row done: nothing is committed). With sync_every > 1 each
        yielded Step carries the state at the sync, not after its own round.
        A Step's tokens, lengths and flags are copies; its caches name the slot's
        buffers, which the next round consumes (`specsample.core.cache`).

        Args:
            prompt: int64 [B, T] right-padded, on the device; lengths int64 [B] (>= 1).
            run: the run's options; `verifier` names a rule in `RULES` (`check` is the
                caller's to handle).
            threshold: the drafter's confidence threshold (`ModelDrafter.threshold`): every
                row drafts K and verifies its drafts up to the first one below it. A knob,
                like the sampling parameters: changing it compiles nothing.
        """
        if self.draft is None:
            raise ValueError("draft: this engine has no draft model (it runs tree drafters: "
                             "iterate_tree); chain rounds need one")
        batch, policy, rule = int(prompt.shape[0]), run.policy, str(run.verifier)
        width = int(lengths.max())
        needed = max(width + run.max_new_tokens + policy.k_max + 1, run.capacity or 0)
        slot = self.slot(batch, self.bucket(needed))
        self.load(slot, prompt, lengths, run.max_new_tokens, run.params, run.eos_token_id, threshold)
        if width > 1:
            self.prefill(slot, prompt, width - 1)
        metrics, index, pending = Metrics(), 0, []
        while True:
            k = self.pick_k(policy.next_k(metrics))
            began = time.perf_counter()
            round_ = self._round(slot, k, rule)
            slot.uniforms[k].copy_(torch.from_numpy(round_uniforms(run.seed, index, batch, k)))
            slot.lineage.generation += 1  # the round writes K/V: earlier Steps' caches are consumed
            out = tuple(t.clone() for t in round_(slot.uniforms[k], slot.knob, slot.eos))
            self.capture.boundary()
            pending.append((index, k, out, time.perf_counter() - began))
            index += 1
            if index % self.options.sync_every:
                continue
            finished, steps, metrics = self._sync(slot, pending, metrics)
            pending = []
            yield from steps
            if finished:
                return

    def _snapshot(self, slot: Slot) -> State:
        """The slot's state as values (copies), its caches bound to the slot's lineage."""
        lengths = slot.lengths.clone()

        def cache(kv: KV, held: Tensor) -> Cache:
            return Cache(lengths=held, capacity=slot.capacity, buffers=kv, lineage=slot.lineage,
                         generation=slot.lineage.generation)

        if self.draft is None:
            draft = None
        elif slot.features is None:
            draft = DraftState(cache=cache(slot.draft_kv, (lengths - 2).clamp(min=0)), window=2)
        else:  # a head's buffers as `HeadModel` lays them out (K/V, features, known), and its
            # window as `HeadDrafter.advance_features` leaves it: the last round's width
            window = slot.head_k + 1
            draft = DraftState(cache=Cache(lengths=(lengths - window).clamp(min=0), capacity=slot.capacity,
                                           buffers=(slot.draft_kv[0], slot.features, lengths - 1),
                                           lineage=slot.lineage, generation=slot.lineage.generation),
                               window=window)
        return State(tokens=slot.tokens.clone(), lengths=lengths, stop_lengths=slot.stop.clone(),
                     target_cache=cache(slot.target_kv, lengths - 1), draft_state=draft,
                     done=slot.done.clone())

    def _sync(self, slot: Slot, pending: list[Any], metrics: Metrics) -> tuple[bool, list[Step], Metrics]:
        """One device read for the pending rounds: their counts and whether all rows are done."""
        counts = torch.stack([torch.stack([n, e, a.long(), kept]) for _, _, (_, n, e, a, kept), _ in pending])
        host = torch.cat([counts.flatten(), slot.done.all().long()[None]]).tolist()  # the sync
        batch = int(slot.tokens.shape[0])
        state = self._snapshot(slot)
        steps = []
        for j, (index, k, (verdict, n, emitted, active, kept), elapsed) in enumerate(pending):
            rows = host[4 * batch * j: 4 * batch * (j + 1)]
            metrics = tally(metrics, k=k, accepted=rows[:batch], emitted=rows[batch: 2 * batch],
                            active=[bool(a) for a in rows[2 * batch: 3 * batch]], elapsed_s=elapsed,
                            drafted=rows[3 * batch:])
            result = RoundResult(verdict=Verdict(tokens=verdict, num_accepted=n), emitted=emitted,
                                 active=active, drafted=kept)
            steps.append(Step(index=index, k=k, result=result, state=state, metrics=metrics))
        return bool(host[-1]), steps, metrics
