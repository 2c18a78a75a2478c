"""The transformers-style door: model.generate's inputs and layout, the core loop inside."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch
from specsample_backends.torch import HFModel, generate_like_hf, hf, loading
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from specsample.api.runner import encode_text
from specsample.core.params import SamplingParams

TINY: dict[str, Any] = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                            num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=101, max_position_embeddings=128,
                            initializer_range=0.3)  # varied greedy text (not one repeated token)
NEW = 12


def _tiny(seed: int) -> LlamaForCausalLM:
    """A random Llama in float64, so that no float near-tie can separate two exact forwards."""
    torch.manual_seed(seed)
    return _as(LlamaForCausalLM(LlamaConfig(**TINY)), torch.float64)


def _as(model: LlamaForCausalLM, dtype: torch.dtype) -> LlamaForCausalLM:
    """`model` in eval mode and `dtype`, in place."""
    torch.nn.Module.to(model, dtype=dtype)
    torch.nn.Module.train(model, False)
    return model


@pytest.fixture(scope="module")
def tiny() -> Tiny:
    """A target and an assistant close to it (its weights plus noise: long accepted runs)."""
    target = _tiny(0)
    assistant = copy.deepcopy(target)
    torch.manual_seed(1)
    with torch.no_grad():
        for weight in assistant.parameters():
            weight.add_(0.05 * weight.std() * torch.randn_like(weight))
    return target, assistant


def _left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def _right_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


def _tiny_rows() -> list[list[int]]:
    torch.manual_seed(2)
    return [torch.randint(3, 101, (n,)).tolist() for n in (9, 5, 2, 8)]


Tiny = tuple[LlamaForCausalLM, LlamaForCausalLM]


def _config(**fields: Any) -> GenerationConfig:
    return GenerationConfig(**fields)  # type: ignore[no-untyped-call]  # unannotated in transformers


def _hf(module: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None, **kwargs: Any) -> torch.Tensor:
    with torch.inference_mode():
        out = module.generate(ids, attention_mask=mask, **kwargs)  # type: ignore[operator]
    assert isinstance(out, torch.Tensor)
    return out


# --- the tiny Llama: exact equality with transformers -------------------------------------

def test_tiny_greedy_equals_transformers_with_an_assistant(tiny: Tiny) -> None:
    target, assistant = tiny
    ids, mask = _left_padded(_tiny_rows(), pad=0)
    want = _hf(target, ids, mask, do_sample=False, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    got = generate_like_hf(target, ids, mask, assistant_model=assistant, do_sample=False,
                           max_new_tokens=NEW, eos_token_id=None, pad_token_id=0, k=3)
    assert got.dtype == torch.int64 and got.shape == (4, ids.shape[1] + NEW)
    assert torch.equal(got, want)
    for drafter in ("lookup", "early-exit:2", "int8"):  # the torch backend's drafters by name
        assert torch.equal(generate_like_hf(target, ids, mask, drafter=drafter, do_sample=False,
                                            max_new_tokens=NEW, eos_token_id=None, pad_token_id=0), want)


def _ends(rows: list[list[int]], token: int) -> list[int | None]:
    """Where `token` first occurs in each row (None: nowhere)."""
    return [row.index(token) if token in row else None for row in rows]


def test_padding_after_eos_matches_transformers(tiny: Tiny) -> None:
    """An EOS that ends rows at different steps and leaves others running: the whole tensor equals
    transformers' (pads after each row's EOS, as wide as the longest row); so does a list of
    EOS ids, and pad_token_id=None (transformers then pads with the first EOS id)."""
    target, assistant = tiny
    ids, mask = _left_padded(_tiny_rows(), pad=0)
    width = ids.shape[1]
    free = _hf(target, ids, mask, do_sample=False, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    new = free[:, width:].tolist()
    # The EOS whose first occurrences end the most rows at distinct steps.
    eos = max(range(TINY["vocab_size"]), key=lambda t: (len({e for e in _ends(new, t) if e is not None}), -t))
    ends = _ends(new, eos)
    assert len({e for e in ends if e is not None}) >= 2 and None in ends, ends  # a layout worth checking
    for eos_ids, pad in ((eos, 100), ([eos, new[2][1]], 99), (eos, None)):
        want = _hf(target, ids, mask, do_sample=False, max_new_tokens=NEW, eos_token_id=eos_ids,
                   pad_token_id=pad)
        got = generate_like_hf(target, ids, mask, assistant_model=assistant, do_sample=False,
                               max_new_tokens=NEW, eos_token_id=eos_ids, pad_token_id=pad, k=3)
        assert got.shape == want.shape and torch.equal(got, want), (eos_ids, pad, got, want)
        stops = [eos_ids] if isinstance(eos_ids, int) else eos_ids
        padded = [row for row in got[:, width:].tolist() if any(t in stops for t in row[:-1])]
        assert padded and all(row[-1] == (eos if pad is None else pad) for row in padded)


def test_an_off_by_one_in_the_pad_conversion_is_caught(tiny: Tiny,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative controls: the exact comparison with transformers fails when a prompt takes one pad
    too many, or when the new tokens land one column late."""
    target, _ = tiny
    ids, mask = _left_padded(_tiny_rows(), pad=0)
    width = ids.shape[1]
    kwargs: dict[str, Any] = dict(do_sample=False, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    want = _hf(target, ids, mask, **kwargs)
    assert torch.equal(generate_like_hf(target, ids, mask, drafter="lookup", **kwargs), want)
    spans = hf.prompt_spans

    def one_pad_too_many(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        starts, lengths = spans(m)
        early = (starts > 0).to(torch.int64)
        return starts - early, lengths + early

    monkeypatch.setattr(hf, "prompt_spans", one_pad_too_many)
    assert not torch.equal(generate_like_hf(target, ids, mask, drafter="lookup", **kwargs), want)
    monkeypatch.setattr(hf, "prompt_spans", spans)
    layout = hf.to_hf_layout

    def one_late(ids_: torch.Tensor, *args: Any) -> torch.Tensor:
        out = layout(ids_, *args)
        return torch.cat([out[:, :width], torch.zeros_like(out[:, :1]), out[:, width:-1]], dim=1)

    monkeypatch.setattr(hf, "to_hf_layout", one_late)
    late = generate_like_hf(target, ids, mask, drafter="lookup", **kwargs)
    assert late.shape == want.shape and not torch.equal(late, want)


def test_right_padding_gives_the_same_new_tokens(tiny: Tiny) -> None:
    target, assistant = tiny
    rows = _tiny_rows()
    left, left_mask = _left_padded(rows, pad=0)
    right, right_mask = _right_padded(rows, pad=0)
    kwargs: dict[str, Any] = dict(do_sample=False, max_new_tokens=NEW, eos_token_id=int(rows[0][0]),
                                  pad_token_id=7)
    a = generate_like_hf(target, left, left_mask, assistant_model=assistant, **kwargs)
    b = generate_like_hf(target, right, right_mask, assistant_model=assistant, **kwargs)
    width = left.shape[1]
    assert torch.equal(b[:, :width], right) and torch.equal(a[:, :width], left)  # the input as given
    assert torch.equal(a[:, width:], b[:, width:])
    # Padding on both sides is contiguous too.
    both = torch.tensor([[0, 5, 6, 7, 0], [4, 5, 6, 7, 8]])
    both_mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    out = generate_like_hf(target, both, both_mask, max_new_tokens=4, eos_token_id=None, pad_token_id=0)
    alone = generate_like_hf(target, torch.tensor([[5, 6, 7]]), max_new_tokens=4, eos_token_id=None)
    assert torch.equal(out[0, 5:], alone[0, 3:])


@pytest.mark.filterwarnings("ignore:Using the model-agnostic default `max_length`")
def test_lengths_and_a_missing_mask_as_in_transformers(tiny: Tiny) -> None:
    target, _ = tiny
    ids, mask = _left_padded(_tiny_rows(), pad=0)
    width = ids.shape[1]
    base: dict[str, Any] = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    cases: list[dict[str, Any]] = [{"max_length": width + 5}, {},
                                   {"max_new_tokens": 3, "max_length": width + 9}]
    for lengths in cases:
        want = _hf(target, ids, mask, **base, **lengths)  # {}: transformers' 20 new tokens
        assert torch.equal(generate_like_hf(target, ids, mask, **base, **lengths), want), lengths
    # No mask: inferred from pad_token_id when it occurs in the ids and is no EOS, as transformers does.
    want = _hf(target, ids, None, do_sample=False, max_new_tokens=4, eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate_like_hf(target, ids, None, max_new_tokens=4, eos_token_id=None,
                                        pad_token_id=0), want)
    assert torch.equal(want, _hf(target, ids, mask, do_sample=False, max_new_tokens=4, eos_token_id=None,
                                 pad_token_id=0))
    with pytest.raises(ValueError, match="max_length: expected more than the input's width 9"):
        generate_like_hf(target, ids, mask, max_length=width)


# --- sampling --------------------------------------------------------------------------------

def test_sampled_runs_are_reproducible_and_laid_out_by_row(tiny: Tiny) -> None:
    target, assistant = tiny
    ids, mask = _left_padded(_tiny_rows(), pad=0)
    width, pad = ids.shape[1], 100
    setting = hf.settings(target, do_sample=True, temperature=0.8, top_k=20)
    assert setting.params == SamplingParams(temperature=0.8, top_k=20)
    kwargs: dict[str, Any] = dict(do_sample=True, temperature=0.8, top_k=20, max_new_tokens=NEW,
                                  pad_token_id=pad)
    free = generate_like_hf(target, ids, mask, assistant_model=assistant, eos_token_id=None, seed=3, **kwargs)
    assert free.shape == (4, width + NEW) and torch.equal(free[:, :width], ids)
    eos = int(free[0, width + 2])
    runs = [generate_like_hf(target, ids, mask, assistant_model=assistant, eos_token_id=eos, seed=seed,
                             **kwargs) for seed in (3, 3, 4)]
    assert torch.equal(runs[0], runs[1])  # same seed, same tokens
    assert not torch.equal(runs[0], runs[2])  # another seed, other tokens
    for out in runs:
        assert torch.equal(out[:, :width], ids)
        lengths = []
        for row in out[:, width:].tolist():
            end = row.index(eos) + 1 if eos in row else len(row)
            assert all(t == pad for t in row[end:]), row  # only padding after the EOS
            assert end == NEW or eos in row  # a row without EOS made all its tokens
            lengths.append(end)
        assert out.shape[1] == width + max(lengths)  # as wide as the longest row
    assert eos in runs[0][0, width: width + 3].tolist()  # row 0 ends where the free run drew it


# --- what is refused, and why ------------------------------------------------------------------

def test_unsupported_fields_are_refused_by_name(tiny: Tiny) -> None:
    target, _ = tiny
    ids, mask = _left_padded(_tiny_rows(), pad=0)
    with pytest.raises(ValueError, match=r"num_beams: got 2 \(from keyword argument\).*pass num_beams=1"):
        generate_like_hf(target, ids, mask, num_beams=2, max_new_tokens=4)
    config = _config(repetition_penalty=1.2, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"repetition_penalty: got 1\.2 \(from generation_config\)"):
        generate_like_hf(target, ids, mask, generation_config=config)
    refused: list[tuple[str, Any]] = [
        ("num_return_sequences", 2), ("no_repeat_ngram_size", 3), ("output_scores", True),
        ("return_dict_in_generate", True), ("min_new_tokens", 2), ("typical_p", 0.5),
        ("suppress_tokens", [3]), ("cache_implementation", "quantized"), ("prompt_lookup_num_tokens", 3),
        ("stop_strings", ["x"])]
    for name, value in refused:
        with pytest.raises(ValueError, match="^" + re.escape(f"{name}: got {value!r}")):
            generate_like_hf(target, ids, mask, max_new_tokens=2, **{name: value})
    own = copy.copy(target)
    own.generation_config = _config(no_repeat_ngram_size=2)
    with pytest.raises(ValueError, match=r"no_repeat_ngram_size: got 2 \(from model\.generation_config\)"):
        generate_like_hf(own, ids, mask, max_new_tokens=2)
    # A keyword overrides the model's config, as in transformers; tolerated fields pass.
    out = generate_like_hf(own, ids, mask, max_new_tokens=2, no_repeat_ngram_size=0, use_cache=False,
                           renormalize_logits=True, bos_token_id=1, output_attentions=False,
                           cache_implementation="static")
    assert out.shape == (4, ids.shape[1] + 2)
    assert set(hf.SUPPORTED).isdisjoint(hf.TOLERATED)


def test_bad_inputs_are_clear_errors(tiny: Tiny) -> None:
    target, assistant = tiny
    ids, mask = _left_padded(_tiny_rows(), pad=0)
    gap = mask.clone()
    gap[0, 4] = 0
    with pytest.raises(ValueError, match=r"attention_mask: expected each row's ones to be contiguous.*row 0"):
        generate_like_hf(target, ids, gap, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"attention_mask: expected at least one 1 per row, got none in "
                                         r"rows \[1\]"):
        generate_like_hf(target, ids, torch.cat([mask[:1], torch.zeros_like(mask[1:2]), mask[2:]]),
                         max_new_tokens=2)
    with pytest.raises(ValueError, match=r"attention_mask: expected only 0 and 1, got also \[2\.0\]"):
        generate_like_hf(target, ids, mask * 2, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"attention_mask: expected input_ids' shape \[4, 9\], got \[4, 8\]"):
        generate_like_hf(target, ids, mask[:, 1:], max_new_tokens=2)
    with pytest.raises(TypeError, match="input_ids: expected a torch tensor"):
        generate_like_hf(target, ids.tolist(), max_new_tokens=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"input_ids: expected a non-empty tensor \[batch, length\], got "
                                         r"shape \[9\]"):
        generate_like_hf(target, ids[0], max_new_tokens=2)
    with pytest.raises(TypeError, match=r"input_ids: expected integer token ids, got dtype torch\.float32"):
        generate_like_hf(target, ids.float(), max_new_tokens=2)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['max_tokens'\]"):
        generate_like_hf(target, ids, mask, max_tokens=2)
    with pytest.raises(ValueError, match="assistant_model, drafter: expected at most one of them, got both"):
        generate_like_hf(target, ids, mask, assistant_model=assistant, drafter="lookup", max_new_tokens=2)
    with pytest.raises(ValueError, match=r"temperature: expected > 0 with do_sample=True, got 0"):
        generate_like_hf(target, ids, mask, do_sample=True, temperature=0.0, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"eos_token_id: expected an int, a non-empty list"):
        generate_like_hf(target, ids, mask, eos_token_id=[], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens: expected an int >= 1, got 0"):
        hf.settings(target, max_new_tokens=0)
    with pytest.raises(TypeError, match="generation_config: expected a transformers GenerationConfig"):
        generate_like_hf(target, ids, mask, generation_config={"max_new_tokens": 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model: expected a transformers causal LM"):
        generate_like_hf(object(), ids, mask, max_new_tokens=2)  # type: ignore[arg-type]
    torch.manual_seed(3)
    wider = _as(LlamaForCausalLM(LlamaConfig(**{**TINY, "vocab_size": 128})), torch.float64)
    with pytest.raises(ValueError, match=r"assistant_model: its vocabulary \(128\) differs from the model's "
                                         r"\(101\); pass tokenizer and assistant_tokenizer"):
        generate_like_hf(target, ids, mask, assistant_model=wider, max_new_tokens=2)


def test_settings_merge_as_transformers_does(tiny: Tiny) -> None:
    target, _ = tiny
    own = copy.copy(target)
    own.generation_config = _config(temperature=0.6, top_p=0.9, eos_token_id=[5, 6], do_sample=True)
    setting = hf.settings(own)
    assert setting.params == SamplingParams(temperature=0.6, top_k=50, top_p=0.9)  # transformers' top_k 50
    assert setting.eos_token_ids == (5, 6) and setting.pad_token_id == 5  # pad: the first EOS
    assert setting.max_new_tokens is None and setting.default_length and setting.new_tokens(9) == 20
    assert setting.new_tokens(120, max_positions=128) == 8  # capped at max_position_embeddings
    greedy = hf.settings(own, _config(do_sample=False, top_k=0), temperature=0.3)
    assert greedy.params == SamplingParams(temperature=0.0)  # greedy: the sampling fields are unused
    sampled = hf.settings(own, top_k=0, top_p=1.0, min_p=0.1)
    assert sampled.params == SamplingParams(temperature=0.6, min_p=0.1)  # 0 and 1.0 are off
    assert not hf.settings(own, max_length=30).default_length
    assert hf.settings(own, max_length=None).new_tokens(9) == 20  # None is unset


# --- the real model (SmolLM2-135M) -------------------------------------------------------------

TEXTS = ["Name a colour.", "Write a haiku about rain.", "What is 2 + 2?", "Say hello in French.",
         "List three fruits: apple, banana, cherry. Repeat the list.", "Why is the sky blue?",
         "Count from one to five.", "Give a synonym for happy."]
SMOL_NEW = 16


@pytest.fixture(scope="module")
def smol() -> tuple[HFModel, list[list[int]], torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target, its chat-formatted prompts, the left-padded batch and transformers' greedy output."""
    target = loading.load_target("smollm2")
    tok = loading.load_tokenizer("smollm2")
    rows = [encode_text(tok, t) for t in TEXTS]
    ids, mask = _left_padded(rows, pad=int(tok.pad_token_id))
    want = _hf(target.module, ids, mask, do_sample=False, max_new_tokens=SMOL_NEW)
    return target, rows, ids, mask, want


def _near_tie(module: torch.nn.Module, context: list[int], a: int, b: int) -> float:
    with torch.inference_mode():
        logits = module(torch.tensor([context])).logits[0, -1].float()
    return abs(float(logits[a] - logits[b]))


def _same_or_near_tie(module: torch.nn.Module, rows: list[list[int]], got: torch.Tensor,
                      want: torch.Tensor, width: int) -> None:
    """Token for token; a row may differ only from a float32 near-tie of the target's top two logits
    (a K+1-token verify sums in another order than a 1-token decode)."""
    if got.shape == want.shape and torch.equal(got, want):
        return
    for b, prompt in enumerate(rows):
        ours, theirs = got[b, width:].tolist(), want[b, width:].tolist()
        at = next((i for i, (x, y) in enumerate(zip(ours, theirs, strict=False)) if x != y), None)
        if at is not None:
            assert _near_tie(module, prompt + theirs[:at], ours[at], theirs[at]) < 1e-3, (b, at)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["lookup", "early-exit:10"])
def test_smollm2_greedy_equals_model_generate(smol: tuple[HFModel, list[list[int]], torch.Tensor,
                                                          torch.Tensor, torch.Tensor], drafter: str) -> None:
    target, rows, ids, mask, want = smol
    got = generate_like_hf(target, ids, mask, drafter=drafter, do_sample=False, max_new_tokens=SMOL_NEW, k=4)
    assert torch.equal(got[:, : ids.shape[1]], ids)
    _same_or_near_tie(target.module, rows, got, want, ids.shape[1])


@pytest.mark.slow
def test_smollm2_right_padding_gives_the_left_padded_new_tokens(
        smol: tuple[HFModel, list[list[int]], torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    target, rows, ids, _, want = smol
    tok = loading.load_tokenizer("smollm2")
    right, right_mask = _right_padded(rows, pad=int(tok.pad_token_id))
    got = generate_like_hf(target, right, right_mask, drafter="lookup", do_sample=False,
                           max_new_tokens=SMOL_NEW)
    assert torch.equal(got[:, : right.shape[1]], right)
    _same_or_near_tie(target.module, rows, torch.cat([ids, got[:, right.shape[1]:]], dim=1), want,
                      ids.shape[1])


@pytest.mark.slow
def test_transformers_peers_of_a_head_are_its_prompt_lookup_and_its_int8_assistant(smol) -> None:  # type: ignore[no-untyped-def]
    """transformers cannot draft from the target's features: `bench --draft head` rates the
    head against its prompt lookup (4, 10 and K) and its assistant with the int8 self-draft
    (its default schedule and K fixed)."""
    from specsample.bench.peers import hf_variants

    target = smol[0]
    head = loading.load_drafter("head", target)
    variants = hf_variants("head", target, head, 2)
    assert [v.name for v in variants] == ["hf_lookup4", "hf_lookup10", "hf_lookup2", "hf_default", "hf_k2"]
    assistant = variants[3].kwargs["assistant_model"]
    assert "quantized" in repr(assistant).lower() and variants[4].config.num_assistant_tokens == 2
    assert [v.name for v in hf_variants("head:other.safetensors", target, head, None)][:2] == \
        ["hf_lookup4", "hf_lookup10"]
    # The head inside `auto` or `hybrid`: the lookup peers once, not once for each part.
    for name in ("auto:head", "hybrid:head"):
        hybrid = loading.load_drafter(name, target)
        assert [v.name for v in hf_variants(name, target, hybrid, 8)] == \
            ["hf_lookup4", "hf_lookup10", "hf_lookup8", "hf_default", "hf_k8"], name
