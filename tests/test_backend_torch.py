"""The torch backend: HFModel parity, storage, rollback; self-drafts; loading; errors."""

from __future__ import annotations

import copy

import pytest
import torch
from specsample_backends.torch import HFModel, _fast, create, loading
from specsample_backends.torch._fast import DenseLinear, is_supported
from specsample_backends.torch.compat import check_compatible
from specsample_backends.torch.early_exit import early_exit_draft
from specsample_backends.torch.head import DraftHead, HeadModel
from specsample_backends.torch.quantized import Int8Linear, int8_draft, quantize
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.models.llama import modeling_llama

from specsample.core.cache import rollback
from specsample.core.params import SamplingParams
from specsample.core.protocols import Model, SelectiveModel
from specsample.drafters.lookup import PromptLookupDrafter
from specsample.drafters.model import ModelDrafter
from specsample.engine.generate import generate, generate_plain

ATOL = 1e-4  # float32: the cached, batched forward vs the plain one, on random tiny weights
GREEDY = SamplingParams(temperature=0)
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=101, max_position_embeddings=128)


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=True)).eval()


def _tiny_qwen() -> Qwen2ForCausalLM:
    torch.manual_seed(1)
    return Qwen2ForCausalLM(Qwen2Config(**TINY)).eval()


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    return _tiny_llama()


