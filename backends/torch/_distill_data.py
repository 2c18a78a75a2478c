"""The data of `specsample distill`: the target's own samples, kept in a checkpoint folder.

The target samples continuations of the training prompts (`_distill_prompts`), batched,
keeping what its sampling forwards compute anyway: the features f_t and the log-normaliser
of the logits at every position. A head that fuses the target's low and middle layers
(`DraftHead` with taps) also needs those layers' outputs at every position: one more
forward over each sampled row gives them (`with_taps`), so the samples serve every recipe.
Each sampled batch, and the taps of a run, are written to the checkpoint folder as they
finish and read back on a later run of the same sampling settings.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from specsample.api.runner import encode_text
from specsample.core.cache import rollback
from specsample.core.params import SamplingParams
from specsample.core.rng import Stream, uniforms
from specsample.core.sample import sample
from specsample.core.warp import warp
from specsample.drafters.head import DistillPlan

from ._distill_prompts import ALL_TOPICS, OPEN_STYLES, open_prompts
from ._fast import hf_config
from .head_file import fingerprints
from .model import HFModel

__all__ = ["SAMPLING_FIELDS", "Progress", "Row", "checkpoint_folder", "passage", "recorded_plan",
           "sample_rows", "training_prompts", "vocabulary", "with_taps"]

Progress = Callable[[str, int, int], None]  # (stage, done, total)
# Rows per forward of the taps pass.
TAP_BATCH = 16


def training_prompts(count: int, topics: int = DistillPlan.topics) -> list[str]:
    """The first `count` open training prompts (topic x instruction) on `topics` topics."""
    if not 1 <= topics <= ALL_TOPICS:
        raise ValueError(f"topics: expected an int in [1, {ALL_TOPICS}] (the topics there are), got {topics}")
    most = topics * len(OPEN_STYLES)
    if not 1 <= count <= most:
        raise ValueError(f"prompts: expected an int in [1, {most}] ({topics} topics x {len(OPEN_STYLES)} "
                         f"instructions; more topics allow more, up to {ALL_TOPICS}), got {count}")
    return open_prompts(count, topics)


def passage(tokenizer: Any, ids: Sequence[int], limit: int = 600) -> str:
    """The target's text, cut after its last full sentence within `limit` characters."""
    text = str(tokenizer.decode(ids, skip_special_tokens=True)).strip()
    if len(text) <= limit:
        return text
    cut = max(text.rfind(end, 0, limit) for end in (". ", ".\n", "! ", "? "))
    return text[:cut + 1] if cut > limit // 3 else text[:limit]


Row = tuple[Tensor, Tensor, Tensor]  # ids [L], features [L, D], log-normaliser of the logits [L]


def _batches(count: int, batch: int, groups: int) -> list[tuple[int, list[int]]]:
    """(first position, prompt indices) of each sampling batch: the prompts in groups by index
    modulo `groups` (one temperature each), each group cut into batches of `batch`."""
    order = sorted(range(count), key=lambda i: (i % groups, i))
    out = []
    for g in range(groups):
        members = [i for i in order if i % groups == g]
        first = order.index(members[0]) if members else 0
        out += [(first + j, members[j:j + batch]) for j in range(0, len(members), batch)]
    return out


def sample_rows(target: HFModel, tokenizer: Any, texts: Sequence[str], plan: DistillPlan, seed: int,
            progress: Progress, stage: str, folder: Path | None = None, *, shift: int = 0) -> list[Row]:
    """Plain sampling of each prompt, batched, keeping what every forward computes anyway:
    the features and the logits' log-normaliser of each position (no second pass).

    Prompt i is sampled at the plan's (i + shift)-th temperature in turn. A row holds the prompt and
    the sampled tokens except the last one, whose features no forward computed. The tokens
    are those `generate_plain` samples with the same seed. With a `folder`, each batch's rows
    are written there when it finishes and read back instead of sampled again.
    """
    prompts = [encode_text(tokenizer, p) for p in texts]
    temperatures = plan.sampling_temperatures()
    rows: list[Row | None] = [None] * len(prompts)
    for start, members in _batches(len(prompts), plan.batch, len(temperatures)):
        params = SamplingParams(temperature=temperatures[(members[0] + shift) % len(temperatures)])
        saved = None if folder is None else folder / f"{stage.replace(' ', '-')}-{start:06d}.pt"
        if saved is not None and saved.is_file():
            got = [(ids, f.float(), n) for ids, f, n in torch.load(saved)]
        else:
            got = _sample_batch(target, [prompts[i] for i in members], params, plan.new_tokens,
                                tokenizer.eos_token_id, seed + start)
            if saved is not None:  # written whole, then renamed: never a half-written file
                torch.save(got, saved.with_suffix(".part"))
                saved.with_suffix(".part").replace(saved)
        for i, row in zip(members, got, strict=True):
            rows[i] = row
        progress(stage, sum(r is not None for r in rows), len(prompts))
    return [r for r in rows if r is not None]


