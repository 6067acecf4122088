"""Optuna distributions and Ray Tune domains written in a flatlab space, converted to flatlab dimensions.

A researcher used to Optuna or Tune may write ``optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)``
or ``tune.loguniform(1e-4, 1e-1)`` in an arm's space. Those with an exact flatlab equivalent become it:

=================================================  ==========================================
Optuna / Tune                                      flatlab
=================================================  ==========================================
``FloatDistribution(a, b, log=L)``                 ``Float(a, b, log=L)`` (``sp.uniform`` / ``sp.loguniform``)
``IntDistribution(a, b, log=L)`` (step 1)          ``sp.int(a, b, log=L)``
``CategoricalDistribution(c)``, ``tune.choice(c)``  ``sp.choice(c)``
``tune.uniform(a, b)``, ``tune.loguniform(a, b)``  ``sp.uniform(a, b)``, ``sp.loguniform(a, b)``
``tune.randint(a, b)``, ``tune.lograndint(a, b)``  ``sp.int(a, b - 1)`` (Tune's upper bound is exclusive)
``tune.grid_search(v)``                            ``sp.grid(v)``
=================================================  ==========================================

Everything else (a ``step``/``q`` quantisation, ``tune.randn``, ``tune.sample_from``) becomes
:class:`~flatlab.study.dims.Unsupported`, whose message names the flatlab way to write it; study
validation reports it naming the arm and the field. Neither library is imported unless such an object
is found (a study file loads without importing Ray).
"""

from __future__ import annotations

from typing import Any, Optional

from flatlab.lazy import lazy
from flatlab.study.dims import Choice, Dim, Float, Int, Unsupported

optuna_dist = lazy("optuna.distributions")
tune_sample = lazy("ray.tune.search.sample")


def from_foreign(value: Any) -> Optional[Dim]:
    """The flatlab dimension for an Optuna distribution, a Tune domain or ``tune.grid_search``'s dict;
    ``None`` for anything else (a plain value). Never raises: what cannot be converted is
    :class:`Unsupported`."""
    if isinstance(value, dict) and list(value) == ["grid_search"]:
        values = value["grid_search"]
        return Choice(tuple(values) if isinstance(values, (list, tuple)) else values, is_grid=True)
    module = type(value).__module__ or ""
    if module.startswith("optuna.distributions"):
        return _from_optuna(value)
    if module.startswith("ray.tune.search.sample"):
        return _from_tune(value)
    return None


def _from_optuna(d: Any) -> Optional[Dim]:
    name = type(d).__name__
    if isinstance(d, optuna_dist.FloatDistribution):
        if d.step is not None:
            return Unsupported(
                f"{name}(low={d.low}, high={d.high}, step={d.step}) has no flatlab equivalent (flatlab's float ranges "
                f"are continuous); write sp.uniform({d.low}, {d.high}) or sp.choice([...]) of the steps"
            )
        return Float(d.low, d.high, log=d.log)
    if isinstance(d, optuna_dist.IntDistribution):
        if d.step != 1:
            return Unsupported(
                f"{name}(low={d.low}, high={d.high}, step={d.step}) has no flatlab equivalent (sp.int steps by 1); "
                f"write sp.choice(list(range({d.low}, {d.high + 1}, {d.step})))"
            )
        return Int(d.low, d.high, log=d.log)
    if isinstance(d, optuna_dist.CategoricalDistribution):
        return Choice(tuple(d.choices))
    return Unsupported(f"{name} has no flatlab equivalent; use sp.uniform, sp.loguniform, sp.int or sp.choice")


def _from_tune(d: Any) -> Optional[Dim]:
    sampler = getattr(d, "sampler", None)
    if isinstance(sampler, tune_sample.Quantized):
        log = isinstance(sampler.sampler, (tune_sample.Float._LogUniform, tune_sample.Integer._LogUniform))
        if isinstance(d, tune_sample.Integer):
            return Unsupported(
                f"tune.q{'log' if log else ''}randint({d.lower}, {d.upper}, {sampler.q}) has no flatlab equivalent "
                f"(sp.int steps by 1); write sp.choice(list(range({d.lower}, {d.upper + 1}, {sampler.q})))"
            )
        kind = "loguniform" if log else "uniform"
        return Unsupported(
            f"tune.q{kind}({d.lower}, {d.upper}, {sampler.q}) (a quantised float) has no flatlab equivalent (flatlab's "
            f"float ranges are continuous); write sp.{kind}({d.lower}, {d.upper}) or sp.choice([...]) of the steps"
        )
    if isinstance(d, tune_sample.Float):
        if isinstance(sampler, tune_sample.Float._LogUniform):
            return Float(d.lower, d.upper, log=True)
        if isinstance(sampler, tune_sample.Float._Uniform):
            return Float(d.lower, d.upper)
        return Unsupported(
            "tune.randn (a normal distribution) has no flatlab equivalent (flatlab's ranges are bounded); "
            "write sp.uniform(low, high)"
        )
    if isinstance(d, tune_sample.Integer):
        log = isinstance(sampler, tune_sample.Integer._LogUniform)
        return Int(d.lower, d.upper - 1, log=log)  # Tune's upper bound is exclusive, flatlab's inclusive
    if isinstance(d, tune_sample.Categorical):
        return Choice(tuple(d.categories))
    return Unsupported(
        f"tune.sample_from(...) ({type(d).__name__}, a define-by-run value) has no flatlab equivalent; write "
        f"sp.choice/sp.uniform/..., and sp.when(parent, value, {{...}}) for a field that depends on another"
    )
