"""Conditional fields (space.when) through validation, the grid, the Optuna/random searchers, the trial
spec, MLflow's params and the plan."""

import optuna
import pytest
from ray.tune.search import Searcher

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.errors import ConfigError
from flatlab.study.plan import plan
from flatlab.study.searchers import ArmSearcher
from flatlab.study.space import grid_points, ordered
from flatlab.study.trial_spec import trial_spec
from flatlab.study.validate import validate

STEP = {"step_epochs": sp.int(5, 30), "step_factor": sp.uniform(0.1, 0.5)}


def step_study(searcher="optuna", num_trials=12, **space):
    arm = Arm(
        "sgd",
        space={
            "lr": sp.loguniform(0.01, 0.5),
            "schedule": sp.choice(["cosine", "step"]),
            **sp.when("schedule", "step", STEP),
            **space,
        },
    )
    return validate(
        Study(name="c", workload="digits", arms=(arm,), num_trials=num_trials, max_epochs=4, searcher=searcher)
    )


def test_when_wraps_each_field_and_nests():
    out = sp.when("a", [1, 2], {"x": sp.uniform(0, 1), **sp.when("b", "u", {"y": 3})})
    assert out["x"] == sp.Conditional(sp.uniform(0, 1), (("a", (1, 2)),))
    assert out["y"] == sp.Conditional(sp.fixed(3), (("a", (1, 2)), ("b", ("u",))))
    assert (
        out["y"].active({"a": 2, "b": "u"})
        and not out["y"].active({"a": 2})
        and not out["y"].active({"a": 3, "b": "u"})
    )
    assert not out["x"].active({"a": True}) and not out["x"].active({"a": 1.0})  # same type required: True is not 1
    assert out["y"].describe() == "3 if a in [1, 2] and b == 'u'"
    with pytest.raises(ConfigError, match=r"when\('a', 1, space\): space must be a dict"):
        sp.when("a", 1, [sp.uniform(0, 1)])


def test_grid_enumerates_only_active_combinations():
    arm = Arm(
        "sgd",
        space={
            "lr": sp.grid([0.1, 0.2]),
            "schedule": sp.grid(["cosine", "step"]),
            **sp.when("schedule", "step", {"step_epochs": sp.grid([5, 10]), "step_factor": 0.5}),
        },
    )
    study = validate(Study(name="g", workload="digits", arms=(arm,), searcher="grid", seeds=(0, 1)))
    configs = study.grid(arm)
    # lr (2) x [cosine (1) + step x step_epochs (2)] = 6 points, x 2 seeds
    assert len(configs) == 12 == study.num_total_trials()
    cosine = [c for c in configs if c["schedule"] == "cosine"]
    step = [c for c in configs if c["schedule"] == "step"]
    assert len(cosine) == 4 and all(set(c) == {"arm", "seed", "lr", "schedule"} for c in cosine)
    assert sorted((c["lr"], c["step_epochs"], c["seed"]) for c in step) == [
        (lr, e, s) for lr in (0.1, 0.2) for e in (5, 10) for s in (0, 1)
    ]
    assert all(c["step_factor"] == 0.5 for c in step)
    # declaration order is kept: the first field varies slowest
    assert [(p["lr"], p["schedule"], p.get("step_epochs")) for p in grid_points(arm.dims, "w")] == [
        (0.1, "cosine", None),
        (0.1, "step", 5),
        (0.1, "step", 10),
        (0.2, "cosine", None),
        (0.2, "step", 5),
        (0.2, "step", 10),
    ]


def test_child_declared_before_its_parent_is_ordered_after_it():
    space = {**sp.when("p", "on", {"c": sp.grid([1, 2])}), "p": sp.grid(["off", "on"])}
    assert ordered(space) == ["p", "c"]
    assert grid_points(space, "w") == [{"p": "off"}, {"p": "on", "c": 1}, {"p": "on", "c": 2}]


