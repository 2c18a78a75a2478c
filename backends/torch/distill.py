"""Train a feature-level draft head from the target's own samples (`specsample distill`).

1. The target samples continuations of varied training prompts, batched, at
   `temperature`: open prompts (topic x instruction), then grounded ones that rework a
   text given in the prompt (a passage the target wrote in the first stage, or a short
   Python function). None of them is a benchmark prompt (`_distill_prompts`).
2. The forwards that sample also give the target's features f_t and the normaliser of
   its logits at every position (kept; no second pass); the draft vocabulary is the
   `vocab` tokens most frequent in those sequences, filled up with the lowest ids.
3. The head learns, with teacher forcing on noisy features, f_t from (x_t, f_{t-1}):
   smooth-L1 to the target's feature (in units of the features' std) plus the
   cross-entropy of its draft law against the target's law (temperature 1) on the draft
   vocabulary.
4. Held-out acceptance: greedy speculative generation with K drafts on the benchmark
   prompts, which the head never saw; and the hit rate of a depth-1 fan-out of its m
   likeliest tokens, m = 1..`FAN_OUT_NODES`, on the target's greedy text for them.

Everything is seeded: the same plan, target and thread count give the same head.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from specsample._array import check_int
from specsample.api.runner import encode_text
from specsample.bench.prompts import PROMPTS
from specsample.core.cache import rollback
from specsample.core.params import SamplingParams
from specsample.core.rng import Stream, uniforms
from specsample.core.sample import sample
from specsample.core.warp import warp
from specsample.drafters.head import DistillPlan, HeadDrafter
from specsample.engine.generate import generate, generate_plain

from ._distill_prompts import grounded_prompts, open_prompts
from .head import DraftHead, HeadModel, fingerprints, load_head, save_head
from .model import HFModel

__all__ = ["FAN_OUT_NODES", "distill", "evaluate_fan_out", "held_out_alpha", "held_out_fan_out",
           "training_prompts"]

Progress = Callable[[str, int, int], None]  # (stage, done, total)

# The widest fan-out whose held-out hit rate a card records.
FAN_OUT_NODES = 8


def training_prompts(count: int) -> list[str]:
    """The first `count` open training prompts (topic x instruction)."""
    return open_prompts(count)


def _passage(tokenizer: Any, ids: Sequence[int], limit: int = 600) -> str:
    """The target's text, cut after its last full sentence within `limit` characters."""
    text = str(tokenizer.decode(ids, skip_special_tokens=True)).strip()
    if len(text) <= limit:
        return text
    cut = max(text.rfind(end, 0, limit) for end in (". ", ".\n", "! ", "? "))
    return text[:cut + 1] if cut > limit // 3 else text[:limit]


Row = tuple[Tensor, Tensor, Tensor]  # ids [L], features [L, D], log-normaliser of the logits [L]


def _sample(target: HFModel, tokenizer: Any, texts: Sequence[str], plan: DistillPlan, seed: int,
            progress: Progress, stage: str) -> list[Row]:
    """Plain sampling of each prompt, batched, keeping what every forward computes anyway:
    the features and the logits' log-normaliser of each position (no second pass).

    A row holds the prompt and the sampled tokens except the last one, whose features no
    forward computed. The tokens are those `generate_plain` samples with the same seed.
    """
    prompts = [encode_text(tokenizer, p) for p in texts]
    eos = tokenizer.eos_token_id
    rows: list[Row] = []
    params = SamplingParams(temperature=plan.temperature)
    for start in range(0, len(prompts), plan.batch):
        chunk = prompts[start:start + plan.batch]
        batch, width = len(chunk), max(len(p) for p in chunk)
        lengths = torch.tensor([len(p) for p in chunk])
        ids = torch.tensor([p + [0] * (width - len(p)) for p in chunk])
        cache = target.new_cache(batch, width + plan.new_tokens)
        feats: list[list[Tensor]] = [[] for _ in chunk]
        norms: list[list[Tensor]] = [[] for _ in chunk]
        tokens = [list(p) for p in chunk]
        if width > 1:
            logits, features, cache = target.forward_features(ids[:, :-1], cache)
            lse = torch.logsumexp(logits.double(), -1).float()
            for b, p in enumerate(chunk):
                feats[b].append(features[b, :len(p) - 1])
                norms[b].append(lse[b, :len(p) - 1])
        cache = rollback(cache, lengths - 1)
        done = torch.zeros(batch, dtype=torch.bool)
        last = ids.gather(1, (lengths - 1)[:, None])
        for step in range(plan.new_tokens):
            logits, features, cache = target.forward_features(last, cache)
            lse = torch.logsumexp(logits.double(), -1).float()
            u = uniforms(seed + start, step, batch, 1, stream=Stream.PLAIN, like=last)[:, 0]
            x = sample(warp(logits[:, 0], params), u, check=False)
            for b in range(batch):
                if not done[b]:
                    feats[b].append(features[b])
                    norms[b].append(lse[b])
                    tokens[b].append(int(x[b]))
            done |= x == eos if eos is not None else done
            if bool(done.all()):
                break
            last = x[:, None]
        for b in range(batch):
            length = len(tokens[b]) - 1
            rows.append((torch.tensor(tokens[b][:length]), torch.cat(feats[b])[:length].clone(),
                         torch.cat(norms[b])[:length]))
        progress(stage, len(rows), len(prompts))
    return rows


