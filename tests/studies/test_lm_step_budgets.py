"""The IRE language-model studies' budgets (``studies/ire_fig3_transformer_wikitext2.py``,
``studies/ire_fig4_llama.py``): the paper's steps and warm-ups stated as ``Budget(steps=...)`` and trainer
``warmup_steps``, on the whole training stream, and what a trial of them runs, against hand counts."""

import math
from pathlib import Path

from flatlab import Budget
from flatlab.study.loader import load_studies
from flatlab.study.trial_spec import trial_spec, with_arm_epochs
from flatlab.train.config import warmup_steps_of
from flatlab.train.resolved import resolve_spec

STUDIES_DIR = Path(__file__).resolve().parents[2] / "studies"


def steps_and_warmup(study):
    """(the budget's optimizer steps, warm-up steps) a study states."""
    assert isinstance(study.budget, Budget) and study.budget.unit == "steps", study.name
    assert "max_train_tokens" not in study.workload_params and "warmup_epochs" not in study.train, study.name
    return study.budget.steps, study.train["warmup_steps"]


def test_ire_fig4_states_the_papers_steps_batches_and_warmups():
    studies = {s.name: s for s in load_studies(str(STUDIES_DIR / "ire_fig4_llama.py"), "paper")}
    expected = {  # the paper's appendix: batch, warm-up steps, budgets in steps
        "llama_60m": (240, 500, (50_000, 100_000)),
        "llama_119m": (300, 300, (30_000, 60_000)),
        "llama_229m": (480, 1000, (50_000, 100_000)),
    }
    for size, (batch, warmup, budgets) in expected.items():
        for steps in budgets:
            for name in (f"ire_fig4_{size}_{steps // 1000}k", f"ire_fig4_{size}_{steps // 1000}k_admire"):
                s = studies.pop(name)
                assert s.train["batch_size"] == batch and steps_and_warmup(s) == (steps, warmup), name
    assert not studies


def test_ire_fig3_states_100k_steps_with_3k_warmup():
    for s in load_studies(str(STUDIES_DIR / "ire_fig3_transformer_wikitext2.py"), "paper"):
        assert steps_and_warmup(s) == (100_000, 3_000), s.name


def test_a_trial_runs_the_budgets_steps_over_the_whole_stream():
    # Llama 60M: wikitext-103's about 118M tokens in 150-token windows, 240 a step: 3,278 steps a pass,
    # so 50k steps are 16 passes (the last part-way); the warm-up is 500 steps whatever the pass
    study = next(s for s in load_studies(str(STUDIES_DIR / "ire_fig4_llama.py"), "paper") if s.name.endswith("_50k"))
    rows = 118_000_000 // 150
    r = with_arm_epochs(study, rows)
    per_epoch = math.ceil(rows / 240)
    assert per_epoch == 3278 and r.epochs_of("adamw") == 16 == math.ceil(50_000 / per_epoch)
    spec = trial_spec(r, {"arm": "adamw", "seed": 0, "lr": 6e-4})
    assert (spec.max_steps, spec.max_passes, spec.epochs) == (50_000, None, 16)
    assert warmup_steps_of(resolve_spec(spec)["trainer"], per_epoch) == 500