def _plain(module: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return module(ids[None]).logits[0].float()  # [T, V]


def _ragged(vocab: int) -> tuple[torch.Tensor, list[int]]:
    torch.manual_seed(2)
    return torch.randint(0, vocab, (3, 11)), [11, 4, 8]


def _adapters(module: torch.nn.Module) -> list[HFModel]:
    return [HFModel(module), HFModel(module, fast=False)]  # the fast path, transformers' forward


@pytest.mark.parametrize("make", [_tiny_llama, _tiny_qwen], ids=["llama", "qwen2"])
def test_ragged_batch_logits_equal_plain_hf_per_row(make) -> None:  # type: ignore[no-untyped-def]
    module = make()
    ids, lengths = _ragged(module.config.vocab_size)
    for model in _adapters(module):
        assert isinstance(model, Model)
        assert model.stack is None or is_supported(module)
        cache = model.new_cache(3, 16)
        logits, cache = model.forward(ids, cache)  # [3, 11, V]: rows past their length are padding
        assert logits.dtype == torch.float32 and logits.shape == (3, 11, module.config.vocab_size)
        assert cache.lengths.tolist() == [11, 11, 11]
        for b, n in enumerate(lengths):
            torch.testing.assert_close(logits[b, :n], _plain(module, ids[b, :n]), atol=ATOL, rtol=0)
        # Decode the rest of each row one token at a time from ragged lengths.
        cache = rollback(cache, torch.tensor([2, 2, 2]))
        steps = []
        for t in range(2, 11):
            step, cache = model.forward(ids[:, t: t + 1], cache)
            steps.append(step)
        stepped = torch.cat(steps, dim=1)
        for b, n in enumerate(lengths):
            torch.testing.assert_close(stepped[b, : n - 2], _plain(module, ids[b, :n])[2:], atol=ATOL,
                                       rtol=0)


def test_fast_and_generic_paths_agree(llama: LlamaForCausalLM) -> None:
    ids, _ = _ragged(llama.config.vocab_size)
    fast, generic = HFModel(llama), HFModel(llama, fast=False)
    assert fast.stack is not None and generic.stack is None
    a, _ = fast.forward(ids, fast.new_cache(3, 12))
    b, _ = generic.forward(ids, generic.new_cache(3, 12))
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("fast", [True, False])
def test_forward_select_is_forward_at_the_chosen_columns(llama: LlamaForCausalLM, fast: bool) -> None:
    model = HFModel(llama, fast=fast)
    assert isinstance(model, SelectiveModel)
    ids, _ = _ragged(llama.config.vocab_size)  # [3, 11]
    full, _ = model.forward(ids, model.new_cache(3, 16))
    columns = torch.tensor([10, 3, 0])
    got, features, cache = model.forward_select(ids, model.new_cache(3, 16), columns)
    assert features is None and cache.lengths.tolist() == [11, 11, 11]
    assert torch.equal(got, full[torch.arange(3), columns])  # bit for bit: the head reads the same rows
    # A prefill: no logits, every column's features, and the cache a full forward leaves.
    none, features, cache = model.forward_select(ids[:, :6], model.new_cache(3, 16), None, features=True)
    _, want_features, reference = model.forward_features(ids[:, :6], model.new_cache(3, 16))
    assert none is None and features is not None and torch.equal(features, want_features)
    step, _ = model.forward(ids[:, 6:8], cache)
    want, _ = model.forward(ids[:, 6:8], reference)
    assert torch.equal(step, want)
    with pytest.raises(ValueError, match=r"columns: expected values in \[0, 11\)"):
        model.forward_select(ids, model.new_cache(3, 16), torch.tensor([0, 11, 2]))
    with pytest.raises(TypeError, match="columns: expected an integer array of column indices"):
        model.forward_select(ids, model.new_cache(3, 16), torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"columns: expected shape \[3\], got \[2\]"):
        model.forward_select(ids, model.new_cache(3, 16), torch.tensor([0, 1]))


@pytest.mark.parametrize("subset", [False, True], ids=["all ids", "a subset"])
def test_a_heads_forward_select_is_its_forward_at_the_chosen_columns(llama: LlamaForCausalLM,
                                                                      subset: bool) -> None:
    target = HFModel(llama)
    torch.manual_seed(4)
    head = DraftHead(target, vocab=torch.arange(0, 101, 3) if subset else None)
    with torch.no_grad():
        for weight in head.parameters():
            weight.add_(torch.randn_like(weight) * 0.05)
    model = HeadModel(head)
    ids, _ = _ragged(101)
    _, features, _ = target.forward_features(ids, target.new_cache(3, 16))

    def fresh() -> object:
        cache = model.new_cache(3, 16)
        return model.with_features(cache, features, torch.zeros(3, dtype=torch.int64),
                                   torch.full((3,), 11, dtype=torch.int64))
    full, _ = model.forward(ids, fresh())
    columns = torch.tensor([10, 3, 0])
    got, none, _ = model.forward_select(ids, fresh(), columns)
    assert none is None and torch.equal(got, full[torch.arange(3), columns])
    nothing, _, cache = model.forward_select(ids[:, :6], fresh(), None)
    _, reference = model.forward(ids[:, :6], fresh())
    assert nothing is None
    assert torch.equal(model.forward(ids[:, 6:8], cache)[0], model.forward(ids[:, 6:8], reference)[0])
    with pytest.raises(ValueError, match="features: a draft head gives no features"):
        model.forward_select(ids, fresh(), None, features=True)
    with pytest.raises(ValueError, match=r"columns: expected values in \[0, 11\), got range \[-1, 3\]"):
        model.forward_select(ids, fresh(), torch.tensor([3, -1, 0]))


@pytest.mark.parametrize("fast", [True, False])
def test_storage_never_moves_and_rollback_is_exact(llama: LlamaForCausalLM, fast: bool) -> None:
    model = HFModel(llama, fast=fast)
    cache = model.new_cache(2, 64)
    pointers = [t.untyped_storage().data_ptr() for kv in cache.buffers for t in kv]
    torch.manual_seed(3)
    _, cache = model.forward(torch.randint(0, 101, (2, 6)), cache)
    for i in range(12):  # draft-like steps and verify-like steps with rollbacks
        _, cache = model.forward(torch.randint(0, 101, (2, 1 + i % 4)), cache)
        cache = rollback(cache, cache.lengths - torch.tensor([i % 3, (i + 1) % 3]))
        assert [t.untyped_storage().data_ptr() for kv in cache.buffers for t in kv] == pointers
    # forward 5, roll back 3, forward 3 others == a fresh forward of the kept 2 + the 3 others
    ids, others = torch.randint(0, 101, (2, 5)), torch.randint(0, 101, (2, 3))
    base = model.new_cache(2, 24)
    _, after = model.forward(ids, base)
    got, after = model.forward(others, rollback(after, after.lengths - 3))
    want, _ = model.forward(torch.cat([ids[:, :2], others], 1), model.new_cache(2, 24))
    torch.testing.assert_close(got, want[:, 2:], atol=ATOL, rtol=0)
    assert after.lengths.tolist() == [5, 5]


def test_early_exit_shares_weights_and_equals_a_truncated_model(llama: LlamaForCausalLM) -> None:
    target = HFModel(llama)
    draft = early_exit_draft(target, 2)
    assert draft.stack.embed is target.stack.embed and draft.stack.layers == target.stack.layers[:2]
    short = copy.deepcopy(llama)
    short.model.layers = short.model.layers[:2]
    short.config.num_hidden_layers = 2
    ids, lengths = _ragged(101)
    logits, cache = draft.forward(ids, draft.new_cache(3, 12))
    assert len(cache.buffers) == 2
    for b, n in enumerate(lengths):
        torch.testing.assert_close(logits[b, :n], _plain(short, ids[b, :n]), atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="num_layers"):
        early_exit_draft(target, 4)


def test_int8_draft_is_close_to_the_target(llama: LlamaForCausalLM) -> None:
    target = HFModel(llama)
    draft = int8_draft(target)
    ids, _ = _ragged(101)
    a, _ = target.forward(ids, target.new_cache(3, 12))
    b, _ = draft.forward(ids, draft.new_cache(3, 12))
    assert b.dtype == torch.float32 and b.shape == a.shape
    assert float((a - b).abs().max()) < 0.1 * float(a.abs().max())  # int8 error, not a different model


def test_an_int8_linears_rows_do_not_depend_on_each_other() -> None:
    """Each row is quantized with its own scale: a row's output is bit-identical alone and in
    a batch whose rows span six orders of magnitude (and a zero row gives the bias)."""
    torch.manual_seed(0)
    dense = DenseLinear(torch.randn(48, 32), torch.randn(48), pack=False)
    linear = Int8Linear(dense)
    x = torch.randn(6, 3, 32) * torch.logspace(-3, 3, 6)[:, None, None]
    x[2, 1] = 0
    together = linear(x)
    assert all(torch.equal(linear(x[i:i + 1]), together[i:i + 1]) for i in range(6))
    assert torch.equal(together[2, 1], dense.bias)
    want = x @ dense.weight.T + dense.bias
    assert float(((together - want).norm(dim=-1) / want.norm(dim=-1)).max()) < 0.05
    # The control bites: fbgemm's own dynamic linear scales the whole batch at once.
    plain = torch.nn.Linear(32, 48)
    with torch.no_grad():
        plain.weight.copy_(dense.weight)
        plain.bias.copy_(dense.bias)
    per_tensor = quantize(torch.nn.Sequential(plain))
    batch = per_tensor(x)
    assert not all(torch.equal(per_tensor(x[i:i + 1]), batch[i:i + 1]) for i in range(6))


def test_vocab_resize_pads_with_minus_inf_and_truncates(llama: LlamaForCausalLM) -> None:
    ids = torch.tensor([[1, 2, 3]])
    wide, narrow, plain = HFModel(llama, vocab_size=105), HFModel(llama, vocab_size=100), HFModel(llama)
    base, _ = plain.forward(ids, plain.new_cache(1, 4))
    big, _ = wide.forward(ids, wide.new_cache(1, 4))
    small, _ = narrow.forward(ids, narrow.new_cache(1, 4))
    assert wide.vocab_size == 105 and torch.equal(big[..., :101], base)
    assert torch.all(big[..., 101:] == float("-inf"))
    assert torch.equal(small, base[..., :100])


def test_speculative_greedy_equals_plain_on_tiny_llama(llama: LlamaForCausalLM) -> None:
    target = HFModel(llama)
    ids, lengths = _ragged(101)
    plens = torch.tensor(lengths)
    plain = generate_plain(target, ids, max_new_tokens=12, params=GREEDY, prompt_lengths=plens)
    for drafter in (ModelDrafter(int8_draft(target)), ModelDrafter(early_exit_draft(target, 1)),
                    PromptLookupDrafter()):
        spec = generate(target, drafter, ids, max_new_tokens=12, params=GREEDY, k=3, prompt_lengths=plens)
        assert torch.equal(spec.sequences, plain.sequences)


class _Tok:
    def __init__(self, vocab: dict[str, int], name: str) -> None:
        self.vocab, self.name_or_path = vocab, name

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


def test_check_compatible() -> None:
    a = _Tok({"a": 0, "b": 1, "c": 2}, "target-tok")
    check_compatible(a, _Tok(a.vocab, "draft"), 3, 8)  # padded embedding rows are fine
    with pytest.raises(ValueError, match=r"target-tok.*draft-tok"):
        check_compatible(a, _Tok({"a": 0, "b": 2, "c": 1}, "draft-tok"), 3, 3)
    with pytest.raises(ValueError, match="draft_vocab: expected >= 3"):
        check_compatible(a, a, 3, 2)


def test_bad_inputs(llama: LlamaForCausalLM) -> None:
    model = HFModel(llama)
    cache = model.new_cache(2, 4)
    with pytest.raises(TypeError, match="tokens: expected an int64"):
        model.forward(torch.zeros((2, 1), dtype=torch.int32), cache)
    with pytest.raises(ValueError, match=r"tokens: expected shape \[2, T >= 1\]"):
        model.forward(torch.zeros((3, 1), dtype=torch.int64), cache)
    with pytest.raises(ValueError, match="capacity"):
        model.forward(torch.zeros((2, 5), dtype=torch.int64), cache)
    with pytest.raises(ValueError, match="capacity: expected an int >= 1"):
        model.new_cache(1, 0)
    with pytest.raises(TypeError, match="model: expected a transformers causal LM"):
        HFModel(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="supported architecture: expected full attention in every layer"):
        HFModel(Qwen2ForCausalLM(Qwen2Config(**TINY, use_sliding_window=True, max_window_layers=0)),
                fast=True)
    with pytest.raises(FileNotFoundError, match=r"no/such/model\.gguf"):
        loading.load_target("/no/such/model.gguf")
    with pytest.raises(ValueError, match=r"int8, early-exit:N, lookup"):
        loading.load_drafter("nonsense", model)
    with pytest.raises(ValueError, match="early-exit:N"):
        loading.load_drafter("early-exit:x", model)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device: 'cuda' is not available here; available: cpu"):
            create({"device": "cuda"})
    with pytest.raises(ValueError, match="dtype: expected one of"):
        create({"dtype": "int8"})
    with pytest.raises(ValueError, match="options: unknown"):
        create({"devices": "cpu"})


def test_create_and_lookup_by_name(llama: LlamaForCausalLM) -> None:
    backend = create({})
    assert backend.name == "torch" and backend.dtype == torch.float32
    assert backend.asarray([[1, 2]]).dtype == torch.int64
    assert isinstance(backend.load_drafter("lookup", HFModel(llama)), PromptLookupDrafter)
    _folder, name = loading.default_model_path()
    assert name.endswith(".gguf")


# --- the real model (SmolLM2-135M: its GGUF converted once, then a second to load) ------------

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.",
           "List three primary colours:"]


