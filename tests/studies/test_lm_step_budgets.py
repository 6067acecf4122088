"""The IRE language-model studies' step budgets (``studies/_lm_steps.py``): the paper's steps and warm-ups,
expressed in epochs over a training stream cut to a whole number of steps, checked against a hand count
and against the windows the ``lm/*`` workload cuts."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from flatlab.study.loader import load_studies
from flatlab.workloads.lm import PRESETS
from flatlab.workloads.token_stream import TokenWindows

STUDIES_DIR = Path(__file__).resolve().parents[2] / "studies"
sys.path.insert(0, str(STUDIES_DIR))
from _lm_steps import step_budget  # noqa: E402


def test_step_budget_by_hand():
    # Llama 60M: 100k steps of 240 windows of 150 tokens over 32 passes -> 3,125 steps a pass,
    # 3,125 * 240 * 150 = 112,500,000 tokens + 1 for the shifted targets; 500 warm-up steps = 0.16 pass
    b = step_budget(100_000, 500, 240, 150, 32)
    assert b == {"max_epochs": 32, "max_train_tokens": 112_500_001, "warmup_epochs": 0.16, "steps_per_epoch": 3125}


def test_the_cut_stream_gives_exactly_the_steps():
    b = step_budget(steps=12, warmup_steps=3, batch=5, context=7, epochs=3)  # 4 steps a pass
    windows = TokenWindows(np.arange(1000, dtype=np.int32)[: b["max_train_tokens"]], context=7)
    assert len(windows) == 4 * 5
    assert math.ceil(len(windows) / 5) * b["max_epochs"] == 12  # the trainer's steps per epoch, ceil(n / batch)
    assert b["warmup_epochs"] * b["steps_per_epoch"] == 3


@pytest.mark.parametrize(
    "args, match",
    [((10, 0, 4, 8, 3), "multiple of epochs=3"), ((10, 10, 4, 8, 2), r"warmup_steps=10 must be in \[0, steps=10\)")],
)
def test_step_budget_refuses_what_cannot_be_exact(args, match):
    with pytest.raises(ValueError, match=match):
        step_budget(*args)


def steps_and_warmup(study):
    """(total optimizer steps, warm-up steps) that a study's paper scale runs, from its own fields."""
    ctx = study.workload_params.get("context") or PRESETS[study.workload_params["model"]].context
    windows = (study.workload_params["max_train_tokens"] - 1) // ctx
    per_epoch = math.ceil(windows / study.train["batch_size"])
    return per_epoch * study.max_epochs, round(study.train["warmup_epochs"] * per_epoch)


def test_ire_fig4_runs_the_papers_steps_batches_and_warmups():
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


def test_ire_fig3_runs_100k_steps_with_3k_warmup():
    for s in load_studies(str(STUDIES_DIR / "ire_fig3_transformer_wikitext2.py"), "paper"):
        assert steps_and_warmup(s) == (100_000, 3_000), s.name
