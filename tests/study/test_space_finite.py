"""Infinite (and beyond-float) bounds and hyperparameter values are refused at validation, naming the field."""

import math

import pytest

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.study.validate import validate

INF = math.inf


@pytest.mark.parametrize(
    "dim, shown",
    [
        (sp.uniform(0.0, INF), "low=0.0, high=inf"),
        (sp.uniform(-INF, 1.0), "low=-inf, high=1.0"),
        (sp.loguniform(1e-3, INF), "low=0.001, high=inf"),
        (sp.uniform(0.0, 10**400), f"low=0.0, high={10**400}"),
        (sp.uniform(math.nan, 1.0), "low=nan, high=1.0"),
    ],
)
def test_float_range_with_a_non_finite_bound_is_refused(dim, shown):
    msg = (
        r"arm 'a', field 'lr': (log)?uniform\(low, high\) needs finite bounds \(and a finite width high - low\), got "
        + shown.replace(".", r"\.")
    )
    with pytest.raises(ConfigError, match=msg):
        dim.check(HParam("lr", 0.1, float, low=0.0, low_open=True), "arm 'a', field 'lr'")
    with pytest.raises(ConfigError, match=r"needs finite bounds"):
        dim.to_optuna()


@pytest.mark.parametrize("value", [INF, -INF, 10**400])
def test_non_finite_float_hyperparameter_is_refused(value):
    unbounded = HParam("eps", 1e-8, float)  # no declared bounds: infinity used to pass
    with pytest.raises(ConfigError, match=rf"w: eps={value!r} is not allowed; expected (a finite )?any float"):
        unbounded.validate(value, "w")
    with pytest.raises(ConfigError, match=r"eps="):
        sp.choice([1e-8, value]).check(unbounded, "w")
    assert unbounded.validate(1e30, "w") == 1e30  # large but finite (and within float32) is fine
    with pytest.raises(ConfigError, match=r"mask_interval=inf is not allowed; expected int in \[1, inf\)"):
        HParam("mask_interval", 10, int, low=1).validate(INF, "w")


@pytest.mark.parametrize(
    "space, match",
    [
        ({"lr": sp.uniform(0.01, INF)}, r"field 'lr'.*needs finite bounds"),
        ({"lr": 0.1, "momentum": sp.uniform(-INF, 0.9)}, r"field 'momentum'.*needs finite bounds"),
        ({"lr": INF}, r"lr=inf is not allowed; expected a finite float in \(0, inf\)"),
        (
            {"lr": 0.1, "weight_decay": sp.choice([0.0, INF])},
            r"weight_decay=inf is not allowed; expected a finite float",
        ),
    ],
)
def test_study_validation_refuses_infinite_values(space, match):
    study = Study(name="inf", workload="digits", arms=(Arm("sgd", space=space),), num_trials=1, max_epochs=1)
    with pytest.raises(ConfigError, match=match):
        validate(study)
