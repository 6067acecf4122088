import math
import textwrap
from pathlib import Path

import pytest

from flatlab import Arm, Budget, Study
from flatlab import space as sp
from flatlab.errors import ConfigError
from flatlab.study.loader import load_studies
from flatlab.study.trial_spec import route, trial_spec
from flatlab.study.validate import validate

STUDIES_DIR = Path(__file__).resolve().parents[2] / "studies"


def base(**kw):
    args = dict(
        name="t",
        workload="digits",
        arms=(Arm("sgd", space={"lr": sp.loguniform(1e-3, 1.0)}),),
        num_trials=2,
        max_epochs=3,
        grace_period=1,
    )
    args.update(kw)
    return Study(**args)


def test_valid_study_passes_and_routes_fields():
    s = base(
        arms=(
            Arm(
                "sgd", space={"lr": 0.1, "batch_size": sp.choice([32, 64]), "width": 64, "momentum": sp.uniform(0, 0.9)}
            ),
        )
    )
    validate(s, "x.py")
    assert route(s, s.arms[0]) == {
        "lr": "optimizer",
        "batch_size": "trainer",
        "width": "workload",
        "momentum": "optimizer",
    }
    spec = trial_spec(s, {"arm": "sgd", "seed": 3, "lr": 0.1, "batch_size": 32, "width": 64, "momentum": 0.5})
    assert spec.optimizer_params == {"lr": 0.1, "momentum": 0.5}
    assert spec.trainer_params == {"batch_size": 32}
    assert spec.workload_params == {"width": 64}
    assert spec.seed == 3 and spec.epochs == 3


@pytest.mark.parametrize(
    "kw, match",
    [
        (
            dict(workload="mnist"),
            r"x\.py: study 't': field 'workload': unknown workload 'mnist' \(did you mean 'fashion_mnist'\?\); valid "
            r"workloads: .*digits",
        ),
        (
            dict(arms=(Arm("lbfgs"),)),
            r"arm 'lbfgs': field 'optimizer': unknown optimizer 'lbfgs'; valid optimizers: .*adamw.*sgd",
        ),
        (
            dict(arms=(Arm("sgd", space={"rho": 0.05}),)),
            r"arm 'sgd': field 'rho' is not accepted by optimizer 'sgd'.*accepted: .*lr",
        ),
        (
            dict(arms=(Arm("sgd", space={"lr": sp.uniform(-1.0, 1.0)}),)),
            r"arm 'sgd', field 'lr': lr=-1.0 is not allowed; expected float in \(0, inf\)",
        ),
        (
            dict(arms=(Arm("sgd", space={"momentum": 1.5}),)),
            r"field 'momentum': momentum=1.5 is not allowed; expected float in \[0, 1\)",
        ),
        (dict(metric="val/f1"), r"metric='val/f1' is not reported by workload 'digits'; it reports: .*val/accuracy"),
        (dict(mode="maximize"), r"mode='maximize'; expected one of max, min"),
        (dict(searcher="bayes"), r"searcher='bayes'; expected one of optuna, grid, random"),
        (dict(scheduler="pbt"), r"scheduler='pbt'; expected one of asha, fifo"),
        (dict(num_trials=0), r"num_trials=0; expected an int in \[1, 1000000\]"),
        (dict(grace_period=5), r"grace_period=5; expected an int in \[1, max_epochs=3\]"),
        (dict(arms=()), r"arms is empty"),
        (dict(arms=(Arm("sgd"), Arm("sgd"))), r"arm names must be unique"),
        (
            dict(workload_params={"model": "resnet"}),
            r"workload_params: model='resnet' is not allowed; expected one of 'mlp', 'cnn'",
        ),
        (
            dict(train={"schedule": "linear"}),
            r"field 'train': schedule='linear' is not allowed; expected one of 'constant', 'cosine', 'step'",
        ),
        (dict(searcher="grid"), r"field 'lr'.*cannot be enumerated by searcher='grid'"),
        (
            dict(arms=(Arm("sgd", space={"val_fraction": sp.choice([0.1, 0.2])}),)),
            r"arm 'sgd': field 'val_fraction' changes workload 'digits''s data, which is loaded once per study; set "
            r"it in Study\(workload_params=...\)",
        ),
        (
            dict(reference_arm="adamw"),
            r"x\.py: study 't': reference_arm='adamw'; expected None or one of the arm names: 'sgd'",
        ),
        (dict(target_loss=0.0), r"target_loss=0.0; expected None or a finite float > 0"),
        (dict(target_loss=math.inf), r"target_loss=inf; expected None or a finite float > 0"),
        (dict(target_metric=math.nan), r"target_metric=nan; expected None or a finite number \(the value of val/"),
        (dict(target_metric="0.9"), r"target_metric='0.9'; expected None or a finite number"),
        (
            dict(train={"curve_smoothing": 1.0}),
            r"field 'train': curve_smoothing=1.0 is not allowed; expected float in \[0, 1\)",
        ),
        (
            dict(reference_arm="sgd", target_loss=2.0),
            r"reference_arm='sgd' and target_loss=2.0 are both set; set at most one of them",
        ),
    ],
)
def test_bad_study_raises_naming_file_arm_and_field(kw, match):
    with pytest.raises(ConfigError, match=match):
        validate(base(**kw), "x.py")


