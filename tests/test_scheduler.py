"""`auto`'s scheduler: the gate on a row's use of the model, the cost of a round, its width,
the choice of the model, and the table `--explain` prints."""

from __future__ import annotations

import numpy as np
import pytest
from specsample_backends.reference import random_ngram

import specsample
from specsample.api.config import Config
from specsample.core.metrics import Metrics
from specsample.drafters.model import DraftRating, ModelDrafter
from specsample.engine.scheduler import PRIOR, Prior, Scheduler, choose

# -- the gate and the round's cost ----------------------------------------------------------------


def test_the_gate_follows_each_rows_record_against_the_break_even() -> None:
    """With the verify's cost measured, a row drafts from the model while (accepted + prior) /
    (trials + weight) exceeds c + cost(2) - 1; negative control: a row with no hits turns off."""
    gate = Scheduler(cost_ratio=0.2, prior=Prior(0.6, 4.0), width_cost=lambda b, w: 1.0 + 0.1 * (w - 1))
    assert gate.narrows and gate.break_even() == pytest.approx(0.3) and not gate.never(3)
    accepted, trials = np.array([0, 0, 8, 1]), np.array([0, 12, 8, 4])
    # rates: 0.6, 2.4 / 16 = 0.15, 10.4 / 12, 3.4 / 8 = 0.425
    assert gate.worth(accepted, trials, 3).tolist() == [True, False, True, True]
    assert Scheduler(cost_ratio=0.6, prior=Prior(0.6, 4.0), width_cost=lambda b, w: 1.1).never(3)


def test_a_rounds_cost_counts_the_model_only_where_it_drafts() -> None:
    gate = Scheduler(cost_ratio=0.25, width_cost=lambda b, w: 1.0 + 0.05 * b * (w - 1))
    assert gate.round_cost(2, 3) == pytest.approx(1.3 + 0.75)
    assert gate.round_cost(2, 3, modelled=False) == pytest.approx(1.3)
    fanned = Scheduler(cost_ratio=0.25, width_cost=lambda b, w: 1.0 + 0.05 * b * (w - 1), fan_out=3)
    assert fanned.round_cost(1, 3) == pytest.approx(1.15 + 0.25)  # one draft step, whatever its width


def test_a_rounds_width_reads_the_runs_evidence_by_kind_and_length() -> None:
    """Copies that always held widen the round; the same evidence filed as model drafts that
    failed (the prior alone) keeps it a plain step at a dear verify."""
    gate = Scheduler(cost_ratio=0.4, width_cost=lambda b, w: 1.0 + 0.3 * (w - 1))
    assert not gate.never(3)  # the prior 0.8 clears the break-even 0.4 + 1.3 - 1
    held = Metrics(copied_accepted_at=(0, 0, 0, 300), copied_trials_at=(0, 0, 0, 300))
    assert gate.width([3], [40], [True], 1, held) == 3
    assert gate.width([3], [40], [False], 1, held) == 0


