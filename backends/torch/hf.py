"""A transformers-style door: speculative sampling called the way `model.generate` is.

    from specsample_backends.torch import generate_like_hf

    out = generate_like_hf(model, batch["input_ids"], batch["attention_mask"],
                           assistant_model=small_model, do_sample=False, max_new_tokens=64)

`generate` takes what a Hugging Face user has at hand: a transformers causal LM, `input_ids`
and `attention_mask` (left- or right-padded), a draft (`assistant_model` or a drafter name)
and a `GenerationConfig` with keyword overrides. It converts the batch to the core's ragged
layout (right-padded ids and `prompt_lengths`), runs the core loop (`specsample.generate.
run_rounds`, what the torch backend runs) on an `HFModel`, and converts back to
`model.generate`'s layout. Every `GenerationConfig` field either takes effect as in
transformers (`SUPPORTED`), cannot change the tokens (`TOLERATED`), or is refused with a
`ValueError` that names it: none is ignored.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from transformers import GenerationConfig

from specsample.core.protocols import Drafter
from specsample.core.rng import Seed
from specsample.core.verifiers import Verifier
from specsample.drafters.model import ModelDrafter
from specsample.engine.generate import run_rounds
from specsample.engine.options import RunOptions
from specsample.engine.policy import KPolicy, k_policy
from specsample.engine.runs import Generation, Step, finish

from . import loading
from ._fast import hf_config
from .compat import check_compatible
from .hf_settings import SUPPORTED, TOLERATED, HFSettings, settings
from .model import HFModel

__all__ = ["DEFAULT_DRAFTER", "SUPPORTED", "TOLERATED", "HFSettings", "generate", "prompt_spans",
           "settings", "to_hf_layout", "to_ragged"]

DEFAULT_DRAFTER = "lookup"  # works on every architecture and device, and costs no memory

def _ids(input_ids: Any, device: torch.device) -> Tensor:
    if not isinstance(input_ids, Tensor):
        raise TypeError(f"input_ids: expected a torch tensor [batch, length] of token ids, as "
                        f"model.generate takes, got {type(input_ids).__name__}")
    if input_ids.ndim != 2 or 0 in input_ids.shape:
        raise ValueError(f"input_ids: expected a non-empty tensor [batch, length], got shape "
                         f"{list(input_ids.shape)}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids: expected integer token ids, got dtype {input_ids.dtype}")
    return input_ids.to(device=device, dtype=torch.int64)


def _mask(attention_mask: Any, ids: Tensor, setting: HFSettings) -> Tensor:
    """The mask as bool [B, W]; None is inferred from the pad id as transformers infers it."""
    if attention_mask is None:
        pad = setting.pad_token_id
        if pad is None or pad in setting.eos_token_ids or not bool((ids == pad).any()):
            return torch.ones_like(ids, dtype=torch.bool)
        return ids != pad
    if not isinstance(attention_mask, Tensor):
        raise TypeError(f"attention_mask: expected a torch tensor [batch, length] or None, got "
                        f"{type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != tuple(ids.shape):
        raise ValueError(f"attention_mask: expected input_ids' shape {list(ids.shape)}, got "
                         f"{list(attention_mask.shape)}")
    mask = attention_mask.to(ids.device)
    if not bool(((mask == 0) | (mask == 1)).all()):
        values = sorted({float(v) for v in mask[(mask != 0) & (mask != 1)].tolist()})[:5]
        raise ValueError(f"attention_mask: expected only 0 and 1, got also {values}")
    return mask == 1


def prompt_spans(attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Where each row's tokens start and how many there are: int64 [B] each.

    Args:
        attention_mask: bool [B, W]; each row's ones must be contiguous (left padding, right
            padding, or both) and at least one.

    Raises:
        ValueError: a row without ones, or whose ones have a gap (the message shows the row).
    """
    mask = attention_mask.to(torch.bool)
    lengths = mask.sum(dim=1)
    empty = (lengths == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"attention_mask: expected at least one 1 per row, got none in rows {empty}")
    starts = mask.to(torch.int8).argmax(dim=1)  # the first 1
    pos = torch.arange(mask.shape[1], device=mask.device)[None, :]
    block = (pos >= starts[:, None]) & (pos < (starts + lengths)[:, None])
    gaps = (block != mask).any(dim=1).nonzero().flatten().tolist()
    if gaps:
        row = gaps[0]
        raise ValueError(f"attention_mask: expected each row's ones to be contiguous (left or right "
                         f"padding), got row {row}: {mask[row].to(torch.int64).tolist()}")
    return starts.to(torch.int64), lengths.to(torch.int64)