def _vocabulary(rows: Sequence[list[int]], size: int, total: int, keep: Sequence[int]) -> Tensor | None:
    """The `size` most frequent ids in `rows` (ties: the lower id), filled up to `size` with
    the lowest ids not seen (a byte-pair tokenizer numbers its merges in order, so low ids
    are common pieces), plus `keep`; None for all."""
    if size == 0 or size >= total:
        return None
    counts = Counter(itertools.chain.from_iterable(rows))
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    seen = set(ranked)
    ranked += itertools.islice((t for t in range(total) if t not in seen), size - len(ranked))
    chosen = set(ranked) | {int(t) for t in keep}
    return torch.tensor(sorted(chosen), dtype=torch.int64)


def _loss(head: DraftHead, batch: list[Row], plan: DistillPlan,
          scale: float, weight: Tensor, generator: torch.Generator) -> Tensor:
    width = max(len(ids) for ids, _, _ in batch)
    ids = torch.stack([F.pad(x, (0, width - len(x))) for x, _, _ in batch])
    feats = torch.stack([F.pad(f, (0, 0, 0, width - len(f))) for _, f, _ in batch])
    lse = torch.stack([F.pad(n, (0, width - len(n))) for _, _, n in batch])
    valid = torch.stack([torch.arange(width) < len(x) for x, _, _ in batch]).float()
    previous = torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], dim=1)
    previous = previous + plan.noise * scale * torch.randn(previous.shape, generator=generator)
    guess = head.features(ids, previous)
    # In units of the features' std, so that the two terms keep their weights' proportion.
    regression = (F.smooth_l1_loss(guess / scale, feats / scale, reduction="none").mean(-1) * valid).sum()
    with torch.no_grad():
        p = torch.exp(feats @ weight.T - lse[..., None])  # the target's law on the draft vocabulary
    cross = -(p * torch.log_softmax(guess @ weight.T, dim=-1)).sum(-1)
    return (plan.feature_weight * regression + plan.logit_weight * (cross * valid).sum()) / valid.sum()


