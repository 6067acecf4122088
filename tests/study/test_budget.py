"""A study's budget in epochs, steps, passes or seconds (:mod:`flatlab.study.budget`): the arithmetic per arm, its
validation, each arm's ASHA rungs, the trials' specs, the dry run and the launch record."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from flatlab import Arm, Budget, Study
from flatlab import space as sp
from flatlab.errors import ConfigError
from flatlab.study.budget import arm_budget, arm_grace_period, budget_record
from flatlab.study.plan import plan, render
from flatlab.study.schedulers import build_scheduler, decision_epochs
from flatlab.study.trial_spec import arm_budgets, trial_spec, with_arm_epochs
from flatlab.study.validate import validate

ROWS = 1079  # digits' training split: 9 mini-batches of 128


def study(budget, arms=None, **kw) -> Study:
    return Study(
        name="b",
        workload="digits",
        workload_params={"model": "mlp", "width": 8},
        train={"batch_size": 128},
        arms=arms or (Arm("sgd"), Arm("sam"), Arm("tsam", {"s": 3}), Arm("sgd_ire", {"mask_interval": 4})),
        budget=budget,
        reduction_factor=2,
        **kw,
    )


def test_arm_budget_counts_steps_then_epochs():
    b = arm_budget(100, lambda i: 2, ROWS, 128)
    assert (b.steps, b.epochs, b.steps_per_epoch, b.first_step_passes) == (50, 6, 9, 2)  # 50 steps: 5 epochs + 5
    ire = arm_budget(100, lambda i: 1 + (i % 4 == 0), ROWS, 128)  # 5 passes per 4 steps
    assert ire.steps == 80 and ire.epochs == 9
    with pytest.raises(ValueError, match=r"Budget\(passes=5\) does not cover one step \(6 passes\)"):
        arm_budget(5, lambda i: 6, ROWS, 128)


def test_grace_period_scales_to_each_arms_share():
    assert arm_grace_period(2, 12, 12) == 2
    assert arm_grace_period(2, 6, 12) == 1
    assert arm_grace_period(4, 2, 12) == 1  # at least one epoch
    assert arm_grace_period(6, 12, 12) == 6


def test_each_arm_gets_its_epochs_from_its_declared_cost():
    s = validate(study(Budget(passes=108)))
    got = {k: (v.steps, v.epochs, v.first_step_passes) for k, v in arm_budgets(s, ROWS).items()}
    # SGD 108 steps = 12 epochs; SAM 54 = 6; TSAM s=3: 18 steps of 6 = 2 epochs;
    # SGD-IRE K=4: n + ceil(n/4) <= 108 up to n = 86
    assert got == {"sgd": (108, 12, 1), "sam": (54, 6, 2), "tsam": (18, 2, 6), "sgd_ire": (86, 10, 2)}
    r = with_arm_epochs(s, ROWS)
    assert r.budget.arm_epochs == {"sgd": 12, "sam": 6, "tsam": 2, "sgd_ire": 10} and r.max_epochs == 12
    assert [r.epochs_of(a) for a in ("sgd", "sam", "tsam")] == [12, 6, 2]
    assert [r.grace_of(a) for a in ("sgd", "sam", "tsam")] == [2, 1, 1]
    spec = trial_spec(r, {"arm": "sam", "seed": 3})
    assert (spec.epochs, spec.max_passes, spec.max_seconds) == (6, 108, None)
    # ASHA per arm: max_t and grace in that arm's epochs; the trainable's decision epochs: every arm's rungs
    sched = build_scheduler(r)
    rungs = {arm: [r[0] for r in sched.arms[arm]._brackets[0]._rungs] for arm in ("sgd", "sam", "tsam")}
    assert rungs == {"sgd": [8, 4, 2], "sam": [4, 2, 1], "tsam": [2, 1]}  # grace * rf**k, Ray's count
    assert [sched.arms[arm]._max_t for arm in ("sgd", "sam", "tsam")] == [12, 6, 2]
    assert decision_epochs(r) == {1, 2, 4, 8}  # every arm's rungs (sgd_ire: grace 2, 10 epochs: 2, 4, 8)
    assert budget_record(r.budget, r.max_epochs) == {"unit": "passes", "amount": 108, "arm_epochs": r.budget.arm_epochs}
    assert with_arm_epochs(study(None), ROWS) == study(None)


def test_epoch_and_seconds_budgets():
    s = validate(study(Budget(epochs=5)))
    assert s.max_epochs == 5 and s.epochs_of("sam") == 5 and s.with_budget(epochs=3).max_epochs == 3
    assert budget_record(s.budget, s.max_epochs) == {"unit": "epochs", "amount": 5}
    t = validate(study(Budget(seconds=30.0), max_epochs=40))
    spec = trial_spec(t, {"arm": "sgd", "seed": 0})
    assert (spec.epochs, spec.max_passes, spec.max_seconds) == (40, None, 30.0)
    assert budget_record(t.budget, t.max_epochs) == {"unit": "seconds", "amount": 30.0}
    with pytest.raises(ConfigError, match=r"each arm's epochs follow from its passes"):
        study(Budget(passes=100)).with_budget(epochs=3)


@pytest.mark.parametrize(
    "budget, arms, match",
    [
        (Budget(passes=0), None, r"budget=Budget\(passes=0\); expected an int in \[1, 1000000000000\]"),
        (Budget(passes=10, seconds=3), None, r"set exactly one of epochs, steps, passes, seconds"),
        (Budget(steps=0), None, r"budget=Budget\(steps=0\); expected an int in \[1, 1000000000000\]"),
        (Budget(seconds=float("inf")), None, r"budget=Budget\(seconds=inf\); expected a finite number of seconds > 0"),
        ("passes", None, r"budget='passes' \(str\); expected None or Budget\(epochs=...\), Budget\(steps=...\)"),
        (
            Budget(passes=100),
            (Arm("sgd", {"batch_size": sp.choice([64, 128])}),),
            r"arm 'sgd': field 'batch_size' is searched under budget=Budget\(passes=...\)",
        ),
        (
            Budget(steps=100),
            (Arm("sgd", {"batch_size": sp.choice([64, 128])}),),
            r"arm 'sgd': field 'batch_size' is searched under budget=Budget\(steps=...\); fix it per arm",
        ),
    ],
)
def test_bad_budgets_name_the_field_and_the_allowed_values(budget, arms, match):
    with pytest.raises(ConfigError, match=match):
        validate(study(budget, arms))


def test_a_budget_below_an_arms_first_step_fails_at_launch():
    with pytest.raises(
        ConfigError, match=r"arm 'tsam': budget=Budget\(passes=5\) does not cover one step \(6 passes\)"
    ):
        with_arm_epochs(validate(study(Budget(passes=5))), ROWS)


def test_dry_run_shows_each_arms_epochs():
    s = validate(study(Budget(passes=108)))
    p = plan(s, ROWS)
    assert p["budget"] == {"unit": "passes", "amount": 108}
    assert [a["budget"] for a in p["arms"]][:2] == [
        {"steps": 108, "epochs": 12, "passes_per_step": 1},
        {"steps": 54, "epochs": 6, "passes_per_step": 2},
    ]
    out = io.StringIO()
    render(s, Console(file=out, width=200))  # loads digits to count its rows
    text = out.getvalue()
    assert "budget in passes: 108 per trial" in text
    assert "sgd 12 epochs (108 steps x 1 passes), sam 6 epochs (54 steps x 2 passes), tsam 2 epochs" in text


def test_a_step_budget_gives_every_arm_the_same_steps_whatever_they_cost():
    arms = (Arm("sgd"), Arm("sam"), Arm("tsam", {"s": 3}), Arm("sgd", name="small", space={"batch_size": 64}))
    s = validate(study(Budget(steps=20), arms))
    got = {k: (v.steps, v.epochs, v.first_step_passes) for k, v in arm_budgets(s, ROWS).items()}
    # 20 steps: 9 a epoch at batch 128 (3 epochs, the last of 2 steps); 17 at batch 64 (2 epochs)
    assert got == {"sgd": (20, 3, 1), "sam": (20, 3, 2), "tsam": (20, 3, 6), "small": (20, 2, 1)}
    r = with_arm_epochs(s, ROWS)
    assert r.budget.arm_epochs == {"sgd": 3, "sam": 3, "tsam": 3, "small": 2} and r.max_epochs == 3
    spec = trial_spec(r, {"arm": "tsam", "seed": 0})
    assert (spec.epochs, spec.max_steps, spec.max_passes, spec.max_seconds) == (3, 20, None, None)
    assert budget_record(r.budget, r.max_epochs) == {"unit": "steps", "amount": 20, "arm_epochs": r.budget.arm_epochs}
    with pytest.raises(ConfigError, match=r"Budget\(steps=20\): each arm's epochs follow from its steps"):
        s.with_budget(epochs=3)
    p = plan(s, ROWS)
    assert p["max_epochs"] == 3 and [a["budget"] for a in p["arms"]][2] == {
        "steps": 20,
        "epochs": 3,
        "passes_per_step": 6,
    }
    out = io.StringIO()
    render(s, Console(file=out, width=300))
    text = out.getvalue()
    assert (
        "budget in steps: 20 per trial, the LR schedule over each arm's own: sgd 3 epochs (20 steps x 1 passes)" in text
    )
    assert "small 2 epochs (20 steps x 1 passes)" in text and "up to 3 epochs" in text
