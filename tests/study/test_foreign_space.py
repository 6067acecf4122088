"""Optuna distributions and Ray Tune domains in a space: converted to flatlab's dimensions (values and log
flag), or a ConfigError that names the flatlab equivalent."""

import optuna.distributions as od
import pytest
from ray import tune

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.errors import ConfigError
from flatlab.study.space import Unsupported, as_dim
from flatlab.study.validate import validate


@pytest.mark.parametrize(
    "foreign, expected",
    [
        (od.FloatDistribution(1e-4, 1e-1, log=True), sp.loguniform(1e-4, 1e-1)),
        (od.FloatDistribution(0.0, 0.9), sp.uniform(0.0, 0.9)),
        (od.IntDistribution(1, 8), sp.int(1, 8)),
        (od.IntDistribution(2, 64, log=True), sp.int(2, 64, log=True)),
        (od.CategoricalDistribution([3, 5]), sp.choice([3, 5])),
        (tune.loguniform(1e-3, 1.0), sp.loguniform(1e-3, 1.0)),
        (tune.uniform(0.0, 0.5), sp.uniform(0.0, 0.5)),
        (tune.randint(1, 9), sp.int(1, 8)),  # Tune's upper bound is exclusive
        (tune.lograndint(2, 65), sp.int(2, 64, log=True)),
        (tune.choice(["gaussian", "uniform"]), sp.choice(["gaussian", "uniform"])),
        (tune.grid_search([0.05, 0.1]), sp.grid([0.05, 0.1])),
    ],
)
def test_foreign_dimensions_convert_exactly(foreign, expected):
    dim = as_dim(foreign)
    assert dim == expected
    assert type(dim.low if hasattr(dim, "low") else dim.values[0]) is type(
        expected.low if hasattr(expected, "low") else expected.values[0]
    )


def test_converted_space_validates_and_runs_like_flatlab_s_own():
    arm = Arm(
        "sgd",
        space={
            "lr": tune.loguniform(1e-3, 1.0),
            "momentum": od.FloatDistribution(0.0, 0.9),
            "nesterov": tune.choice([False, True]),
        },
    )
    validate(Study(name="f", workload="digits", arms=(arm,)))
    assert arm.dims["lr"] == sp.loguniform(1e-3, 1.0) and arm.dims["lr"].log is True
    assert arm.dims["momentum"].log is False


@pytest.mark.parametrize(
    "foreign, match",
    [
        (
            od.FloatDistribution(0.0, 1.0, step=0.1),
            r"FloatDistribution\(low=0.0, high=1.0, step=0.1\) has no flatlab equivalent "
            r".*write sp.uniform\(0.0, 1.0\)",
        ),
        (
            od.IntDistribution(2, 10, step=2),
            r"IntDistribution\(low=2, high=10, step=2\) has no flatlab equivalent .*write sp.choice\(list\(range\(2, "
            r"11, 2\)\)\)",
        ),
        (
            tune.qrandint(1, 9, 2),
            r"tune.qrandint\(1, 9, 2\) has no flatlab equivalent .*sp.choice\(list\(range\(1, 10, 2\)\)\)",
        ),
        (
            tune.quniform(0.0, 1.0, 0.25),
            r"tune.quniform\(0.0, 1.0, 0.25\) \(a quantised float\) has no flatlab equivalent.*write "
            r"sp.uniform\(0.0, 1.0\)",
        ),
        (tune.qloguniform(0.01, 1.0, 0.01), r"tune.qloguniform\(0.01, 1.0, 0.01\) .*write sp.loguniform\(0.01, 1.0\)"),
        (tune.randn(), r"tune.randn .*no flatlab equivalent.*write sp.uniform\(low, high\)"),
        (tune.sample_from(lambda spec: 0.9), r"tune.sample_from.*no flatlab equivalent.*sp.when\(parent, value"),
    ],
)
def test_unconvertible_ones_name_the_flatlab_equivalent(foreign, match):
    assert isinstance(as_dim(foreign), Unsupported)  # building never raises
    arm = Arm("sgd", space={"momentum": foreign})
    with pytest.raises(ConfigError, match=r"arm 'sgd', field 'momentum': " + match):
        validate(Study(name="f", workload="digits", arms=(arm,)))


def test_unconvertible_dimension_inside_when_is_reported_on_its_field():
    arm = Arm(
        "sgd", space={"nesterov": sp.choice([False, True]), **sp.when("nesterov", True, {"momentum": tune.randn()})}
    )
    with pytest.raises(ConfigError, match=r"arm 'sgd', field 'momentum': tune.randn"):
        validate(Study(name="f", workload="digits", arms=(arm,)))
