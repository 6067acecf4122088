"""A pass budget end to end on local Ray: SGD and SAM at equal passes, through ASHA and the final stage;
every final run spends the budget to within one step's passes, SGD trains twice SAM's epochs, and the
launch record names the unit (:mod:`flatlab.study.budget`). A step budget likewise: SGD and SAM at equal
steps, every run exactly that many steps (SAM at twice SGD's passes)."""

import json

import pytest

from flatlab import Arm, Budget, Study
from flatlab import space as sp
from flatlab.study.validate import validate
from flatlab.tracking.trials import trials_frame

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PASSES = 70  # digits: 1079 rows / 128 = 9 steps per epoch; SGD 70 steps (8 epochs), SAM 35 (4 epochs)


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory):
    import ray

    from flatlab.study.runner import RunOptions, run_study

    root = tmp_path_factory.mktemp("root")
    study = validate(
        Study(
            name="budget2",
            workload="digits",
            workload_params={"model": "mlp", "width": 8},
            train={"batch_size": 128},
            arms=(
                Arm("sgd", space={"lr": sp.loguniform(0.01, 0.1)}),
                Arm("sam", space={"lr": sp.loguniform(0.01, 0.1)}),
            ),
            num_trials=2,
            budget=Budget(passes=PASSES),
            grace_period=2,
            reduction_factor=2,
            max_concurrent=2,
            final_seeds=(11,),
        )
    )
    outcome = run_study(study, RunOptions(root=root, num_cpus=2))
    ray.shutdown()
    return root, study, outcome


def test_every_final_run_spends_the_budget_and_sgd_trains_twice_sams_epochs(budget_run):
    root, study, outcome = budget_run
    df = trials_frame(outcome.tracking_uri, study.name)
    final = df[df["stage"] == "final"]
    assert sorted(final["arm"]) == ["sam", "sgd"]
    step = {"sgd": 1, "sam": 2}
    for _, row in final.iterrows():
        spent = row["compute_total/passes"]
        assert PASSES - step[row["arm"]] < spent <= PASSES, (row["arm"], spent)
        assert row["compute/passes"] == spent  # the last epoch's cumulative count is the total
        assert row["compute_total/forward"] == spent  # SGD and SAM: one forward per backward
    epochs = {row["arm"]: row["epochs"] for _, row in final.iterrows()}
    assert epochs == {"sgd": 8, "sam": 4}
    search = df[df["stage"] == "search"]
    assert (search["compute/passes"] <= PASSES).all()
    launch = json.loads((root / study.name / "launch.json").read_text())
    assert launch["status"] == "finished"
    assert launch["budget"] == {"unit": "passes", "amount": PASSES, "arm_epochs": {"sgd": 8, "sam": 4}}


STEPS = 20  # digits at batch 128: 9 steps per epoch, so 2 whole epochs and 2 steps of a third


@pytest.fixture(scope="module")
def step_run(tmp_path_factory):
    import ray

    from flatlab.study.runner import RunOptions, run_study

    root = tmp_path_factory.mktemp("root")
    study = validate(
        Study(
            name="budget_steps",
            workload="digits",
            workload_params={"model": "mlp", "width": 8},
            train={"batch_size": 128, "warmup_steps": 4},
            arms=(
                Arm("sgd", space={"lr": sp.loguniform(0.01, 0.1)}),
                Arm("sam", space={"lr": sp.loguniform(0.01, 0.1)}),
            ),
            num_trials=1,
            scheduler="fifo",
            budget=Budget(steps=STEPS),
            max_concurrent=2,
            final_seeds=(11,),
        )
    )
    outcome = run_study(study, RunOptions(root=root, num_cpus=2))
    ray.shutdown()
    return root, study, outcome


def test_every_run_takes_exactly_the_budgets_steps(step_run):
    root, study, outcome = step_run
    df = trials_frame(outcome.tracking_uri, study.name)
    assert sorted(df["stage"]) == ["final", "final", "search", "search"]
    for _, row in df.iterrows():
        per_step = {"sgd": 1, "sam": 2}[row["arm"]]
        assert row["compute_total/passes"] == STEPS * per_step, (row["arm"], row["stage"])
        assert row["compute_total/examples"] == 2 * 1079 + 2 * 128  # 2 epochs and 2 mini-batches of 128
        assert row["epochs"] == 3
    launch = json.loads((root / study.name / "launch.json").read_text())
    assert launch["budget"] == {"unit": "steps", "amount": STEPS, "arm_epochs": {"sgd": 3, "sam": 3}}
