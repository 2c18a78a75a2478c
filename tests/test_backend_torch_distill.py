"""`distill`: seeded end to end, learns, and writes a head that loads for its target only.

A tiny random Llama over SmolLM2's vocabulary (so the real tokenizer's chat template and
ids apply) is distilled twice with the same plan: the two head files must be identical
byte for byte, the training loss must fall, and the file must load as a drafter whose
greedy output equals plain decoding.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from specsample_backends.torch import HFModel, loading
from specsample_backends.torch import _distill_data as data_module
from specsample_backends.torch import _distill_prompts as _prompts
from specsample_backends.torch import distill as distill_module
from specsample_backends.torch._distill_prompts import code_snippets, grounded_prompts, open_prompts
from specsample_backends.torch.distill import FAN_OUT_NODES, distill, evaluate_fan_out, held_out_fan_out
from specsample_backends.torch.head_file import head_fan_out, head_prior, load_head
from transformers import LlamaConfig, LlamaForCausalLM

from specsample.bench.prompts import PROMPTS, greedy_prompts
from specsample.core.params import SamplingParams
from specsample.drafters.head import DistillPlan
from specsample.engine.generate import generate, generate_plain

PLAN = DistillPlan(prompts=6, grounded=4, new_tokens=12, batch=3, vocab=512, epochs=3, batch_rows=2, k=2,
                   held_out_tokens=4, lr=3e-3)


def _tiny() -> HFModel:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return HFModel(LlamaForCausalLM(config).eval())


@pytest.fixture(scope="module")
def tiny() -> HFModel:
    return _tiny()


def test_open_prompts_are_distinct_mixed_and_not_benchmark_prompts() -> None:
    prompts = open_prompts(1536)
    assert len(set(prompts)) == 1536
    first = prompts[:len(_prompts.TOPICS)]  # the first round mixes every instruction
    assert all(any(p.startswith(style.split("{}")[0]) for p in first) for style in _prompts.OPEN_STYLES)
    assert not set(prompts) & set(greedy_prompts())
    with pytest.raises(ValueError, match="count: expected"):
        open_prompts(1537)


def test_more_topics_keep_the_first_96s_prompts_and_widen_the_rest() -> None:
    assert open_prompts(1536, 96) == open_prompts(1536)  # v1-v3's prompts, unchanged
    wide = open_prompts(_prompts.ALL_TOPICS * 2, _prompts.ALL_TOPICS)
    assert len(set(wide)) == len(wide)
    # The first round takes every topic once: the new ones appear from the 97th prompt on.
    assert all(topic in prompt for topic, prompt in zip(_prompts.MORE_TOPICS, wide[96:], strict=False))
    assert not set(_prompts.MORE_TOPICS) & set(_prompts.TOPICS)
    everything = open_prompts(_prompts.ALL_TOPICS * len(_prompts.OPEN_STYLES), _prompts.ALL_TOPICS)
    assert not set(everything) & set(greedy_prompts())
    assert not [t for t in _prompts.MORE_TOPICS if any(t in p for p in greedy_prompts())]
    with pytest.raises(ValueError, match="prompts: expected an int in \\[1, 1536\\] \\(96 topics x 16 "
                                         "instructions; more topics allow more, up to 422\\), got 2000"):
        data_module.training_prompts(2000)
    with pytest.raises(ValueError, match="topics: expected an int in \\[1, 422\\]"):
        data_module.training_prompts(10, 423)


def test_grounded_prompts_mix_passages_and_code() -> None:
    passages = ["First passage.", "Second passage.", "  "]
    prompts = grounded_prompts(passages, 20)  # 2 passages x 8 instructions: no repeats yet
    assert len(prompts) == 20 == len(set(prompts))
    code = [p for p in prompts if any(s in p for s in code_snippets())]
    assert len(code) == 5 and all(p in prompts[3::4] for p in code)
    assert all(("First passage." in p) != ("Second passage." in p) for p in prompts if p not in code)
    assert not set(prompts) & set(greedy_prompts())
    assert grounded_prompts([], 0) == []
    with pytest.raises(ValueError, match="passages: expected at least one non-empty text"):
        grounded_prompts(["  "], 1)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("epochs", 0, "epochs: expected"), ("lr", 0.0, "lr: expected a number > 0"),
    ("noise", -1.0, "noise: expected a number >= 0"), ("vocab", -1, "vocab: expected"),
    ("grounded", -1, "grounded: expected"), ("topics", 0, "topics: expected"),
    ("label_temperature", 0.0, "label_temperature: expected a number > 0"),
    ("layers", 0, "layers: expected"),
])
def test_bad_plans_are_clear_errors(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DistillPlan(**{field: value})  # type: ignore[arg-type]


def test_the_label_law_is_the_targets_law_at_1_and_sharper_below() -> None:
    torch.manual_seed(0)
    full = torch.randn(5, 40) * 3  # the target's logits over a 40-token vocabulary
    lse = torch.logsumexp(full, dim=-1)
    subset = full[:, :30]  # a draft vocabulary of the first 30
    assert torch.allclose(distill_module.label_law(subset, lse, 1.0), torch.softmax(full, -1)[:, :30])
    sharp = distill_module.label_law(subset, lse, 0.5)
    assert torch.allclose(sharp.sum(-1), torch.ones(5))
    assert torch.allclose(sharp, torch.softmax(subset * 2, -1))
    top = subset.argmax(-1, keepdim=True)
    # Sharper: more of the law on each row's likeliest token than the renormalised law at 1.
    assert (sharp.gather(1, top) > torch.softmax(subset, -1).gather(1, top)).all()
    cold = distill_module.label_law(subset, lse, 1e-4)  # near 0: the likeliest token alone
    assert torch.allclose(cold.gather(1, top), torch.ones(5, 1))
    # Both laws at one temperature: a head with the target's logits (up to a constant) fits
    # exactly (cross-entropy = the label law's entropy); one with logits twice as sharp, which
    # would draft too confidently at every temperature, does not.
    entropy = -(sharp * sharp.log()).sum(-1)
    exact = -(sharp * distill_module._draft_log_law(subset + 3.0, 0.5)).sum(-1)
    assert torch.allclose(exact, entropy, atol=1e-5)
    overconfident = -(sharp * distill_module._draft_log_law(subset * 2, 0.5)).sum(-1)
    assert (overconfident > entropy + 1e-3).all()


def test_distill_is_seeded_learns_and_loads(tmp_path, tiny: HFModel) -> None:  # type: ignore[no-untyped-def]
    tokenizer = loading.load_tokenizer("smollm2")
    cards = [distill(tiny, tokenizer, PLAN, tmp_path / f"{i}.safetensors") for i in range(2)]
    assert (tmp_path / "0.safetensors").read_bytes() == (tmp_path / "1.safetensors").read_bytes()
    same = [{k: v for k, v in c.items() if k != "seconds"} for c in cards]
    assert same[0] == same[1]
    losses = cards[0]["epoch_losses"]
    assert losses[-1] < losses[0], losses
    assert json.loads((tmp_path / "0.json").read_text())["held_out_alpha"] == cards[0]["held_out_alpha"]
    assert 0 < cards[0]["vocab"] <= 512 + 1
    head = load_head(tmp_path / "0.safetensors", tiny)
    drafter = loading.load_drafter(f"head:{tmp_path / '0.safetensors'}", tiny)
    ids = torch.tensor([[1, 2, 3, 4]])
    greedy = SamplingParams(temperature=0.0)
    assert torch.equal(generate(tiny, drafter, ids, max_new_tokens=8, params=greedy, k=2).sequences,
                       generate_plain(tiny, ids, max_new_tokens=8, params=greedy).sequences)
    assert head.fc.weight.dtype == torch.float32  # stored as float16, loaded in the target's dtype
    # By name, the head drafts as the chain or the fan-out that rates faster here, and says so.
    note = drafter.rating.note  # type: ignore[attr-defined]
    assert note.startswith(("the head's chain: ", "the head's fan-out: "))
    drafter = loading._named_drafter(f"head:{tmp_path / '0.safetensors'}", tiny, None)
    # `auto` weighs a head with its card's held-out alpha as the prior (none: 0.5; bad: an error).
    assert drafter.rating.prior_alpha == cards[0]["held_out_alpha"]["all"]  # type: ignore[attr-defined]
    # ... and fans it out as its held-out hit rates of m = 1..8 candidates say (none: None).
    hits = cards[0]["held_out_fan_out"]
    assert set(hits) == {"all", "open", "grounded"} and all(len(v) == FAN_OUT_NODES for v in hits.values())
    assert drafter.rating.fan_out_hits == tuple(hits["all"])  # type: ignore[attr-defined]
    assert all(0 <= a <= b <= 1 for v in hits.values() for a, b in itertools.pairwise(v))
    card = json.loads((tmp_path / "0.json").read_text())
    card.pop("held_out_fan_out")
    (tmp_path / "0.json").write_text(json.dumps(card))
    assert head_fan_out(tmp_path / "0.safetensors") is None
    card["held_out_fan_out"] = {"all": [0.5, 1.5]}
    (tmp_path / "0.json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match=r"fan-out hit rates \[0.5, 1.5\], expected"):
        head_fan_out(tmp_path / "0.safetensors")
    for alpha, want in ((None, 0.5), (1.5, "held-out alpha 1.5, expected a rate in")):
        card["held_out_alpha"] = {} if alpha is None else {"all": alpha}
        (tmp_path / "0.json").write_text(json.dumps(card))
        if isinstance(want, float):
            assert head_prior(tmp_path / "0.safetensors") == want
        else:
            with pytest.raises(ValueError, match=want):
                head_prior(tmp_path / "0.safetensors")
    with pytest.raises(ValueError, match=r"path: expected a \.safetensors file name"):
        distill(tiny, tokenizer, PLAN, tmp_path / "head.bin")


def test_sampling_keeps_the_features_a_full_forward_gives(tiny: HFModel) -> None:
    # The rows are generate_plain's samples (same seed), less the last token, and the
    # features kept while sampling are those one forward over the row computes.
    tokenizer = loading.load_tokenizer("smollm2")
    texts = ["Write a poem about the sea.", "Hi"]
    rows = data_module.sample_rows(tiny, tokenizer, texts, PLAN, 5, lambda *a: None, "sampling")
    prompts = [distill_module.encode_text(tokenizer, t) for t in texts]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    plain = generate_plain(tiny, ids, max_new_tokens=PLAN.new_tokens, params=SamplingParams(temperature=0.7),
                           seed=5, prompt_lengths=torch.tensor([len(p) for p in prompts]),
                           eos_token_id=tokenizer.eos_token_id)
    for b, (row, features, norms) in enumerate(rows):
        assert row.tolist() == (prompts[b] + plain.new_tokens(b))[:-1]
        logits, want, _ = tiny.forward_features(row[None], tiny.new_cache(1, len(row)))
        torch.testing.assert_close(features, want[0], rtol=1e-4, atol=1e-5)
        lse = torch.logsumexp(logits[0].double(), -1).float()
        torch.testing.assert_close(norms, lse, rtol=1e-4, atol=1e-4)


def test_held_out_fan_out_counts_the_greedy_tokens_among_the_heads_likeliest(tmp_path, tiny: HFModel
                                                                             ) -> None:  # type: ignore[no-untyped-def]
    """Hit rates rise with m and, with m = the head's whole support, are the share of greedy
    tokens the support holds (counted here apart); `evaluate_fan_out` writes them into a
    card that lacks them and leaves the weights and the rest alone."""
    tokenizer = loading.load_tokenizer("smollm2")
    distill(tiny, tokenizer, PLAN, tmp_path / "h.safetensors")
    head = load_head(tmp_path / "h.safetensors", tiny)
    support = set(head.vocab.tolist())
    hits = held_out_fan_out(tiny, head, tokenizer, new_tokens=4, nodes=len(support))
    held, total = 0, 0
    for _, text in PROMPTS:
        ids = torch.tensor([distill_module.encode_text(tokenizer, text)])
        made = generate_plain(tiny, ids, max_new_tokens=4, params=SamplingParams(temperature=0.0),
                              eos_token_id=tokenizer.eos_token_id).new_tokens(0)
        held += sum(t in support for t in made)
        total += len(made)
    assert hits["all"][-1] == round(held / total, 4)
    assert all(a <= b for a, b in itertools.pairwise(hits["all"]))
    card = json.loads((tmp_path / "h.json").read_text())
    weights = (tmp_path / "h.safetensors").read_bytes()
    card.pop("held_out_fan_out")
    (tmp_path / "h.json").write_text(json.dumps(card))
    written = evaluate_fan_out(tiny, tokenizer, tmp_path / "h.safetensors")
    assert written == {**card, "held_out_fan_out": written["held_out_fan_out"]}
    assert written["held_out_fan_out"]["all"] == hits["all"][:FAN_OUT_NODES]
    assert (tmp_path / "h.safetensors").read_bytes() == weights
    with pytest.raises(ValueError, match="nodes"):
        held_out_fan_out(tiny, head, tokenizer, new_tokens=4, nodes=0)


V2 = dataclasses.replace(PLAN, temperatures="0,0.7,1", feature_weight=0.0, logit_weight=1.0, unroll=3)


class _Stop(Exception):
    """Raised by a progress callback to interrupt a run where a real interruption could."""


def test_an_interrupted_run_continues_from_its_checkpoint_to_the_same_head(tmp_path, tiny: HFModel) -> None:  # type: ignore[no-untyped-def]
    # Interrupted once while sampling and once while training, the run continues from what
    # its folder holds and writes the head an uninterrupted run writes, byte for byte.
    tokenizer = loading.load_tokenizer("smollm2")
    whole = distill(tiny, tokenizer, V2, tmp_path / "whole.safetensors")
    for stage, at in (("sampling grounded", 1), ("training", 7)):  # 5 steps an epoch: one saved
        def stop(name: str, done: int, total: int, stage: str = stage, at: int = at) -> None:
            if name == stage and done >= at:
                raise _Stop
        with pytest.raises(_Stop):
            distill(tiny, tokenizer, V2, tmp_path / "cut.safetensors", checkpoint=tmp_path / "run",
                    progress=stop)
    assert (tmp_path / "run" / "training.pt").is_file() and (tmp_path / "run" / "run.json").is_file()
    seen: list[str] = []
    card = distill(tiny, tokenizer, V2, tmp_path / "cut.safetensors", checkpoint=tmp_path / "run",
                   resume=True, progress=lambda name, done, total: seen.append(name))
    assert (tmp_path / "cut.safetensors").read_bytes() == (tmp_path / "whole.safetensors").read_bytes()
    assert card["epoch_losses"] == whole["epoch_losses"]
    # The card counts the time of all three invocations, the uninterrupted run's its own.
    assert (card["invocations"], whole["invocations"]) == (3, 1)
    assert json.loads((tmp_path / "run" / "elapsed.json").read_text())["invocations"] == 3
    assert seen.count("training") < len(whole["epoch_losses"]) * -(-card["training_rows"] // V2.batch_rows)


def test_a_folder_from_before_a_plan_field_continues_at_its_default(tmp_path, tiny: HFModel) -> None:  # type: ignore[no-untyped-def]
    """The training state and the clock of a run cut before `topics` and `label_temperature`
    existed (its recorded plan lacks them) continue: those fields ran at their defaults. A
    recorded value that differs starts the training anew."""
    tokenizer = loading.load_tokenizer("smollm2")
    whole = distill(tiny, tokenizer, V2, tmp_path / "whole.safetensors")

    def stop(name: str, done: int, total: int) -> None:
        if name == "training" and done >= 7:  # 5 steps an epoch: one epoch saved
            raise _Stop

    def rewrite(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
        state = torch.load(folder / "training.pt", weights_only=False)
        change(state["plan"])
        torch.save(state, folder / "training.pt")
        clock = json.loads((folder / "elapsed.json").read_text())
        change(clock["plan"])
        (folder / "elapsed.json").write_text(json.dumps(clock))

    def older(plan: dict[str, Any]) -> None:
        del plan["topics"], plan["label_temperature"]

    def other(plan: dict[str, Any]) -> None:
        plan["label_temperature"] = 0.5

    for name, change, invocations in (("old", older, 2), ("other", other, 1)):
        with pytest.raises(_Stop):
            distill(tiny, tokenizer, V2, tmp_path / f"{name}.safetensors", checkpoint=tmp_path / name,
                    progress=stop)
        rewrite(tmp_path / name, change)
        seen: list[str] = []
        card = distill(tiny, tokenizer, V2, tmp_path / f"{name}.safetensors", checkpoint=tmp_path / name,
                       progress=lambda stage, done, total, seen=seen: seen.append(stage))
        made = (tmp_path / f"{name}.safetensors").read_bytes()
        assert made == (tmp_path / "whole.safetensors").read_bytes()
        assert card["invocations"] == invocations, name
        steps = len(whole["epoch_losses"]) * -(-card["training_rows"] // V2.batch_rows)
        assert (seen.count("training") < steps) == (name == "old"), name


def test_a_v2_card_records_the_recipe_and_the_acceptance_at_each_depth(tmp_path, tiny: HFModel) -> None:  # type: ignore[no-untyped-def]
    card = distill(tiny, loading.load_tokenizer("smollm2"), V2, tmp_path / "v2.safetensors")
    assert card["plan"]["unroll"] == 3 and card["plan"]["temperatures"] == "0,0.7,1"
    for key in ("held_out_alpha", "held_out_depth", "held_out_tokens_per_round"):
        assert set(card[key]) == {"all", "open", "grounded"}, key
    assert all(len(v) == V2.k and all(0 <= x <= 1 for x in v) for v in card["held_out_depth"].values())
    assert all(1 <= v <= V2.k + 1 for v in card["held_out_tokens_per_round"].values())
    assert card["training_rows"] == V2.prompts + V2.grounded and card["training_tokens"] > 0
    table = card["held_out_by_temperature"]
    assert set(table) == {"0", "0.7"} and table["0"]["tokens_per_round"] == card["held_out_tokens_per_round"]
    # --evaluate measures the same table again for a head file (a v1 head's card gains it).
    tokenizer = loading.load_tokenizer("smollm2")
    written = distill_module.evaluate_held_out(tiny, tokenizer, tmp_path / "v2.safetensors")
    assert written["held_out_by_temperature"] == table


def test_checkpoint_folders_are_checked(tmp_path, tiny: HFModel) -> None:  # type: ignore[no-untyped-def]
    tokenizer = loading.load_tokenizer("smollm2")
    with pytest.raises(FileNotFoundError, match=r"checkpoint: expected the folder of an earlier run to "
                                                r"resume, got '.*missing', which does not exist"):
        distill(tiny, tokenizer, V2, tmp_path / "h.safetensors", checkpoint=tmp_path / "missing", resume=True)
    with pytest.raises(ValueError, match="checkpoint: expected the folder of the run to resume, got none"):
        distill(tiny, tokenizer, V2, tmp_path / "h.safetensors", resume=True)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="checkpoint: expected a folder, got the file"):
        distill(tiny, tokenizer, V2, tmp_path / "h.safetensors", checkpoint=tmp_path / "file")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps({"plan": dataclasses.asdict(PLAN)}))
    with pytest.raises(ValueError, match=r"checkpoint: .* holds a run with other settings "
                                         r"\(temperatures, target\)"):
        distill(tiny, tokenizer, V2, tmp_path / "h.safetensors", checkpoint=tmp_path / "run")


def test_a_run_that_changes_only_the_training_reuses_the_samples(tmp_path, tiny: HFModel,  # type: ignore[no-untyped-def]
                                                                  monkeypatch) -> None:
    tokenizer = loading.load_tokenizer("smollm2")
    distill(tiny, tokenizer, V2, tmp_path / "a.safetensors", checkpoint=tmp_path / "run")
    longer = dataclasses.replace(V2, epochs=V2.epochs + 1)
    stages: list[str] = []
    sampled = []
    real = data_module._sample_batch
    monkeypatch.setattr(data_module, "_sample_batch", lambda *a, **k: sampled.append(1) or real(*a, **k))
    card = distill(tiny, tokenizer, longer, tmp_path / "b.safetensors", checkpoint=tmp_path / "run",
                   progress=lambda name, done, total: stages.append(name))
    assert not sampled  # every batch read back from the folder
    monkeypatch.undo()
    fresh = distill(tiny, tokenizer, longer, tmp_path / "c.safetensors")
    assert stages.count("training") == longer.epochs * -(-card["training_rows"] // V2.batch_rows)
    assert (tmp_path / "b.safetensors").read_bytes() == (tmp_path / "c.safetensors").read_bytes()
    assert card["epoch_losses"] == fresh["epoch_losses"]
    assert card["invocations"] == 1  # the first plan's invocation is not this plan's


def test_a_deeper_head_trains_on_the_same_samples_and_loads_with_its_layers(tmp_path, tiny: HFModel,  # type: ignore[no-untyped-def]
                                                                         monkeypatch) -> None:
    """`layers` is a training setting: a two-layer plan reads a one-layer run's samples back from
    its folder, and writes a head that loads with two layers and decodes greedily as plain."""
    tokenizer = loading.load_tokenizer("smollm2")
    distill(tiny, tokenizer, PLAN, tmp_path / "one.safetensors", checkpoint=tmp_path / "run")
    sampled: list[int] = []
    real = data_module._sample_batch
    monkeypatch.setattr(data_module, "_sample_batch", lambda *a, **k: sampled.append(1) or real(*a, **k))
    card = distill(tiny, tokenizer, dataclasses.replace(PLAN, layers=2), tmp_path / "two.safetensors",
                   checkpoint=tmp_path / "run")
    assert not sampled and card["plan"]["layers"] == 2
    head = load_head(tmp_path / "two.safetensors", tiny)
    assert head.layers == 2 and load_head(tmp_path / "one.safetensors", tiny).layers == 1
    drafter = loading.load_drafter(f"head:{tmp_path / 'two.safetensors'}", tiny)
    ids, greedy = torch.tensor([[1, 2, 3, 4]]), SamplingParams(temperature=0.0)
    assert torch.equal(generate(tiny, drafter, ids, max_new_tokens=8, params=greedy, k=2).sequences,
                       generate_plain(tiny, ids, max_new_tokens=8, params=greedy).sequences)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("unroll", 0, "unroll: expected"),
    ("unroll_weight", 0.0, r"unroll_weight: expected a number in \(0, 1\]"),
    ("temperatures", "0,hot", "temperatures: expected comma-separated numbers >= 0, got '0,hot'"),
    ("temperatures", "-1", "temperatures: expected comma-separated numbers >= 0"),
])
def test_bad_v2_plans_are_clear_errors(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DistillPlan(**{field: value})  # type: ignore[arg-type]


def test_prompts_take_the_temperatures_in_turn() -> None:
    batches = data_module._batches(7, 2, 3)
    assert batches == [(0, [0, 3]), (2, [6]), (3, [1, 4]), (5, [2, 5])]
    assert data_module._batches(5, 2, 1) == [(0, [0, 1]), (2, [2, 3]), (4, [4])]  # v1's batches


def test_a_v3_run_fuses_its_taps_keeps_them_and_loads_with_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Recipe v3 (v2 reading layer 1's output beside the top feature): the taps pass runs once
    per checkpoint folder, a run that reads them back writes the head a run without a folder
    writes, byte for byte, and the head loads with its taps and decodes greedily as plain."""
    tokenizer = loading.load_tokenizer("smollm2")
    v3 = dataclasses.replace(V2, taps="1")
    target = _tiny()  # a v3 head taps its target: not the module's shared one
    seen: list[str] = []
    card = distill(target, tokenizer, v3, tmp_path / "a.safetensors", checkpoint=tmp_path / "run",
                   progress=lambda name, done, total: seen.append(name))
    assert card["plan"]["taps"] == "1" and target.taps == (1,) and "taps" in seen
    assert (tmp_path / "run" / "taps-1.pt").is_file()
    seen.clear()
    longer = dataclasses.replace(v3, epochs=V2.epochs + 1)
    again = distill(target, tokenizer, longer, tmp_path / "b.safetensors", checkpoint=tmp_path / "run",
                    progress=lambda name, done, total: seen.append(name))
    assert "taps" not in seen  # read back from the folder
    # Without a folder, on the same target (its kernels timed once) now tapped: the samples'
    # features are the top feature alone all the same.
    fresh = distill(target, tokenizer, longer, tmp_path / "c.safetensors")
    assert (tmp_path / "b.safetensors").read_bytes() == (tmp_path / "c.safetensors").read_bytes()
    assert again["epoch_losses"] == fresh["epoch_losses"]
    other = _tiny()
    head = load_head(tmp_path / "a.safetensors", other)
    assert head.taps.tolist() == [1] and other.taps == (1,)
    drafter = loading.load_drafter(f"head:{tmp_path / 'a.safetensors'}", other)
    ids, greedy = torch.tensor([[1, 2, 3, 4]]), SamplingParams(temperature=0.0)
    assert torch.equal(generate(other, drafter, ids, max_new_tokens=8, params=greedy, k=2).sequences,
                       generate_plain(other, ids, max_new_tokens=8, params=greedy).sequences)
    rows = data_module.sample_rows(other, tokenizer, ["Say hi."], V2, 0, lambda *a: None, "sampling")
    with pytest.raises(ValueError, match=r"checkpoint: .*taps-1.pt' holds the taps of other samples"):
        data_module.with_taps(other, rows, (1,), lambda *a: None, tmp_path / "run")