def _train(head: DraftHead, data: list[Row], plan: DistillPlan,
           progress: Progress) -> list[float]:
    generator = torch.Generator().manual_seed(plan.seed)
    weight = head.target_stack.head.weight.detach()[head.vocab]  # type: ignore[attr-defined]
    scale = float(torch.cat([f for _, f, _ in data]).std())
    params = [p for n, p in head.named_parameters()]
    optimiser = torch.optim.AdamW(params, lr=plan.lr, betas=(0.9, 0.95), weight_decay=0.0)
    steps = plan.epochs * -(-len(data) // plan.batch_rows)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=plan.lr, total_steps=steps,
                                                   pct_start=0.1)
    losses, done = [], 0
    head.train()
    for _ in range(plan.epochs):
        order = torch.randperm(len(data), generator=generator).tolist()
        total = 0.0
        for start in range(0, len(order), plan.batch_rows):
            loss = _loss(head, [data[i] for i in order[start:start + plan.batch_rows]], plan, scale,
                         weight, generator)
            optimiser.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            optimiser.step()
            schedule.step()
            total += float(loss.detach())
            done += 1
            progress("training", done, steps)
        losses.append(total / -(-len(order) // plan.batch_rows))
    head.eval()
    return losses


def held_out_alpha(target: HFModel, drafter: Any, tokenizer: Any, *, k: int, new_tokens: int
                   ) -> dict[str, float]:
    """Greedy per-token acceptance alpha (`Metrics.alpha`: accepted / (accepted + rejections))
    of `drafter` on the benchmark prompts, pooled per kind ("open", "grounded") and overall."""
    pooled: dict[str, list[int]] = {"open": [0, 0], "grounded": [0, 0]}
    for tag, text in PROMPTS:
        ids = torch.tensor([encode_text(tokenizer, text)])
        m = generate(target, drafter, ids, max_new_tokens=new_tokens,
                     params=SamplingParams(temperature=0.0), k=k,
                     eos_token_id=tokenizer.eos_token_id).metrics
        pooled[tag][0] += m.accepted
        pooled[tag][1] += m.accepted + m.row_rounds - m.full_rounds
    pooled["all"] = [sum(v[0] for v in pooled.values()), sum(v[1] for v in pooled.values())]
    return {tag: a / t if t else 0.0 for tag, (a, t) in pooled.items()}


def held_out_fan_out(target: HFModel, head: DraftHead, tokenizer: Any, *, new_tokens: int,
                     nodes: int = FAN_OUT_NODES) -> dict[str, list[float]]:
    """Greedy hit rate of a depth-1 fan-out on the benchmark prompts (which the head never
    saw), for m = 1..`nodes` candidates: the fraction of positions of the target's greedy
    text whose token is among the head's m likeliest, pooled per kind ("open", "grounded")
    and overall.

    Teacher forcing is what a depth-1 tree round does: every round hands the head the
    target's features of the accepted path, so the head at position t reads the token
    there and the target's feature of t - 1, never its own guess. At T = 0 a round with
    m candidates accepts one exactly when the target's token is among them.
    """
    check_int("nodes", nodes, 1)
    check_int("new_tokens", new_tokens, 1)
    counts = {tag: torch.zeros(nodes, dtype=torch.float64) for tag in ("open", "grounded", "all")}
    seen = dict.fromkeys(counts, 0)
    with torch.no_grad():
        for tag, text in PROMPTS:
            ids = torch.tensor([encode_text(tokenizer, text)])
            made = generate_plain(target, ids, max_new_tokens=new_tokens,
                                  params=SamplingParams(temperature=0.0), eos_token_id=tokenizer.eos_token_id)
            tokens = torch.tensor([ids[0].tolist() + made.new_tokens(0)])  # [1, T]
            _, features, _ = target.forward_features(tokens, target.new_cache(1, int(tokens.shape[1])))
            previous = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
            guess = head.logits(head.features(tokens, previous.to(head.fc.weight.dtype)))  # [1, T, V]
            start = int(ids.shape[1]) - 1  # the position whose next token is the first generated one
            top = guess[0, start:-1].topk(nodes, dim=-1).indices  # [N, nodes]
            hit = (top == tokens[0, start + 1:, None]).cumsum(dim=-1).clamp(max=1)  # [N, nodes]
            for key in (tag, "all"):
                counts[key] += hit.sum(dim=0).double()
                seen[key] += int(hit.shape[0])
    return {tag: [round(float(x) / seen[tag], 4) if seen[tag] else 0.0 for x in counts[tag]]
            for tag in counts}


def distill(target: HFModel, tokenizer: Any, plan: DistillPlan, path: str | Path, *,
            progress: Progress | None = None) -> dict[str, Any]:
    """Train a head for `target` as `plan` says and save it at `path` (+ its .json card).

    Returns:
        The card: target fingerprint, vocabulary size, the plan, losses, held-out alpha,
        seconds taken.
    """
    if not isinstance(plan, DistillPlan):
        raise TypeError(f"plan: expected a DistillPlan, got {type(plan).__name__}")
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"path: expected a .safetensors file name, got {str(path)!r}")
    report = progress or (lambda stage, done, total: None)
    began = time.perf_counter()
    torch.manual_seed(plan.seed)
    with torch.no_grad():
        data = _sample(target, tokenizer, training_prompts(plan.prompts), plan, plan.seed, report,
                       "sampling")
        if plan.grounded:
            passages = [_passage(tokenizer, ids[len(encode_text(tokenizer, t)):].tolist())
                        for (ids, _, _), t in zip(data, training_prompts(plan.prompts), strict=True)]
            data += _sample(target, tokenizer, grounded_prompts(passages, plan.grounded), plan,
                            plan.seed + len(data), report, "sampling grounded")
    rows = [ids.tolist() for ids, _, _ in data]
    keep = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    head = DraftHead(target, vocab=_vocabulary(rows, plan.vocab, target.vocab_size, keep))
    losses = _train(head, data, plan, report)
    alpha = held_out_alpha(target, HeadDrafter(HeadModel(head)), tokenizer, k=plan.k,
                           new_tokens=plan.held_out_tokens)
    fan_out = held_out_fan_out(target, head, tokenizer, new_tokens=plan.held_out_tokens)
    card = {**fingerprints(target), "vocab": int(head.vocab.numel()),
            "plan": dataclasses.asdict(plan), "epoch_losses": [round(x, 5) for x in losses],
            "held_out_alpha": {k: round(v, 4) for k, v in alpha.items()},
            "held_out_fan_out": fan_out,
            "training_tokens": sum(len(r) for r in rows), "seconds": round(time.perf_counter() - began),
            "torch_threads": torch.get_num_threads()}
    save_head(head.half(), path, card)
    head.float()
    return card


def evaluate_fan_out(target: HFModel, tokenizer: Any, path: str | Path) -> dict[str, Any]:
    """Measure the fan-out hit rates (`held_out_fan_out`) of the head at `path` for `target`
    and write them into its card, as `distill` does for a head it trains; the weights and
    the rest of the card stay as they are.

    Returns:
        The card as written.
    """
    path = Path(path)
    head = load_head(path, target)
    card_path = path.with_suffix(".json")
    card: dict[str, Any] = json.loads(card_path.read_text())
    tokens = int(card.get("plan", {}).get("held_out_tokens", DistillPlan().held_out_tokens))
    card["held_out_fan_out"] = held_out_fan_out(target, head.float(), tokenizer, new_tokens=tokens)
    card_path.write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    return card
