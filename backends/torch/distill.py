"""Train a feature-level draft head from the target's own samples (`specsample distill`).

1. The target samples continuations of varied training prompts, batched, at
   `temperature`: open prompts (topic x instruction), then grounded ones that rework a
   text given in the prompt (a passage the target wrote in the first stage, or a short
   Python function). None of them is a benchmark prompt (`_distill_prompts`).
2. The forwards that sample also give the target's features f_t and the normaliser of
   its logits at every position (kept; no second pass); the draft vocabulary is the
   `vocab` tokens most frequent in those sequences, filled up with the lowest ids. A
   head that fuses the target's low and middle layers (`taps`, EAGLE-3) gets their
   outputs from one more forward over each row (`_distill_data.with_taps`).
3. The head learns, with teacher forcing on noisy features, f_t from (x_t, f_{t-1}):
   smooth-L1 to the target's feature (in units of the features' std) plus the
   cross-entropy of its draft law against the target's law on the draft vocabulary, both
   at temperature 1 or both sharpened (`label_temperature`). With `unroll` > 1 (EAGLE-3's
   training-time test) it is also unrolled on its own predictions, as drafting runs it
   (`DraftHead.unrolled`), each step's cross-entropy weighted by unroll_weight ** step.
4. Held-out acceptance: greedy speculative generation with K drafts on the benchmark
   prompts, which the head never saw (per kind: alpha, the acceptance at each draft depth,
   the mean tokens per round); and the hit rate of a depth-1 fan-out of its m likeliest
   tokens, m = 1..`FAN_OUT_NODES`, on the target's greedy text for them.

With a checkpoint folder nothing done is lost: each sampled batch is written there as it
finishes, and the training state every `SAVE_EVERY` steps; a run given the same folder (and
plan) continues where the last one stopped, and one that changes only the training settings
reuses the samples. The card's seconds count every invocation of the plan (the folder's
elapsed.json keeps the total). Everything is seeded: the same plan, target and
thread count give the same head, interrupted or not.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from specsample._array import check_int
from specsample.api.runner import encode_text
from specsample.bench.prompts import PROMPTS
from specsample.core.params import SamplingParams
from specsample.drafters.head import DistillPlan, HeadDrafter
from specsample.engine.generate import generate, generate_plain

from ._distill_data import (
    Progress,
    Row,
    checkpoint_folder,
    passage,
    recorded_plan,
    sample_rows,
    training_prompts,
    vocabulary,
    with_taps,
)
from ._distill_prompts import grounded_prompts
from .head import DraftHead, HeadModel, columns
from .head_file import fingerprints, load_head, save_head
from .model import HFModel

__all__ = ["FAN_OUT_NODES", "HELD_OUT_TEMPERATURES", "SAVE_EVERY", "distill", "evaluate_fan_out",
           "evaluate_held_out", "held_out", "held_out_alpha", "held_out_fan_out", "held_out_table",
           "label_law", "training_prompts"]


# The widest fan-out whose held-out hit rate a card records.
FAN_OUT_NODES = 8
# Seeds apart of the plan's samples j and j + 1 (more than the prompts of both kinds).
SAMPLE_SEEDS = 1_000_000
# Training steps between two saves of the training state to a checkpoint folder.
SAVE_EVERY = 100


def _noisy(previous: Tensor, width: int, noise: float, scale: float, generator: torch.Generator) -> Tensor:
    """The target's features with training noise: on f, `noise` times its std over the data
    (`scale`); on each tapped layer's output (columns past `width`), `noise` times that
    output's root mean square at its position (the head reads it scaled to unit rms)."""
    jitter = torch.randn(previous.shape, generator=generator)
    parts = columns(previous, width)
    size = [scale] + [p.pow(2).mean(-1, keepdim=True).sqrt() for p in parts[1:]]
    return torch.cat([p + noise * s * j for p, s, j in zip(parts, size, columns(jitter, width),
                                                            strict=True)], dim=-1)