def test_grace_period_is_bounded_by_the_budget_only_under_asha():
    validate(base(scheduler="fifo", max_epochs=1, grace_period=2), "x.py")  # FIFO never reads it
    with pytest.raises(
        ConfigError, match=r"grace_period=2; expected an int in \[1, max_epochs=1\] \(scheduler='asha'\)"
    ):
        validate(base(scheduler="asha", max_epochs=1, grace_period=2), "x.py")
    with pytest.raises(ConfigError, match=r"grace_period=0; expected an int in \[1, 1000000\]"):
        validate(base(scheduler="fifo", grace_period=0), "x.py")


def test_an_unknown_optimizer_does_not_hide_the_arms_own_range_errors():
    study = base(arms=(Arm("adamww", space={"lr": sp.loguniform(-1e-4, 1e-2), "beta1": sp.choice([])}),))
    with pytest.raises(ConfigError) as info:
        validate(study, "x.py")
    msg = str(info.value)
    assert "arm 'adamww': field 'optimizer': unknown optimizer 'adamww' (did you mean 'adamw'" in msg
    assert "arm 'adamww', field 'lr': loguniform: low > 0 must hold for a log range, but got low=-0.0001" in msg
    assert "arm 'adamww', field 'beta1': " in msg  # the empty choice, in the same report


def test_steps_to_target_fields():
    two = (Arm("sgd", space={"lr": 0.1}), Arm("adamw", space={"lr": 1e-3}))
    assert validate(base(arms=two, reference_arm="adamw")).reference_arm == "adamw"
    assert validate(base(target_loss=1.5)).target_loss == 1.5
    assert base().reference_arm is None and base().target_loss is None


def test_all_errors_reported_at_once():
    with pytest.raises(ConfigError) as info:
        validate(base(mode="up", num_trials=0, arms=(Arm("sgd", space={"rho": 1}),)), "x.py")
    text = str(info.value)
    assert "mode='up'" in text and "num_trials=0" in text and "field 'rho'" in text


def test_grid_searcher_enumerates_points_times_seeds():
    s = base(
        searcher="grid",
        seeds=(0, 1, 2),
        arms=(Arm("sgd", space={"lr": sp.grid([0.01, 0.1]), "momentum": sp.grid([0.0, 0.9])}),),
    )
    validate(s)
    assert s.num_total_trials() == 12
    pts = s.grid(s.arms[0])
    assert pts[0] == {"arm": "sgd", "seed": 0, "lr": 0.01, "momentum": 0.0}
    assert {p["seed"] for p in pts} == {0, 1, 2}


def test_with_budget_shrinks_trials_and_epochs():
    s = base(max_epochs=20, grace_period=4).with_budget(trials=1, epochs=2)
    assert (s.num_trials, s.max_epochs, s.grace_period) == (1, 2, 2)
    validate(s)