@pytest.mark.parametrize("kind", ["optuna", "random"])
def test_optuna_and_random_suggest_only_active_fields(tmp_path, kind):
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    s = ArmSearcher(step_study(kind), optuna_storage=storage, launch="L")
    configs = [s.suggest(f"t{i}") for i in range(12)]
    branches = {c["schedule"] for c in configs}
    assert branches == {"cosine", "step"}  # 12 draws of a fair coin (seeded): both branches occur
    for c in configs:
        if c["schedule"] == "step":
            assert set(c) == {"arm", "seed", "lr", "schedule", "step_epochs", "step_factor"}
            assert isinstance(c["step_epochs"], int) and 5 <= c["step_epochs"] <= 30 and 0.1 <= c["step_factor"] <= 0.5
        else:
            assert set(c) == {"arm", "seed", "lr", "schedule"}
    st = optuna.load_study(study_name="L.sgd", storage=storage)
    for c, t in zip(configs, sorted(st.trials, key=lambda t: t.number)):
        assert t.params == {k: v for k, v in c.items() if k not in ("arm", "seed")}  # Optuna records what ran
    assert isinstance(st.trials[0].distributions["lr"], optuna.distributions.FloatDistribution)
    assert st.trials[0].distributions["lr"].log


def test_optuna_is_told_the_values_of_conditional_trials():
    s = ArmSearcher(step_study(num_trials=6), optuna_storage=None, launch="L")
    for i in range(6):
        s.suggest(f"t{i}")
        s.on_trial_complete(f"t{i}", {"epoch": 4, "val/accuracy": 0.5 + 0.01 * i, "completed": 1})
    assert s.suggest("t6") == Searcher.FINISHED
    st = s._studies["sgd"]
    assert [t.value for t in st.trials] == pytest.approx([0.5 + 0.01 * i for i in range(6)])


def test_inactive_field_leaves_the_trainer_default():
    study = step_study()
    cosine = trial_spec(study, {"arm": "sgd", "seed": 0, "lr": 0.1, "schedule": "cosine"})
    assert cosine.trainer_params == {"schedule": "cosine"} and cosine.optimizer_params == {"lr": 0.1}
    step = trial_spec(
        study, {"arm": "sgd", "seed": 0, "lr": 0.1, "schedule": "step", "step_epochs": 7, "step_factor": 0.2}
    )
    assert step.trainer_params == {"schedule": "step", "step_epochs": 7, "step_factor": 0.2}


def test_inactive_field_is_not_an_mlflow_param(tmp_path):
    from flatlab.tracking import runs
    from flatlab.tracking.callback import MLflowTrialLogger

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    exp = runs.get_or_create_experiment(uri, "cond")
    parent = runs.client(uri).create_run(exp).info.run_id
    cb = MLflowTrialLogger(uri, exp, parent, {}, {"sgd": "sgd"}, metric="val/accuracy", mode="max")
    searcher = ArmSearcher(step_study(), launch="L")
    configs = {}
    for i in range(12):
        configs[f"t{i}"] = searcher.suggest(f"t{i}")

    class FakeTrial:
        def __init__(self, tid):
            self.trial_id, self.config = tid, configs[tid]

    cosine = next(t for t, c in configs.items() if c["schedule"] == "cosine")
    step = next(t for t, c in configs.items() if c["schedule"] == "step")
    for tid in (cosine, step):
        cb.on_trial_start(0, [], FakeTrial(tid))
    cb.close()
    client = runs.client(uri)
    params = {}
    for tid in (cosine, step):
        run = client.search_runs([exp], filter_string=f"tags.`{runs.TAG_TRIAL}` = '{tid}'")[0]
        params[tid] = run.data.params
    assert "step_epochs" not in params[cosine] and "step_factor" not in params[cosine]
    assert params[cosine]["schedule"] == "cosine"
    assert params[step]["step_epochs"] == str(configs[step]["step_epochs"])
    assert float(params[step]["step_factor"]) == pytest.approx(configs[step]["step_factor"])