def test_a_fan_out_rows_siblings_count_as_one_draft_in_a_batch() -> None:
    """Two level rows wanting a head's 2 siblings at hit rate 0.5, the round costing 1.55 plain
    steps (a 1.45 verify and the head's step): the siblings make at most 1 + 0.5 tokens a round
    (about 1.44 a round to the end), so no plan pays; the same rows as 2-draft copies (chains,
    about 1.65 a round, no head step) are worth drafting to the end."""
    cost = lambda b, w: 1.45  # noqa: E731
    metrics = Metrics(accepted_at=(0, 0, 500), trials_at=(0, 0, 1000),
                      copied_accepted_at=(0, 0, 500), copied_trials_at=(0, 0, 1000))
    fanned = Scheduler(cost_ratio=0.1, width_cost=cost, fan_out=2)
    assert fanned.width([2, 2], [48, 48], [False, False], 2, metrics) == 0
    assert fanned.width([2, 2], [48, 48], [True, True], 2, metrics) == 2  # copies: chains, no model step
    # With the head's held-out hit rates, one sibling of two is rated at 0.5 * 0.45 / 0.5.
    one = Scheduler(cost_ratio=0.1, width_cost=lambda b, w: {2: 1.0}.get(w, 1.45), fan_out=2,
                    hits=(0.45, 0.5))
    assert one.width([2], [48], [False], 1, metrics) == 1  # 1.45 tokens for 1.1 plain steps
    assert Scheduler(cost_ratio=0.1, width_cost=lambda b, w: {2: 1.0}.get(w, 1.45),
                     fan_out=2).width([2], [48], [False], 1, metrics) == 0  # no hit rates: no use
    with pytest.raises(ValueError, match=r"hits: expected None or hit rates in \(0, 1\], got \(0.4, 1.2\)"):
        Scheduler(cost_ratio=0.1, fan_out=2, hits=(0.4, 1.2))


# -- the model's choice and --explain ---------------------------------------------------------------


def _choice() -> Scheduler:
    target = random_ngram(5, order=2, seed=4, concentration=0.6, zeros=0.2)
    cheap = ModelDrafter(random_ngram(5, order=2, seed=5), rating=DraftRating(prior_alpha=0.3))
    dear = ModelDrafter(target)

    def load(name: str) -> ModelDrafter:
        if name == "missing":
            raise FileNotFoundError("no such head")
        return {"cheap": cheap, "dear": dear}[name]

    chosen = choose(["missing", "cheap", "dear"], load, cost=lambda d: 0.1 if d is cheap else 0.8,
                    width_cost=lambda batch, width: 1.0 + 0.02 * (width - 1))
    assert isinstance(chosen.scheduler, Scheduler)
    return chosen.scheduler


def test_the_choice_table_rates_every_candidate_in_a_dozen_lines() -> None:
    gate = _choice()
    assert gate.choice is not None and gate.choice.chosen == "cheap"
    table = gate.choice.table()
    assert len(table) <= 12
    assert table[0].split()[:4] == ["candidate", "c", "shape", "prior"] and "speed" in table[0]
    rows = {line.split()[0]: line for line in table[1:]}
    assert rows["cheap"].rstrip().endswith("*") and not rows["dear"].rstrip().endswith("*")
    assert "1.02 1.04 1.06 1.08" in rows["cheap"]  # the verify's cost at 2..5 positions
    assert f"{(1 + 0.3) / (0.1 + 1.02):.2f}x" in rows["cheap"]
    assert rows["missing"].endswith("left out") and "1.00x" in rows["plain"]


def test_explain_prints_the_table_for_auto_and_one_line_otherwise(capsys: pytest.CaptureFixture[str]) -> None:
    from specsample.cli import main

    lines = specsample.load(Config(draft="lookup")).explain()
    assert len(lines) == 1 and "PromptLookupDrafter" in lines[0]
    assert main(["generate", "--backend", "reference", "--prompt", "abcab", "--max-new-tokens", "4",
                 "--explain", "--draft", "auto"]) == 0
    assert "drafter auto:" in capsys.readouterr().out


def test_a_config_takes_the_drafter_as_a_table(tmp_path: object) -> None:
    from pathlib import Path

    toml = Path(str(tmp_path)) / "run.toml"
    toml.write_text('backend = "reference"\n\n[draft]\nkind = "hybrid"\nmodel = "noisy:0.3"\n'
                    'threshold = 0.5\n')
    config = Config.load(toml)
    assert config.draft == "hybrid:noisy:0.3@0.5"
    assert type(specsample.load(config).drafter).__name__ == "HybridDrafter"
    with pytest.raises(ValueError, match=r"draft: unknown keys \['size'\]"):
        Config.from_dict({"draft": {"model": "lookup", "size": 3}})
    assert Prior(0.8, 8.0) == PRIOR