def test_loader_reports_file_and_missing_exports(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text(
        textwrap.dedent("""
        from flatlab import Arm, Study
        STUDY = Study(name="b", workload="digits", arms=(Arm("sgd", space={"kappa": 2.0}),))
    """)
    )
    with pytest.raises(ConfigError, match=r"bad\.py: study 'b', arm 'sgd': field 'kappa' is not accepted"):
        load_studies(str(f))
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with pytest.raises(ConfigError, match=r"empty\.py: a study file must define STUDY, STUDIES"):
        load_studies(str(empty))
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_studies(str(tmp_path / "nope.py"))


def test_loader_scales(tmp_path):
    f = tmp_path / "scaled.py"
    f.write_text(
        textwrap.dedent("""
        from flatlab import Arm, Study
        SCALES = ("paper", "smoke")
        def build(scale):
            epochs = 200 if scale == "paper" else 1
            return Study(name="s-" + scale, workload="digits", arms=(Arm("sgd"),), max_epochs=epochs, grace_period=1)
    """)
    )
    assert load_studies(str(f))[0].max_epochs == 200
    assert load_studies(str(f), scale="smoke")[0].name == "s-smoke"
    with pytest.raises(ConfigError, match=r"scale='huge' is not defined; valid scales: paper, smoke"):
        load_studies(str(f), scale="huge")


@pytest.mark.parametrize(
    "path", sorted(p for p in STUDIES_DIR.glob("*.py") if not p.name.startswith("_")), ids=lambda p: p.name
)
def test_every_study_file_loads_and_validates(path):
    studies = load_studies(str(path))
    assert studies and all(s.num_total_trials() >= 1 for s in studies)


def test_warns_when_ire_never_switches_on():
    arms = (Arm("sgd_ire", space={"lr": 0.1, "switch_epoch": 5}), Arm("sgd", space={"lr": 0.1}))
    s = validate(base(arms=arms, max_epochs=20, grace_period=1))
    assert s.warnings() == []
    short = s.with_budget(epochs=3)
    assert short.warnings() == [
        "arm 'sgd_ire': switch_epoch=5 >= max_epochs=3: IRE never switches on, so this arm trains exactly as its "
        "base optimizer"
    ]


def test_metric_reported_only_after_the_last_epoch_is_rejected():
    with pytest.raises(
        ConfigError, match=r"metric='test/accuracy' is reported only after the last epoch .* val/accuracy"
    ):
        validate(base(metric="test/accuracy"), "x.py")


def test_float_range_on_an_int_field_is_rejected_with_the_fix():
    study = base(arms=(Arm("tsam", space={"s": sp.uniform(1, 5)}),))
    with pytest.raises(
        ConfigError, match=r"arm 'tsam', field 's': s takes int in \[1, inf\), not a float range; use space.int\(1, 5\)"
    ):
        validate(study, "x.py")
    validate(base(arms=(Arm("tsam", space={"s": sp.int(1, 5)}),)), "x.py")


def test_default_grace_period_fits_a_short_budget_and_seeds_are_checked():
    assert validate(Study(name="t", workload="digits", arms=(Arm("sgd"),), max_epochs=1)).grace_period == 1
    assert Study(name="t", workload="digits", arms=(Arm("sgd"),), max_epochs=9).grace_period == 2
    with pytest.raises(ConfigError, match=r"seeds=\(0, 0, 1\) repeats a seed"):
        validate(base(seeds=(0, 0, 1)))
    with pytest.raises(
        ConfigError, match=r"seeds=0; expected a non-empty tuple of ints in \[0, 2\*\*32\), e.g. seeds=\(0, 1, 2\)"
    ):
        validate(base(seeds=0))


def test_arms_forms_a_study_author_slips_into():
    one = Study(name="t", workload="digits", arms=(Arm("sgd")))  # no trailing comma: one Arm, accepted
    assert one.arms == (Arm("sgd"),)
    with pytest.raises(ConfigError, match=r"arms must be Arm\(\.\.\.\) objects, got 'sgd' \(str\)"):
        Study(name="t", workload="digits", arms=("sgd", "adamw"))


def test_every_problem_of_train_and_of_every_study_at_once(tmp_path):
    with pytest.raises(ConfigError) as info:
        validate(base(train={"batch_size": 0, "epochs": 10}), "x.py")
    assert "unknown parameter(s) epochs" in str(info.value) and "batch_size=0" in str(info.value)
    assert all(
        line.startswith("x.py") or line.startswith("invalid study") or line.startswith("  x.py")
        for line in str(info.value).splitlines()
    )
    f = tmp_path / "two.py"
    f.write_text(
        "from flatlab import Arm, Study\n"
        "STUDIES = [Study(name='a', workload='digits', arms=(Arm('sgdd'),)),\n"
        "           Study(name='b', workload='digits', arms=(Arm('sgd'),), metric='val/acc')]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_studies(str(f))
    assert "study 'a'" in str(info.value) and "'sgdd'" in str(info.value) and "study 'b'" in str(info.value)


@pytest.mark.parametrize(
    "body, match",
    [
        ("STUDY = Study(name='t', workload='digits', arms=(Arm('sgd'),)\n", r"bad\.py, line \d+: syntax error"),
        ("import numpyy\n", r"bad\.py, line 3: No module named 'numpyy'; is it installed \(or spelt right\)\?"),
        ("x = 1 / 0\n", r"bad\.py, line 3: ZeroDivisionError: division by zero"),
        (
            "STUDY = Study(name='t', workload='digits', arms=(Arm('sgd', search_space={}),))\n",
            r"Arm\(\) has no field 'search_space' \(did you mean 'space'\?\)",
        ),
    ],
)
def test_study_file_errors_are_one_message_with_the_line(tmp_path, body, match):
    f = tmp_path / "bad.py"
    f.write_text("from flatlab import Arm, Study\nfrom flatlab import space as sp\n" + body)
    with pytest.raises(ConfigError, match=match):
        load_studies(str(f))
    with pytest.raises(ConfigError, match=r"is a directory; give a study file"):
        load_studies(str(tmp_path))


def test_warmup_longer_than_the_budget_warns():
    s = validate(base(train={"warmup_epochs": 5}, max_epochs=3))
    assert s.warnings() == ["train warmup_epochs=5 >= max_epochs=3: the LR never leaves its warm-up"]
    t = validate(base(train={"warmup_steps": 40}, budget=Budget(steps=40)))
    assert t.warnings() == ["train warmup_steps=40 >= budget steps=40: the LR never leaves its warm-up"]
    assert validate(base(train={"warmup_steps": 39}, budget=Budget(steps=40))).warnings() == []
    assert "int(16, 256, log=True)" == sp.int(16, 256, log=True).describe()


def test_a_combination_the_optimizer_rejects_is_reported_before_any_trial():
    bad = base(arms=(Arm("sgd", space={"lr": sp.loguniform(1e-3, 1.0), "nesterov": True, "momentum": 0.0}),))
    with pytest.raises(
        ConfigError, match=r"arm 'sgd': optimizer 'sgd' rejects these settings: .*nesterov=True needs momentum > 0"
    ):
        validate(bad, "x.py")
    # a searched momentum is probed at its middle value (0.45): a valid space is not rejected
    validate(base(arms=(Arm("sgd", space={"nesterov": True, "momentum": sp.uniform(0.0, 0.9)}),)), "x.py")
    assert sp.loguniform(1e-4, 1e-2).representative() == pytest.approx(1e-3)
    assert sp.int(16, 256, log=True).representative() == 64 and sp.choice(["a", "b"]).representative() == "a"


def test_arm_names_are_restricted_like_study_names():
    with pytest.raises(ConfigError, match=r"arm name 'sgd lr/0.1': use letters, digits, '_', '.', '-'"):
        validate(base(arms=(Arm("sgd", name="sgd lr/0.1"),)))


def test_a_grid_under_a_sampling_searcher_warns():
    s = validate(base(arms=(Arm("sgd", space={"lr": sp.grid([0.01, 0.1])}),), searcher="optuna"))
    assert s.warnings() == [
        "arm 'sgd': lr written as grid([...]) but searcher='optuna' samples them like choice([...]); use "
        "searcher='grid' to run every point"
    ]
    assert validate(base(arms=(Arm("sgd", space={"lr": sp.grid([0.01, 0.1])}),), searcher="grid")).warnings() == []