def label_law(logits: Tensor, lse: Tensor, temperature: float) -> Tensor:
    """The law the cross-entropy fits, from the target's logits on the draft vocabulary
    [..., S] and the log-normaliser of its logits over the whole vocabulary [...]: at
    temperature 1 the target's own law on the draft vocabulary (its mass outside it left out),
    else softmax(logits / temperature) over the draft vocabulary."""
    if temperature == 1:
        return torch.exp(logits - lse[..., None])
    return torch.softmax(logits / temperature, dim=-1)


def _draft_log_law(logits: Tensor, temperature: float) -> Tensor:
    """The head's log-law at the label law's temperature: both laws compared at one
    temperature, so that a head that fits exactly has the target's logits (up to a constant
    per position) and drafts as well at every sampling temperature."""
    return torch.log_softmax(logits if temperature == 1 else logits / temperature, dim=-1)


def _loss(head: DraftHead, batch: list[Row], plan: DistillPlan,
          scale: float, weight: Tensor, generator: torch.Generator) -> Tensor:
    width = max(len(ids) for ids, _, _ in batch)
    ids = torch.stack([F.pad(x, (0, width - len(x))) for x, _, _ in batch])
    wide = torch.stack([F.pad(f, (0, 0, 0, width - len(f))) for _, f, _ in batch])
    feats = wide[..., :head.width]  # f, the final norm's output (wide: then the taps')
    lse = torch.stack([F.pad(n, (0, width - len(n))) for _, _, n in batch])
    valid = torch.stack([torch.arange(width) < len(x) for x, _, _ in batch]).float()
    previous = torch.cat([torch.zeros_like(wide[:, :1]), wide[:, :-1]], dim=1)
    previous = _noisy(previous, head.width, plan.noise, scale, generator)
    with torch.no_grad():
        p = label_law(feats @ weight.T, lse, plan.label_temperature)
    if plan.unroll == 1:
        guess = head.features(ids, previous)
        # In units of the features' std, so that the two terms keep their weights' proportion.
        regression = (F.smooth_l1_loss(guess / scale, feats / scale, reduction="none").mean(-1) * valid).sum()
        cross = -(p * _draft_log_law(guess @ weight.T, plan.label_temperature)).sum(-1)
        return (plan.feature_weight * regression + plan.logit_weight * (cross * valid).sum()) / valid.sum()
    steps = head.unrolled(ids, previous, plan.unroll)
    total = torch.zeros((), dtype=feats.dtype)
    for j, guess in enumerate(steps):
        # Step j at position t is a draft j + 1 deep: it exists from t = j on.
        mask = valid * (torch.arange(width) >= j).float()[None, :]
        cross = -(p * _draft_log_law(guess @ weight.T, plan.label_temperature)).sum(-1)
        term = plan.logit_weight * (cross * mask).sum()
        if j == 0 and plan.feature_weight:
            term = term + plan.feature_weight * (F.smooth_l1_loss(
                guess / scale, feats / scale, reduction="none").mean(-1) * mask).sum()
        total = total + plan.unroll_weight ** j * term / mask.sum().clamp(min=1)
    return total


def _same_plan(recorded: Any, plan: DistillPlan) -> bool:
    """Whether a plan recorded in a checkpoint folder is `plan` (`recorded_plan`)."""
    return isinstance(recorded, dict) and recorded_plan(recorded) == dataclasses.asdict(plan)