@pytest.fixture(scope="session")
def smol() -> tuple[HFModel, object]:
    return loading.load_target("smollm2"), loading.load_tokenizer("smollm2")


def _batch(tok: object) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [tok(p)["input_ids"] for p in PROMPTS]  # type: ignore[operator]
    ids = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.int64)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row)
    return ids, torch.tensor([len(r) for r in rows])


@pytest.mark.slow
def test_the_converted_model_is_the_gguf_bit_for_bit(smol: tuple[HFModel, object]) -> None:
    """The cached conversion holds the GGUF's float32 weights exactly and the same tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target, tok = smol
    folder, gguf = loading.default_model_path()
    assert loading.converted(folder, gguf) is not None  # the session loaded from the cache
    direct = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    mine, theirs = target.module.state_dict(), direct.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    original = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    chat = [{"role": "user", "content": "Name a colour."}]
    assert tok.get_vocab() == original.get_vocab()  # type: ignore[attr-defined]
    assert tok.apply_chat_template(chat, add_generation_prompt=True) == \
        original.apply_chat_template(chat, add_generation_prompt=True)  # type: ignore[attr-defined]
    assert tok.eos_token_id == original.eos_token_id  # type: ignore[attr-defined]


def test_the_conversion_cache_can_be_off_or_unwritable(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Off, or a root that cannot be created: no conversion, the GGUF is read directly."""
    folder, gguf = str(tmp_path), "model.gguf"
    (tmp_path / gguf).write_bytes(b"not read")
    monkeypatch.setenv(loading.CACHE_ENV, "off")
    assert loading.cache_root() is None and loading.converted.__wrapped__(folder, gguf) is None
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(loading.CACHE_ENV, str(blocker / "cache"))
    assert loading.cache_root() == blocker / "cache"
    assert loading.converted.__wrapped__(folder, gguf) is None