@pytest.mark.parametrize(
    "extra, match",
    [
        (
            sp.when("sched", "step", {"step_epochs": 5}),
            r"arm 'sgd', field 'step_epochs': when\('sched', \.\.\.\): condition on unknown field 'sched'; the arm's "
            r"fields: lr, schedule",
        ),
        (
            sp.when("schedule", "linear", {"warmup_epochs": 1.0}),
            r"arm 'sgd', field 'warmup_epochs': when\('schedule', 'linear', \.\.\.\): 'schedule' never takes "
            r"'linear'; it takes choice\(\['cosine', 'step'\]\)",
        ),
        (
            sp.when("lr", 0.1, {"warmup_epochs": 1.0}),
            r"arm 'sgd', field 'warmup_epochs': when\('lr', \.\.\.\): 'lr' is loguniform\(0.01, 0.5\), continuous; a "
            r"condition needs a discrete parent",
        ),
        (
            sp.when("schedule", "step", {"step_factor": sp.uniform(0.1, 1.5)}),
            r"arm 'sgd', field 'step_factor': step_factor=1.5 is not allowed; expected float in \(0, 1\]",
        ),
        (
            sp.when("schedule", "step", {"stepepochs": 5}),
            r"arm 'sgd': field 'stepepochs' \(did you mean 'step_epochs'.*is not accepted by optimizer 'sgd'",
        ),
        (
            sp.when("schedule", [], {"step_epochs": 5}),
            r"arm 'sgd', field 'step_epochs': when\('schedule', value, space\): value must be a value or a non-empty "
            r"list",
        ),
    ],
)
def test_bad_conditions_name_the_arm_and_field(extra, match):
    arm = Arm("sgd", space={"lr": sp.loguniform(0.01, 0.5), "schedule": sp.choice(["cosine", "step"]), **extra})
    with pytest.raises(ConfigError, match=match):
        validate(Study(name="c", workload="digits", arms=(arm,)))


def test_cycle_of_conditions_is_a_config_error():
    space = {**sp.when("b", 1, {"a": sp.choice([1, 2])}), **sp.when("a", 1, {"b": sp.choice([1, 2])})}
    with pytest.raises(
        ConfigError, match=r"arm 'sgd', field 'a': fields \['a', 'b'\] depend on each other through when"
    ):
        validate(Study(name="c", workload="digits", arms=(Arm("sgd", space=space),)))


def test_int_and_fixed_parents_and_a_continuous_parent():
    space = {
        "nesterov": sp.choice([False, True]),
        "batch_size": sp.int(16, 64),
        "schedule": "step",
        **sp.when("nesterov", True, {"momentum": sp.uniform(0.5, 0.9)}),
        **sp.when("batch_size", 32, {"weight_decay": 1e-4}),
        **sp.when("schedule", "step", {"step_epochs": 2}),
        **sp.when("momentum", 0.5, {"lr": 0.1}),
    }
    with pytest.raises(
        ConfigError, match=r"field 'lr': when\('momentum', \.\.\.\): 'momentum' is uniform\(0.5, 0.9\), continuous"
    ):
        validate(Study(name="c", workload="digits", arms=(Arm("sgd", space=space),)))
    space.pop("lr")
    study = validate(Study(name="c", workload="digits", arms=(Arm("sgd", space=space),)))
    s = ArmSearcher(study, launch="L")
    for c in (s.suggest(f"t{i}") for i in range(8)):
        assert c["step_epochs"] == 2  # a condition on a fixed value always holds
        assert ("momentum" in c) == c["nesterov"] and ("weight_decay" in c) == (c["batch_size"] == 32)
    with pytest.raises(
        ConfigError,
        match=r"field 'weight_decay': when\('batch_size', 9, \.\.\.\): 'batch_size' never takes 9; it takes int\(16, "
        r"64\)",
    ):
        validate(
            Study(
                name="c",
                workload="digits",
                arms=(Arm("sgd", space={**space, **sp.when("batch_size", 9, {"weight_decay": 0.0})}),),
            )
        )
    with pytest.raises(
        ConfigError,
        match=r"field 'step_factor': when\('schedule', 'cosine', \.\.\.\): 'schedule' never takes 'cosine'; it takes "
        r"'step'",
    ):
        validate(
            Study(
                name="c",
                workload="digits",
                arms=(Arm("sgd", space={**space, **sp.when("schedule", "cosine", {"step_factor": 0.5})}),),
            )
        )