def _train(head: DraftHead, data: list[Row], plan: DistillPlan,
           progress: Progress, folder: Path | None = None) -> list[float]:
    """Train `head` on `data`; with a `folder`, save the whole training state there every
    `SAVE_EVERY` steps and at each epoch's end, and start from the state saved there."""
    generator = torch.Generator().manual_seed(plan.seed)
    weight = head.target_stack.head.weight.detach()[head.vocab]  # type: ignore[attr-defined]
    scale = float(torch.cat([f[:, :head.width] for _, f, _ in data]).std())
    params = [p for n, p in head.named_parameters()]
    optimiser = torch.optim.AdamW(params, lr=plan.lr, betas=(0.9, 0.95), weight_decay=0.0)
    per_epoch = -(-len(data) // plan.batch_rows)
    steps = plan.epochs * per_epoch
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=plan.lr, total_steps=steps,
                                                   pct_start=0.1)
    state_file = None if folder is None else folder / "training.pt"
    losses: list[float] = []
    epoch, position, total, order = 0, 0, 0.0, None
    saved = torch.load(state_file, weights_only=False) if state_file is not None and state_file.is_file() \
        else None
    if saved is not None and not _same_plan(saved.get("plan"), plan):
        saved = None  # another plan's training on the same samples: train anew (and overwrite it)
    if saved is not None:
        head.load_state_dict(saved["head"])
        optimiser.load_state_dict(saved["optimiser"])
        schedule.load_state_dict(saved["schedule"])
        generator.set_state(saved["generator"])
        epoch, position, total, order, losses = (saved[k] for k in ("epoch", "position", "total", "order",
                                                                    "losses"))

    def save() -> None:
        if state_file is None:
            return
        torch.save({"plan": dataclasses.asdict(plan), "head": head.state_dict(),
                    "optimiser": optimiser.state_dict(),
                    "schedule": schedule.state_dict(), "generator": generator.get_state(),
                    "epoch": epoch, "position": position, "total": total, "order": order,
                    "losses": losses}, state_file.with_suffix(".part"))
        state_file.with_suffix(".part").replace(state_file)

    head.train()
    while epoch < plan.epochs:
        if order is None:
            order = torch.randperm(len(data), generator=generator).tolist()
        while position < len(order):
            loss = _loss(head, [data[i] for i in order[position:position + plan.batch_rows]], plan, scale,
                         weight, generator)
            optimiser.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            optimiser.step()
            schedule.step()
            total += float(loss.detach())
            position += plan.batch_rows
            done = epoch * per_epoch + -(-position // plan.batch_rows)
            progress("training", done, steps)
            if done % SAVE_EVERY == 0:
                save()
        losses.append(total / per_epoch)
        epoch, position, total, order = epoch + 1, 0, 0.0, None
        save()
    head.eval()
    return losses


def held_out_alpha(target: HFModel, drafter: Any, tokenizer: Any, *, k: int, new_tokens: int
                   ) -> dict[str, float]:
    """Greedy per-token acceptance alpha (`Metrics.alpha`: accepted / (accepted + rejections))
    of `drafter` on the benchmark prompts, pooled per kind ("open", "grounded") and overall."""
    return held_out(target, drafter, tokenizer, k=k, new_tokens=new_tokens)["alpha"]


# The temperatures of the held-out table a card records (`held_out_by_temperature`).
HELD_OUT_TEMPERATURES = (0.0, 0.7)


def held_out(target: HFModel, drafter: Any, tokenizer: Any, *, k: int, new_tokens: int,
             temperature: float = 0.0) -> dict[str, dict[str, Any]]:
    """Chain drafting of K tokens a round on the benchmark prompts (which no head saw), at
    `temperature` (seed 0), pooled per kind ("open", "grounded") and overall: "alpha"
    (accepted / (accepted + rejections)), "depth" (the acceptance of the draft at each depth
    1..K given the ones before it were accepted) and "tokens_per_round" (tokens emitted per
    round)."""
    histograms = {"open": [0] * (k + 1), "grounded": [0] * (k + 1)}
    for tag, text in PROMPTS:
        ids = torch.tensor([encode_text(tokenizer, text)])
        m = generate(target, drafter, ids, max_new_tokens=new_tokens,
                     params=SamplingParams(temperature=temperature), k=k, seed=0,
                     eos_token_id=tokenizer.eos_token_id).metrics
        for n, count in enumerate(m.histogram):
            histograms[tag][min(n, k)] += count
    histograms["all"] = [a + b for a, b in zip(histograms["open"], histograms["grounded"], strict=True)]
    out: dict[str, dict[str, Any]] = {"alpha": {}, "depth": {}, "tokens_per_round": {}}
    for tag, h in histograms.items():
        rounds, accepted = sum(h), sum(n * c for n, c in enumerate(h))
        rejections = rounds - h[k]
        out["alpha"][tag] = round(accepted / (accepted + rejections), 4) if accepted + rejections else 0.0
        reached = [sum(h[d:]) for d in range(k + 1)]  # rounds whose first d drafts were accepted
        out["depth"][tag] = [round(reached[d] / reached[d - 1], 4) if reached[d - 1] else 0.0
                             for d in range(1, k + 1)]
        out["tokens_per_round"][tag] = round((accepted + rounds) / rounds, 4) if rounds else 0.0
    return out


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


class _Clock:
    """The wall seconds a run has taken over all the invocations of its plan: with a
    checkpoint folder, the earlier ones' total is kept there (elapsed.json, rewritten at most
    every `every` seconds as progress is reported) and this invocation's time adds to it. A
    run of another plan on the same folder counts from zero (the samples it reuses took
    time it does not count)."""

    def __init__(self, folder: Path | None, plan: DistillPlan, every: float = 10.0) -> None:
        self.file = None if folder is None else folder / "elapsed.json"
        self.plan = dataclasses.asdict(plan)
        earlier = json.loads(self.file.read_text()) if self.file is not None and self.file.is_file() else {}
        if not _same_plan(earlier.get("plan"), plan):
            earlier = {}
        self.earlier = float(earlier.get("seconds", 0.0))
        self.invocations = int(earlier.get("invocations", 0)) + 1
        self.every = every
        self.began = self.written = time.perf_counter()
        self.keep()

    def seconds(self) -> float:
        return self.earlier + time.perf_counter() - self.began

    def keep(self) -> None:
        """Write the total so far to the folder (whole, then renamed)."""
        self.written = time.perf_counter()
        if self.file is not None:
            part = self.file.with_suffix(".part")
            part.write_text(json.dumps({"plan": self.plan, "seconds": round(self.seconds(), 1),
                                        "invocations": self.invocations}))
            part.replace(self.file)

    def reporting(self, progress: Progress) -> Progress:
        """`progress`, keeping the total at most every `every` seconds on the way."""
        def report(stage: str, done: int, total: int) -> None:
            if time.perf_counter() - self.written >= self.every:
                self.keep()
            progress(stage, done, total)
        return report


def distill(target: HFModel, tokenizer: Any, plan: DistillPlan, path: str | Path, *,
            progress: Progress | None = None, checkpoint: str | Path | None = None,
            resume: bool = False) -> dict[str, Any]:
    """Train a head for `target` as `plan` says and save it at `path` (+ its .json card).

    Args:
        checkpoint: a folder where sampled batches and the training state are kept as the run
            goes (None: nothing kept); a run given a folder with an earlier run of the same
            plan and target continues it.
        resume: require `checkpoint` to hold an earlier run (a missing folder is an error).

    Returns:
        The card: target fingerprint, vocabulary size, the plan, losses, held-out acceptance
        (alpha, per depth, tokens per round, fan-out hit rates), data size, the wall seconds
        taken over all the invocations of the run ("invocations": 1 when never interrupted).
    """
    if not isinstance(plan, DistillPlan):
        raise TypeError(f"plan: expected a DistillPlan, got {type(plan).__name__}")
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"path: expected a .safetensors file name, got {str(path)!r}")
    taps = plan.tap_layers()
    try:  # before any sampling, not after it
        target.check_taps(taps)
    except ValueError as err:
        raise ValueError(f"plan: taps {plan.taps!r} name layers this target lacks: expected indices in "
                         f"[0, {target.layers - 1}), got {taps}") from err
    folder = checkpoint_folder(checkpoint, plan, target, resume=resume)
    clock = _Clock(folder, plan)
    report = clock.reporting(progress or (lambda stage, done, total: None))
    torch.manual_seed(plan.seed)
    with torch.no_grad():
        texts = training_prompts(plan.prompts, plan.topics)
        data = sample_rows(target, tokenizer, texts, plan, plan.seed, report, "sampling", folder)
        grounded: list[str] = []
        if plan.grounded:
            passages = [passage(tokenizer, ids[len(encode_text(tokenizer, t)):].tolist())
                        for (ids, _, _), t in zip(data, texts, strict=True)]
            grounded = grounded_prompts(passages, plan.grounded)
            data += sample_rows(target, tokenizer, grounded, plan, plan.seed + len(data), report,
                                "sampling grounded", folder)
        for j in range(1, plan.samples):  # further samples: own seeds, the next temperatures
            seed = plan.seed + SAMPLE_SEEDS * j
            data += sample_rows(target, tokenizer, texts, plan, seed, report, f"sampling {j + 1}", folder,
                                shift=j)
            if grounded:
                data += sample_rows(target, tokenizer, grounded, plan, seed + len(texts), report,
                                    f"sampling grounded {j + 1}", folder, shift=j)
    rows = [ids.tolist() for ids, _, _ in data]
    keep = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    head = DraftHead(target, vocab=vocabulary(rows, plan.vocab, target.vocab_size, keep),
                     taps=taps, layers=plan.layers)
    with torch.no_grad():
        data = with_taps(target, data, taps, report, folder)
    losses = _train(head, data, plan, report, folder)
    probe = held_out(target, HeadDrafter(HeadModel(head)), tokenizer, k=plan.k,
                     new_tokens=plan.held_out_tokens)
    fan_out = held_out_fan_out(target, head, tokenizer, new_tokens=plan.held_out_tokens)
    table = held_out_table(target, head, tokenizer, k=plan.k, new_tokens=plan.held_out_tokens)
    card = {"held_out_by_temperature": table,**fingerprints(target), "vocab": int(head.vocab.numel()),
            "plan": dataclasses.asdict(plan), "epoch_losses": [round(x, 5) for x in losses],
            "held_out_alpha": probe["alpha"], "held_out_depth": probe["depth"],
            "held_out_tokens_per_round": probe["tokens_per_round"],
            "held_out_fan_out": fan_out, "training_rows": len(rows),
            "training_tokens": sum(len(r) for r in rows), "seconds": round(clock.seconds()),
            "invocations": clock.invocations, "torch_threads": torch.get_num_threads()}
    save_head(head.half(), path, card)
    head.float()
    return card


