"""The draft head's file format: safetensors weights beside a JSON card.

The card names the target's fingerprint (a digest of its config and every weight), so
loading a head for another target is an error, and the weights' digest, so a truncated or
replaced file is one too; it also records what `specsample distill` did and the head's
held-out acceptance, which the scheduler reads as its prior (`head_prior`, `head_fan_out`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from ._fast import hf_config
from .head import DraftHead
from .model import HFModel

__all__ = ["SHIPPED", "SHIPPED_VERSIONS", "fingerprint", "fingerprints", "head_fan_out", "head_file",
           "head_prior", "load_head", "save_head"]

_HEADS = Path(__file__).with_name("heads")
# The head the "head" drafters load for the embedded SmolLM2-135M-Instruct (`specsample
# distill` writes it).
SHIPPED = _HEADS / "smollm2-135m-instruct.safetensors"
# Each shipped head by the recipe that trained it (`specsample distill --recipe`): "head:v1"
# drafts with the first, for comparison.
SHIPPED_VERSIONS = {"v1": _HEADS / "smollm2-135m-instruct-v1.safetensors", "v2": SHIPPED}

_BOOKKEEPING = ("transformers_version", "architectures", "quantization_config")


def fingerprint(target: HFModel, *, bfloat16: bool = False) -> str:
    """A digest of the target's config and every weight: a head is trained for exactly one.

    The config's bookkeeping (where and how it was loaded, the transformers version) is
    left out: the same weights loaded from a GGUF file or from its converted folder are
    the same target. With `bfloat16`, each weight enters rounded to bfloat16 (round to
    nearest even, as a bfloat16 load rounds it) and the config's dtype is left out too: the
    digest that the same target loaded in bfloat16, whose full-precision weights are gone,
    also gives. (The exact digest keeps the config's dtype, so cards written before the
    bfloat16 digest existed still match.)
    """
    skip = _BOOKKEEPING + (("dtype", "torch_dtype") if bfloat16 else ())
    config = {k: v for k, v in hf_config(target.module).to_dict().items()
              if not k.startswith("_") and k not in skip}
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(target.module.state_dict().items()):
        h.update(name.encode())
        weight = tensor.detach()
        if bfloat16 and weight.is_floating_point():
            weight = weight.to(torch.bfloat16)
        h.update(weight.to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:32]


def fingerprints(target: HFModel) -> dict[str, str]:
    """The card's fingerprint fields for a head trained on `target` (held in float32 or
    float64): the exact digest, and the one a bfloat16 load of the same target gives."""
    if target.dtype == torch.bfloat16:
        raise ValueError("target: expected a float32 or float64 target (a bfloat16 one has lost the "
                         "precision the exact fingerprint reads), got bfloat16")
    return {"target_fingerprint": fingerprint(target),
            "target_fingerprint_bfloat16": fingerprint(target, bfloat16=True)}


def save_head(head: DraftHead, path: str | Path, card: dict[str, Any]) -> Path:
    """Write `path` (safetensors) and `path` with suffix .json (the card, with the weights'
    digest) ; returns the card's path."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(weights, str(path))
    card = {**card, "weights_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    card_path = path.with_suffix(".json")
    card_path.write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    return card_path


def head_file(spec: str) -> Path:
    """The head file that the part after "head:" of a drafter name names: a shipped version
    (a key of `SHIPPED_VERSIONS`) or a path."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"head: expected a shipped version ({', '.join(SHIPPED_VERSIONS)}) or a head "
                         f"file's path, got {spec!r}")
    return SHIPPED_VERSIONS.get(spec, Path(spec))


def head_prior(path: str | Path) -> float:
    """The acceptance to assume for a head before any evidence: its card's held-out alpha over
    all prompts (`specsample distill` measures it), or 0.5 where the card has none."""
    card = json.loads(Path(path).with_suffix(".json").read_text())
    alpha = card.get("held_out_alpha", {}).get("all")
    if alpha is None:
        return 0.5
    if not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"head: the card of {path} gives held-out alpha {alpha!r}, expected a rate "
                         f"in [0, 1]")
    return float(alpha)


def head_fan_out(path: str | Path) -> tuple[float, ...] | None:
    """A head's held-out fan-out hit rates over all prompts (`specsample distill` measures
    them: entry m - 1 for m candidates), or None where its card has none."""
    card = json.loads(Path(path).with_suffix(".json").read_text())
    hits = card.get("held_out_fan_out", {}).get("all")
    if hits is None:
        return None
    if not isinstance(hits, list) or not hits or any(
            isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h <= 1 for h in hits):
        raise ValueError(f"head: the card of {path} gives held-out fan-out hit rates {hits!r}, expected "
                         f"a non-empty list of rates in [0, 1]")
    return tuple(float(h) for h in hits)


def load_head(path: str | Path, target: HFModel) -> DraftHead:
    """A head file for `target`.

    Raises:
        FileNotFoundError: no such head or card.
        ValueError: the card names another target (fingerprint), the weights do not
            match the card, or the target is sharded (tensor parallelism).
    """
    from safetensors.torch import load_file

    path = Path(path)
    card_path = path.with_suffix(".json")
    if not path.is_file() or not card_path.is_file():
        raise FileNotFoundError(f"head: expected {path} and its card {card_path}, got "
                                f"{'neither' if not path.exists() else 'no card'}")
    card = json.loads(card_path.read_text())
    if hashlib.sha256(path.read_bytes()).hexdigest() != card.get("weights_sha256"):
        raise ValueError(f"head: the weights in {path} are not the ones its card describes (a truncated, "
                         f"corrupted or replaced file of {path.stat().st_size} bytes)")
    sharded = getattr(target, "parallel", None)
    if sharded is not None:
        raise ValueError(f"target: a draft head drafts for a target on one device, got one sharded over "
                         f"{sharded.size} devices (tensor parallelism)")
    half = target.dtype == torch.bfloat16
    field = "target_fingerprint_bfloat16" if half else "target_fingerprint"
    if field not in card:
        why = (" (a head trained before bfloat16 targets were fingerprinted): load the target in "
               "float32, or retrain the head") if half else ""
        raise ValueError(f"head: the card of {path} has no {field}{why}")
    mine = fingerprint(target, bfloat16=half)
    if card[field] != mine:
        raise ValueError(f"head: {path} was trained for target {card[field]!r}, got target {mine!r}"
                         f"{' (in bfloat16)' if half else ''}: a head drafts only for the target it was "
                         f"trained on")
    weights = load_file(str(path))
    # A head written before heads could fuse taps has none.
    taps = weights.setdefault("taps", torch.zeros(0, dtype=torch.int64))
    # Its layers past the first are "more.N.*" (a one-layer head has none).
    layers = 1 + len({name.split(".")[1] for name in weights if name.startswith("more.")})
    head = DraftHead(target, vocab=weights["vocab"], taps=tuple(int(i) for i in taps.tolist()),
                     layers=layers)
    head.load_state_dict(weights)
    return head