def test_with_taps_gives_each_rows_tapped_layers_as_a_forward_over_it() -> None:
    target = _tiny()
    tokenizer = loading.load_tokenizer("smollm2")
    rows = data_module.sample_rows(target, tokenizer, ["Name a colour.", "Count to three, please."], V2, 0,
                                   lambda *a: None, "sampling")
    wide = data_module.with_taps(target, rows, (1, 0), lambda *a: None)
    for (ids, f, n), (same, widened, m) in zip(rows, wide, strict=True):
        assert torch.equal(ids, same) and torch.equal(n, m) and torch.equal(widened[:, :32], f)
        _, full, _ = target.forward_features(ids[None], target.new_cache(1, len(ids)))
        torch.testing.assert_close(widened[:, 32:], full[0, :, 32:], atol=1e-5, rtol=1e-5)
    assert data_module.with_taps(target, rows, (), lambda *a: None) is rows


@pytest.mark.parametrize(("value", "message"), [
    ("a", "taps: expected comma-separated distinct layer indices >= 0, got 'a'"),
    ("-1", "taps: expected comma-separated distinct layer indices"),
    ("1,1", "taps: expected comma-separated distinct layer indices"),
])
def test_bad_taps_in_a_plan_are_clear_errors(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DistillPlan(taps=value)
    with pytest.raises(TypeError, match="taps: expected a comma-separated string"):
        DistillPlan(taps=1)  # type: ignore[arg-type]


def test_taps_the_target_lacks_are_refused_before_any_sampling(tmp_path, tiny: HFModel) -> None:  # type: ignore[no-untyped-def]
    stages: list[str] = []
    with pytest.raises(ValueError, match=r"plan: taps '2' name layers this target lacks: expected indices in "
                                         r"\[0, 2\), got \(2,\)"):
        distill(tiny, loading.load_tokenizer("smollm2"), dataclasses.replace(V2, taps="2"),
                tmp_path / "h.safetensors", progress=lambda name, done, total: stages.append(name))
    assert not stages and tiny.taps == ()


def test_more_samples_per_prompt_take_their_own_seeds_and_the_next_temperatures(
        tmp_path, tiny: HFModel, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """samples = 2: every prompt (open and grounded) sampled twice, the second time at the
    next temperature in turn and with other uniforms; a folder written before the field
    existed reads as samples = 1 (and one from before `topics` as its 96)."""
    tokenizer = loading.load_tokenizer("smollm2")
    twice = dataclasses.replace(V2, samples=2)
    calls: list[tuple[float, int]] = []
    real = data_module._sample_batch

    def record(target, chunk, params, new_tokens, eos, seed):  # type: ignore[no-untyped-def]
        calls.append((params.temperature, seed))
        return real(target, chunk, params, new_tokens, eos, seed)

    monkeypatch.setattr(data_module, "_sample_batch", record)
    stages: list[str] = []
    card = distill(tiny, tokenizer, twice, tmp_path / "h.safetensors", checkpoint=tmp_path / "run",
                   progress=lambda name, done, total: stages.append(name))
    assert card["training_rows"] == 2 * (V2.prompts + V2.grounded)
    assert [s for s in dict.fromkeys(stages) if s.startswith("sampling")] == [
        "sampling", "sampling grounded", "sampling 2", "sampling grounded 2"]
    temperatures = V2.sampling_temperatures()
    first, second = calls[:len(calls) // 2], calls[len(calls) // 2:]
    # Open prompt i is sampled at temperature i mod 3, then at i + 1 mod 3.
    open_batches = [members for _, members in data_module._batches(V2.prompts, V2.batch, len(temperatures))]
    for b, members in enumerate(open_batches):
        assert first[b][0] == temperatures[members[0] % 3]
        assert second[b][0] == temperatures[(members[0] + 1) % 3]
    assert not {seed for _, seed in first} & {seed for _, seed in second}
    # A folder from before the fields: its plan has no "samples" nor "topics", which read as 1
    # and 96.
    record_file = tmp_path / "old" / "run.json"
    distill(tiny, tokenizer, V2, tmp_path / "a.safetensors", checkpoint=tmp_path / "old")
    written = json.loads(record_file.read_text())
    del written["plan"]["samples"], written["plan"]["topics"]
    record_file.write_text(json.dumps(written))
    calls.clear()
    distill(tiny, tokenizer, V2, tmp_path / "b.safetensors", checkpoint=tmp_path / "old")
    assert not calls  # the samples were read back
    with pytest.raises(ValueError, match=r"holds a run with other settings \(samples\)"):
        distill(tiny, tokenizer, twice, tmp_path / "c.safetensors", checkpoint=tmp_path / "old")
    with pytest.raises(ValueError, match=r"holds a run with other settings \(topics\)"):
        distill(tiny, tokenizer, dataclasses.replace(V2, topics=97), tmp_path / "c.safetensors",
                checkpoint=tmp_path / "old")
    with pytest.raises(ValueError, match="samples: expected"):
        DistillPlan(samples=0)