def to_ragged(ids: Tensor, starts: Tensor, lengths: Tensor) -> Tensor:
    """The core's layout: row b's tokens `ids[b, starts[b]:starts[b] + lengths[b]]` moved to the
    front, zeros after them: int64 [B, W]."""
    width = ids.shape[1]
    pos = torch.arange(width, device=ids.device)[None, :]
    source = (starts[:, None] + pos).clamp(max=width - 1)
    return torch.where(pos < lengths[:, None], ids.gather(1, source), 0)


def to_hf_layout(ids: Tensor, generation: Generation, eos_token_ids: Sequence[int],
                 pad_token_id: int | None) -> Tensor:
    """`model.generate`'s layout: the input as given, then each row's new tokens up to and with
    its first EOS, then `pad_token_id`; as wide as the input plus the longest row's new tokens.

    Args:
        ids: int64 [B, W], the input as given (its padding included).
        generation: the core's result on the ragged layout (`to_ragged`).
        eos_token_ids: the ids that end a row.
        pad_token_id: the fill; None only when no row ends early (no EOS).
    """
    eos = torch.tensor(list(eos_token_ids), dtype=torch.int64, device=ids.device)
    rows = []
    for b in range(ids.shape[0]):
        new = generation.sequences[b, int(generation.prompt_lengths[b]): int(generation.lengths[b])]
        hits = torch.isin(new, eos).nonzero().flatten()
        rows.append(new[: int(hits[0]) + 1] if hits.numel() else new)
    most = max(int(row.shape[0]) for row in rows)
    if pad_token_id is None and any(int(row.shape[0]) != most for row in rows):
        raise ValueError("pad_token_id: needed to fill rows that ended early, got None")
    out = ids.new_full((ids.shape[0], ids.shape[1] + most), 0 if pad_token_id is None else pad_token_id)
    out[:, : ids.shape[1]] = ids
    for b, row in enumerate(rows):
        out[b, ids.shape[1]: ids.shape[1] + row.shape[0]] = row
    return out


def _until_stopped(steps: Iterator[Step], prompt_lengths: Tensor, eos: Tensor) -> Iterator[Step]:
    """`steps` until every row is done or has generated one of `eos` (the core stops on one id)."""
    for step in steps:
        yield step
        state = step.state
        pos = torch.arange(state.tokens.shape[1], device=state.tokens.device)[None, :]
        new = (pos >= prompt_lengths[:, None]) & (pos < state.lengths[:, None])
        ended = (torch.isin(state.tokens, eos) & new).any(dim=1)
        if bool((state.done | ended).all()):
            return


def _wrap(name: str, model: Any) -> HFModel:
    if isinstance(model, HFModel):
        return model
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"{name}: expected a transformers causal LM (an nn.Module with a config) or an "
                        f"HFModel, got {type(model).__name__}")
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"{name}: expected a decoder-only causal LM, got the encoder-decoder "
                         f"{type(model).__name__}")
    return HFModel(model)


def _assistant(target: HFModel, assistant_model: Any, tokenizer: Any, assistant_tokenizer: Any) -> Drafter:
    draft = _wrap("assistant_model", assistant_model)
    if draft.device != target.device:
        raise ValueError(f"assistant_model: expected the model's device {target.device}, got {draft.device}")
    if draft.own_vocab != target.own_vocab or assistant_tokenizer is not None:
        if tokenizer is None or assistant_tokenizer is None:
            raise ValueError(f"assistant_model: its vocabulary ({draft.own_vocab}) differs from the "
                             f"model's ({target.own_vocab}); pass tokenizer and assistant_tokenizer to "
                             f"check that they mean the same tokens")
        check_compatible(tokenizer, assistant_tokenizer, target.own_vocab, draft.own_vocab)
    if draft.vocab_size != target.vocab_size:
        draft = HFModel(draft.module, vocab_size=target.vocab_size)
    return ModelDrafter(draft)