def _sample_batch(target: HFModel, chunk: list[list[int]], params: SamplingParams, new_tokens: int,
                  eos: int | None, seed: int) -> list[Row]:
    """One sampling batch of `_sample` (uniforms keyed by `seed`)."""
    rows: list[Row] = []
    batch, width = len(chunk), max(len(p) for p in chunk)
    lengths = torch.tensor([len(p) for p in chunk])
    ids = torch.tensor([p + [0] * (width - len(p)) for p in chunk])
    cache = target.new_cache(batch, width + new_tokens)
    feats: list[list[Tensor]] = [[] for _ in chunk]
    norms: list[list[Tensor]] = [[] for _ in chunk]
    tokens = [list(p) for p in chunk]
    # The top feature alone: a target that a fused head has tapped carries its taps after it.
    top = slice(0, int(hf_config(target.module).hidden_size))
    if width > 1:
        logits, features, cache = target.forward_features(ids[:, :-1], cache)
        features = features[..., top]
        lse = torch.logsumexp(logits.double(), -1).float()
        for b, p in enumerate(chunk):
            feats[b].append(features[b, :len(p) - 1])
            norms[b].append(lse[b, :len(p) - 1])
    cache = rollback(cache, lengths - 1)
    done = torch.zeros(batch, dtype=torch.bool)
    last = ids.gather(1, (lengths - 1)[:, None])
    for step in range(new_tokens):
        logits, features, cache = target.forward_features(last, cache)
        features = features[..., top]
        lse = torch.logsumexp(logits.double(), -1).float()
        u = uniforms(seed, step, batch, 1, stream=Stream.PLAIN, like=last)[:, 0]
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
    return rows


def vocabulary(rows: Sequence[list[int]], size: int, total: int, keep: Sequence[int]) -> Tensor | None:
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


SAMPLING_FIELDS = ("prompts", "topics", "grounded", "new_tokens", "temperature", "temperatures", "samples",
                   "batch", "seed")


def recorded_plan(recorded: Any) -> dict[str, Any]:
    """A plan recorded in a checkpoint folder, as a dict of every field: a field it lacks was
    added after it was written, and that run used the field's default."""
    return {**dataclasses.asdict(DistillPlan()), **(recorded if isinstance(recorded, dict) else {})}


def _sampling(plan: DistillPlan) -> dict[str, Any]:
    return {name: getattr(plan, name) for name in SAMPLING_FIELDS}


def checkpoint_folder(folder: str | Path | None, plan: DistillPlan, target: HFModel, *, resume: bool
                ) -> Path | None:
    """The checkpoint folder, made if new. One whose samples are another plan's or target's
    is refused (naming what differs), as is a missing one to `resume`; one whose samples
    match but whose training state is another plan's keeps the samples and trains anew."""
    if folder is None:
        if resume:
            raise ValueError("checkpoint: expected the folder of the run to resume, got none")
        return None
    folder = Path(folder)
    if resume and not folder.is_dir():
        raise FileNotFoundError(f"checkpoint: expected the folder of an earlier run to resume, got "
                                f"{str(folder)!r}, which does not exist")
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"checkpoint: expected a folder, got the file {str(folder)!r}")
    folder.mkdir(parents=True, exist_ok=True)
    settings = _sampling(plan)
    run = {"plan": settings, **fingerprints(target)}
    record = folder / "run.json"
    if record.is_file():
        earlier = json.loads(record.read_text())
        recorded = recorded_plan(earlier.get("plan"))
        differ = sorted(k for k in settings if recorded[k] != settings[k])
        if earlier.get("target_fingerprint") != run["target_fingerprint"]:
            differ.append("target")
        if differ:
            raise ValueError(f"checkpoint: {str(folder)!r} holds a run with other settings "
                             f"({', '.join(differ)}); use another folder, or the same settings to "
                             f"continue it")
    else:
        record.write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")
    return folder


def with_taps(target: HFModel, rows: list[Row], taps: tuple[int, ...], progress: Progress,
              folder: Path | None = None) -> list[Row]:
    """`rows` with each position's features widened by the outputs of the target's layers
    `taps` ([L, D * (1 + len(taps))], as a target tapped there gives them; `HFModel.tap`):
    one forward over each row, batched. With a `folder`, the taps are kept there
    (taps-I-J.pt) and read back on a later run."""
    if not taps:
        return rows
    saved = None if folder is None else folder / f"taps-{'-'.join(map(str, taps))}.pt"
    if saved is not None and saved.is_file():
        kept: list[Tensor] = torch.load(saved)
        if len(kept) != len(rows) or any(len(k) != len(ids)
                                         for k, (ids, _, _) in zip(kept, rows, strict=True)):
            raise ValueError(f"checkpoint: {str(saved)!r} holds the taps of other samples; remove it")
    else:
        target.tap(taps)
        kept = []
        width = int(rows[0][1].shape[1])
        for start in range(0, len(rows), TAP_BATCH):
            chunk = [ids for ids, _, _ in rows[start:start + TAP_BATCH]]
            longest = max(len(ids) for ids in chunk)
            # Padded at the end: a causal forward's earlier positions do not see it.
            batch = torch.stack([torch.nn.functional.pad(ids, (0, longest - len(ids))) for ids in chunk])
            # No logits: the features alone.
            _, features, _ = target.forward_select(batch.to(target.device),
                                                   target.new_cache(len(chunk), longest), None, features=True)
            assert features is not None
            kept += [features[b, :len(ids), width:].float().cpu().clone() for b, ids in enumerate(chunk)]
            progress("taps", len(kept), len(rows))
        if saved is not None:  # written whole, then renamed: never a half-written file
            torch.save(kept, saved.with_suffix(".part"))
            saved.with_suffix(".part").replace(saved)
    return [(ids, torch.cat([f, k.to(f.device)], dim=-1), n)
            for (ids, f, n), k in zip(rows, kept, strict=True)]