@pytest.mark.slow
def test_smollm2_parity_fast_generic_plain(smol: tuple[HFModel, object]) -> None:
    target, tok = smol
    ids, lengths = _batch(tok)
    generic = HFModel(target.module, fast=False)
    a, _ = target.forward(ids, target.new_cache(3, ids.shape[1]))
    b, _ = generic.forward(ids, generic.new_cache(3, ids.shape[1]))
    for row, n in enumerate(lengths.tolist()):
        want = _plain(target.module, ids[row, :n])
        torch.testing.assert_close(a[row, :n], want, atol=1e-3, rtol=0)  # logits ~ 10-30 in size
        torch.testing.assert_close(b[row, :n], want, atol=1e-3, rtol=0)


def _near_tie(target: HFModel, seq: list[int], at: int, ours: int, theirs: int) -> float:
    logits = _plain(target.module, torch.tensor(seq[:at]))[-1]
    return abs(float(logits[ours] - logits[theirs]))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["int8", "early-exit:10", "lookup"])
def test_smollm2_greedy_speculative_equals_plain(smol: tuple[HFModel, object], name: str) -> None:
    target, tok = smol
    ids, lengths = _batch(tok)
    drafter = loading.load_drafter(name, target)
    plain = generate_plain(target, ids, max_new_tokens=16, params=GREEDY, prompt_lengths=lengths)
    spec = generate(target, drafter, ids, max_new_tokens=16, params=GREEDY, k=4, prompt_lengths=lengths)
    for row in range(3):
        a, b = spec.new_tokens(row), plain.new_tokens(row)
        if a != b:  # allowed only at a float32 near-tie of the target's top two logits
            at = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
            prefix = [int(t) for t in ids[row, : int(lengths[row])]] + b[:at]
            assert _near_tie(target, [*prefix, 0], len(prefix), a[at], b[at]) < 1e-3, (row, at)