def _drafter(target: HFModel, assistant_model: Any, drafter: Any, tokenizer: Any,
             assistant_tokenizer: Any) -> Drafter:
    if assistant_model is not None and drafter is not None:
        raise ValueError("assistant_model, drafter: expected at most one of them, got both")
    if assistant_model is not None:
        return _assistant(target, assistant_model, tokenizer, assistant_tokenizer)
    if assistant_tokenizer is not None:
        raise ValueError("assistant_tokenizer: expected only with an assistant_model, got one without")
    if drafter is None or isinstance(drafter, str):
        return loading.load_drafter(drafter or DEFAULT_DRAFTER, target, target_tokenizer=tokenizer)
    if isinstance(drafter, Drafter):
        return drafter
    raise TypeError(f"drafter: expected a name ({', '.join(loading.DRAFTERS)}), a Drafter or None, got "
                    f"{type(drafter).__name__}")


def generate(model: nn.Module | HFModel, input_ids: Tensor, attention_mask: Tensor | None = None, *,
             assistant_model: nn.Module | HFModel | None = None, drafter: str | Drafter | None = None,
             generation_config: GenerationConfig | None = None, k: int | str | KPolicy = 4,
             seed: Seed = 0, verifier: str | Verifier = "token", tokenizer: Any = None,
             assistant_tokenizer: Any = None, **kwargs: Any) -> Tensor:
    """Speculative sampling with `model.generate`'s inputs and output layout.

    Greedy output (do_sample=False) is `model.generate`'s token for token (up to float
    near-ties of the model's two best logits); sampled output follows the same law as
    `model.generate`'s, from specsample's counter-based uniforms (keyed by `seed`), not from
    torch's global generator, so its draws differ from transformers'.

    Args:
        model: a transformers decoder-only causal LM, or an `HFModel` of one (wrap once and
            pass that to avoid re-wrapping on every call).
        input_ids: int [B, W] token ids, as model.generate takes them.
        attention_mask: 0/1 [B, W], or None (then inferred from pad_token_id as transformers
            does). Each row's ones must be contiguous: left padding, right padding or both.
            Right padding works (each row continues from its last token), unlike in
            model.generate.
        assistant_model: a draft transformers model sharing the model's vocabulary (with
            `tokenizer` and `assistant_tokenizer` when the embedding sizes differ).
        drafter: instead of an assistant: a drafter name of the torch backend ("int8",
            "early-exit:N", "lookup", or a model spec), or a `Drafter`. Neither: "lookup".
        generation_config: a transformers GenerationConfig (None: the model's own). Fields merge
            as in transformers: `kwargs`, then this config, then model.generation_config, then
            transformers' defaults (top_k=50 when sampling, 20 new tokens, ...). `SUPPORTED`
            fields take effect, `TOLERATED` ones cannot change the tokens, any other field set
            to a value that changes the tokens is a ValueError naming it.
        k: drafts per round (an int >= 1), "adaptive", or a `KPolicy`.
        seed: the key of the uniforms: one int, or one per row.
        verifier: the acceptance rule, "token" or "block".
        tokenizer, assistant_tokenizer: the models' tokenizers, to check a draft's vocabulary.
        **kwargs: GenerationConfig fields (do_sample=False, max_new_tokens=64, ...).

    Returns:
        int64 [B, W + N] on the model's device: `input_ids` as given (padding included), then
        each row's new tokens; after a row's EOS, and for rows that ended early, pad_token_id
        (the first EOS id when pad_token_id is None). N is the longest row's count.
    """
    target = _wrap("model", model)
    setting = settings(target.module, generation_config, **kwargs)
    ids = _ids(input_ids, target.device)
    starts, lengths = prompt_spans(_mask(attention_mask, ids, setting))
    positions = getattr(hf_config(target.module), "max_position_embeddings", None)
    new = setting.new_tokens(int(ids.shape[1]), positions if isinstance(positions, int) else None)
    draft = _drafter(target, assistant_model, drafter, tokenizer, assistant_tokenizer)
    policy = k if isinstance(k, KPolicy) else k_policy(k)
    eos = setting.eos_token_ids
    run = RunOptions(max_new_tokens=new, params=setting.params, k=policy, seed=seed,
                     eos_token_id=eos[0] if eos else None, prompt_lengths=lengths, verifier=verifier)
    ragged = to_ragged(ids, starts, lengths)
    steps = run_rounds(target, draft, ragged, run)
    if len(eos) > 1:  # the core ends a row on eos[0]; the others are watched here
        steps = _until_stopped(steps, lengths, torch.tensor(eos, device=target.device))
    generation = finish(steps, ragged, run, target.vocab_size)
    return to_hf_layout(ids, generation, eos, setting.pad_token_id)