def held_out_table(target: HFModel, head: DraftHead, tokenizer: Any, *, k: int, new_tokens: int
                   ) -> dict[str, dict[str, dict[str, Any]]]:
    """`held_out` at each of `HELD_OUT_TEMPERATURES`, keyed by the temperature's text."""
    drafter = HeadDrafter(HeadModel(head))
    with torch.no_grad():
        return {f"{t:g}": held_out(target, drafter, tokenizer, k=k, new_tokens=new_tokens, temperature=t)
                for t in HELD_OUT_TEMPERATURES}


def evaluate_held_out(target: HFModel, tokenizer: Any, path: str | Path) -> dict[str, Any]:
    """Measure the held-out table (`held_out_table`) of the head at `path` for `target` and
    write it into its card as `held_out_by_temperature`; the weights and the rest of the card
    stay as they are.

    Returns:
        The card as written.
    """
    path = Path(path)
    head = load_head(path, target).float()
    card_path = path.with_suffix(".json")
    card: dict[str, Any] = json.loads(card_path.read_text())
    plan = card.get("plan", {})
    card["held_out_by_temperature"] = held_out_table(
        target, head, tokenizer, k=int(plan.get("k", DistillPlan().k)),
        new_tokens=int(plan.get("held_out_tokens", DistillPlan().held_out_tokens)))
    card_path.write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
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