def test_optimizer_probe_covers_each_branch():
    # the representative momentum is 0.9 (the first choice); the branch momentum=0.0 with nesterov=True is
    # what SGD rejects, and it is only built because the probe activates each conditional field once
    arm = Arm(
        "sgd", space={"lr": 0.1, "momentum": sp.choice([0.9, 0.0]), **sp.when("momentum", 0.0, {"nesterov": True})}
    )
    with pytest.raises(ConfigError, match=r"arm 'sgd': optimizer 'sgd' rejects these settings: .*[Nn]esterov"):
        validate(Study(name="c", workload="digits", arms=(arm,)))


def test_define_by_run_function_is_refused_with_the_way_to_write_it():
    with pytest.raises(ConfigError, match=r"arm 'sgd': space=.* is a function; .*space\.when\(parent, value"):
        Arm("sgd", space=lambda trial: {"lr": trial.suggest_float("lr", 0.01, 0.1)})


def test_plan_shows_the_conditions():
    p = plan(step_study())
    arm = p["arms"][0]
    assert arm["conditions"] == {"step_epochs": "schedule == 'step'", "step_factor": "schedule == 'step'"}
    assert arm["searched"]["step_epochs"] == "int(5, 30) if schedule == 'step'"
    assert arm["searched"]["step_factor"] == "uniform(0.1, 0.5) if schedule == 'step'"


def test_dry_run_prints_the_conditions(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flatlab.cli.main import app

    f = tmp_path / "cond_study.py"
    f.write_text(
        "from flatlab import Arm, Study, space as sp\n"
        "STUDY = Study(name='cond', workload='digits', arms=(Arm('sgd', space={'lr': sp.loguniform(0.01, 0.5), "
        "'schedule': sp.choice(['cosine', 'step']), **sp.when('schedule', 'step', {'step_epochs': sp.int(5, "
        "30)})}),))\n"
    )
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["run", str(f), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "step_epochs ~ int(5, 30) if schedule == 'step'" in res.output


def test_readme_examples_of_named_arms_and_conditional_fields():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "studies.md").read_text()
    start = text.index("## Several arms of one optimizer")
    section = text[start : text.index("\n## ", start + 1)] if "\n## " in text[start + 1 :] else text[start:]
    named, conditional = re.findall(r"```python\n(.*?)```", section, re.S)
    ns = {"Arm": Arm, "sp": sp}
    exec(named, ns)
    arm = eval(conditional, ns)
    study = validate(Study(name="readme", workload="digits", arms=ns["arms"] + (arm,), num_trials=16))
    assert [a.name for a in study.arms] == ["sgd", "sgd_nesterov", "sam"]
    s = ArmSearcher(study, launch="L")
    sam = [c for c in (s.suggest(f"t{i}") for i in range(48)) if c["arm"] == "sam"]
    assert (
        len(sam) == 16
        and {c["momentum"] for c in sam} == {0.0, 0.9}
        and {c["schedule"] for c in sam} == {"cosine", "step"}
    )
    assert all(
        ("nesterov" in c) == (c["momentum"] == 0.9) and ("step_epochs" in c) == (c["schedule"] == "step") for c in sam
    )
    assert plan(study)["arms"][2]["searched"]["nesterov"] == "choice([False, True]) if momentum == 0.9"
