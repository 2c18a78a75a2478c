"""Whether a separate draft model can propose tokens for a target (same vocabulary)."""

from __future__ import annotations

from typing import Any

__all__ = ["check_compatible"]


def _describe(tokenizer: Any) -> str:
    return f"{type(tokenizer).__name__}({getattr(tokenizer, 'name_or_path', '') or '?'})"


def check_compatible(target_tokenizer: Any, draft_tokenizer: Any, target_vocab: int,
                     draft_vocab: int) -> None:
    """Raise ValueError unless the draft's ids mean the same tokens as the target's.

    Embedding tables padded to different sizes are fine (the draft's logits are
    then cut or padded with -inf to the target's V, see `HFModel(vocab_size=)`),
    as long as every real token id lies below both sizes.

    Args:
        target_tokenizer, draft_tokenizer: transformers tokenizers.
        target_vocab, draft_vocab: the models' logit widths V.
    """
    target_map, draft_map = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_map != draft_map:
        differ = sorted(set(target_map.items()) ^ set(draft_map.items()), key=lambda kv: kv[1])[:3]
        raise ValueError(
            f"draft tokenizer: expected the target's vocabulary, got a different one: target "
            f"{_describe(target_tokenizer)} has {len(target_map)} tokens, draft "
            f"{_describe(draft_tokenizer)} has {len(draft_map)}; e.g. {differ}")
    used = max(target_map.values(), default=-1) + 1
    for name, vocab in (("target_vocab", target_vocab), ("draft_vocab", draft_vocab)):
        if vocab < used:
            raise ValueError(f"{name}: expected >= {used} (the tokenizer's ids), got {vocab}")