# The fast path's norm and rotary embedding are transformers' own arithmetic (the rotary in fewer calls):
# equal bit for bit, so the fast path's logits do not move when they change.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 576), (3, 5, 64), (2, 7, 960)])
def test_rms_norm_is_transformers_bit_for_bit(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    torch.manual_seed(sum(shape))
    norm = modeling_llama.LlamaRMSNorm(shape[-1], eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[-1]))
        x = (torch.randn(shape) * 3).to(dtype)
        assert torch.equal(_fast.rms_norm(x, norm.weight, 1e-5), norm(x))


def test_rotary_embedding_is_transformers_bit_for_bit() -> None:
    torch.manual_seed(3)
    q, k = torch.randn(2, 9, 5, 64), torch.randn(2, 3, 5, 64)  # [B, H, T, hd]
    cos, sin = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    want = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)  # unsqueezes at dim 1
    tables = _fast.rope_tables(cos[:, None], sin[:, None])
    assert all(torch.equal(_fast._rope(x, *tables), w) for x, w in zip((q, k), want, strict=True))
    # Negative control: the model's own sin, not the signed table, is another rotation.
    assert not torch.equal(_fast._rope(q, cos[:, None], sin[:, None]), want[0])


def test_the_silu_module_is_read_as_its_function() -> None:
    stack = _fast.LlamaStack.of(_tiny_llama())
    assert stack.act is torch.nn.functional.silu
    relu = torch.nn.ReLU()
    assert _fast._activation(relu) is relu  # any other activation stays the module
