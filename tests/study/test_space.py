import math

import optuna
import pytest

from flatlab import space as sp
from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.study.space import grid_points


def test_float_ranges_map_to_optuna():
    d = sp.loguniform(1e-4, 1e-1).to_optuna()
    assert isinstance(d, optuna.distributions.FloatDistribution)
    assert (d.low, d.high, d.log) == (1e-4, 1e-1, True)
    u = sp.uniform(0.0, 0.9).to_optuna()
    assert (u.low, u.high, u.log) == (0.0, 0.9, False)
    i = sp.int(1, 8).to_optuna()
    assert isinstance(i, optuna.distributions.IntDistribution) and (i.low, i.high) == (1, 8)
    c = sp.choice([3, 5]).to_optuna()
    assert isinstance(c, optuna.distributions.CategoricalDistribution) and c.choices == (3, 5)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: sp.uniform(1.0, 1.0), r"uniform: low < high must hold, but got low=1.0, high=1.0"),
        (lambda: sp.loguniform(0.1, 0.01), r"loguniform: low < high must hold"),
        (lambda: sp.loguniform(0.0, 1.0), r"loguniform: low > 0 must hold for a log range, but got low=0.0"),
        (lambda: sp.int(5, 2), r"int: low < high must hold, but got low=5, high=2"),
        (lambda: sp.int(1.5, 3), r"int\(low, high\) needs integers"),
        (lambda: sp.choice([]), r"choice\(\[...\]\) needs at least one value, got an empty list"),
        (lambda: sp.grid([]), r"grid\(\[...\]\) needs at least one value"),
        (lambda: sp.choice([1, 1]), r"choice: values must be distinct, got \[1, 1\]"),
    ],
)
def test_bad_dimensions_raise_clear_errors(make, match):
    dim = make()  # building never raises: validation names the arm and field
    with pytest.raises(ConfigError, match=r"arm 'a', field 'x': " + match):
        dim.check(HParam("x", 1, int), "arm 'a', field 'x'")
    with pytest.raises(ConfigError, match=match):
        dim.to_optuna()


def test_grid_points_are_the_cartesian_product_in_order():
    pts = grid_points({"rho": sp.grid([0.05, 0.1]), "t": sp.grid([0, 1, 5]), "s": sp.fixed(3)}, "w")
    assert len(pts) == 6
    assert pts[0] == {"rho": 0.05, "t": 0, "s": 3}
    assert pts[-1] == {"rho": 0.1, "t": 5, "s": 3}
    assert [p["t"] for p in pts[:3]] == [0, 1, 5]


def test_continuous_dimension_cannot_be_a_grid():
    with pytest.raises(ConfigError, match=r"field 'lr'.*continuous and cannot be enumerated by searcher='grid'"):
        grid_points({"lr": sp.loguniform(1e-3, 1.0)}, "arm x")


def test_dimension_checked_against_declared_range():
    gamma = HParam("gamma", 0.9, float, low=0.0, high=1.0, low_open=True, high_open=True)
    sp.uniform(0.5, 0.99).check(gamma, "w")
    with pytest.raises(ConfigError, match=r"gamma=1.0 is not allowed; expected float in \(0, 1\)"):
        sp.uniform(0.5, 1.0).check(gamma, "w")
    s = HParam("s", 3, int, low=1)
    with pytest.raises(ConfigError, match=r"s=0 is not allowed; expected int in \[1, inf\)"):
        sp.grid([0, 3]).check(s, "w")
    assert math.isclose(HParam("x", 1.0).validate(2), 2.0)
