"""The flatness measures registry: name -> :class:`Measure` (parameters, metrics, their ranges, compute).

Each measure registers itself where its estimator is defined, with ``@register_measure(name=...)`` on
its compute function (:mod:`flatlab.registry`): ``fisher_trace`` in :mod:`~flatlab.sharpness.fisher`,
``hessian_trace`` in :mod:`~flatlab.sharpness.hessian`, ``neighbourhood_loss`` and ``avg_sharpness`` in
:mod:`~flatlab.sharpness.average`, and TSAM's ``erm_objective``, ``sam_objective`` and
``tilted_objective`` in :mod:`~flatlab.sharpness.objectives`. Validating a study's declaration and
running the measures on a trial's model: :mod:`flatlab.sharpness.measures`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from torch import nn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam, resolve
from flatlab.ranges import LOSS, Support, declared_support
from flatlab.registry import Registry
from flatlab.sharpness.data import EvalSubset, LossFn

Compute = Callable[[nn.Module, EvalSubset, LossFn, Mapping[str, Any], int], Dict[str, float]]
"""``compute(model, subset, loss_fn, params, seed) -> {metric name: value}`` (params already resolved)."""


def sweep_key(measure: str, param: str, value: Union[float, str], stat: str = "") -> str:
    """The metric name of a measure's sweep over one of its parameters at ``value``:
    ``flat/<measure>/<param>_<value>`` (``value`` with ``:g``; MLflow names allow no ``@`` or ``=``), then
    ``stat`` appended (``_var``, ``_stderr``: the ``_stderr`` ending keeps it among the auxiliary columns of
    comparison tables). The sweeps: ``neighbourhood_loss`` over ``sigma``, ``sam_objective`` over ``rho``,
    ``tilted_objective`` over ``t`` (:data:`flatlab.ranges.SWEEPS`)."""
    return f"flat/{measure}/{param}_{value if isinstance(value, str) else format(value, 'g')}{stat}"


class FloatList(HParam):
    """An optional non-empty list of distinct floats, each checked like a float ``HParam`` with the same bounds."""

    def _element(self, name: str) -> HParam:
        return HParam(name, 0.0, float, self.low, self.high, self.low_open, self.high_open)

    def allowed(self) -> str:
        each = self._element(self.name).allowed().removeprefix("float ")
        return f"None or a non-empty list of distinct floats, each {each}"

    def validate(self, value: Any, where: str = "") -> Any:
        if value is None:
            return None
        bad = ConfigError(
            f"{where + ': ' if where else ''}{self.name}={value!r} is not allowed; expected {self.allowed()}"
        )
        if not isinstance(value, (list, tuple)) or not value:
            raise bad
        out = tuple(self._element(f"{self.name}[{i}]").validate(v, where) for i, v in enumerate(value))
        if len(set(out)) != len(out):
            raise bad
        return out


@dataclass(frozen=True)
class Measure:
    """A registered flatness measure.

    Attributes:
        name: registry name used in studies (``fisher_trace``, ``hessian_trace`` ...).
        doc: one line: what is measured, units.
        source: paper and figure/equation the measure comes from.
        hparams: declared parameters with defaults and allowed ranges.
        compute: see :data:`Compute`; returns the metrics listed in ``metrics`` (the ``_stderr`` key only
            when the estimate has one, i.e. two or more draws/probes).
        metrics: every metric name ``compute`` may return.
        support: ``{metric: (low, high) or LOSS}``, the values a metric of ``metrics`` can take (``<s>``
            standing for any sweep value, as in ``metrics``); a metric not named is unbounded. Comparison
            tables clip the intervals of means to it (:func:`measure_support`).

    Raises:
        ValueError: a ``support`` key that is not in ``metrics``, or a range that is not ``low <= high``.
    """

    name: str
    doc: str
    source: str
    hparams: Tuple[HParam, ...]
    compute: Compute
    metrics: Tuple[str, ...] = ()
    support: Mapping[str, Union[Support, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, rng in self.support.items():
            if key not in self.metrics:
                raise ValueError(f"measure {self.name!r}: support names {key!r}, not one of its metrics {self.metrics}")
            if rng != LOSS and not (isinstance(rng, tuple) and len(rng) == 2 and rng[0] <= rng[1]):
                raise ValueError(
                    f"measure {self.name!r}: support of {key!r} must be (low, high) with low <= high or LOSS; "
                    f"got {rng!r}"
                )

    def resolve(self, given: Mapping[str, Any], where: str = "") -> Dict[str, Any]:
        """Defaults filled in and values validated; raises ``ConfigError`` naming every bad field."""
        return resolve(self.hparams, given, where or f"measure {self.name!r}")


MEASURES: Registry[Measure] = Registry(
    "measure",
    modules=(
        "flatlab.sharpness.fisher",
        "flatlab.sharpness.hessian",
        "flatlab.sharpness.average",
        "flatlab.sharpness.objectives",
    ),
)


def register_measure(
    measure: Optional[Measure] = None,
    *,
    name: str = "",
    doc: str = "",
    source: str = "",
    hparams: Tuple[HParam, ...] = (),
    metrics: Tuple[str, ...] = (),
    support: Optional[Mapping[str, Union[Support, str]]] = None,
) -> Any:
    """Add a measure to :data:`MEASURES`: ``register_measure(Measure(...))`` returns the measure; as a
    decorator of a :data:`Compute` function, ``@register_measure(name=..., doc=..., source=...,
    hparams=..., metrics=(...), support={...})`` registers ``Measure(name, doc, source, hparams, <the
    function>, metrics, support)`` and returns the function. Its metrics are named ``flat/<something>``.

    Raises:
        ValueError: the name is taken by a different definition (the same one again is fine: a study
            file loaded twice); a decorator without ``name``.
    """
    return MEASURES.register_or_decorate(
        measure,
        name,
        lambda compute: Measure(name, doc, source, tuple(hparams), compute, tuple(metrics), dict(support or {})),
        "register_measure(name=..., doc=..., source=...)",
    )


def get_measure(name: str) -> Measure:
    """Look up a registered measure.

    Raises:
        UnknownNameError: ``name`` is not registered (the message lists the valid names).
    """
    return MEASURES.get(name)


def list_measures() -> Tuple[str, ...]:
    """The registered measure names, sorted."""
    return tuple(MEASURES.names())


def declared_ranges() -> Dict[str, Union[Support, str]]:
    """Every registered measure's declared ranges (:attr:`Measure.support`), ``{flat/* metric: (low, high)
    or LOSS}``, in the order of :func:`list_measures`."""
    return {key: rng for name in list_measures() for key, rng in get_measure(name).support.items()}


def measure_support(metric: str, loss_support: Optional[Support]) -> Optional[Support]:
    """The range of a ``flat/*`` metric as its measure declares it (:attr:`Measure.support`), ``LOSS``
    read as ``loss_support``; ``None`` (unbounded) for a metric no registered measure bounds.
    ``flat/neighbourhood_loss/sigma_0.01`` matches the declared ``flat/neighbourhood_loss/sigma_<s>``."""
    return declared_support(metric, declared_ranges(), loss_support)


def with_stderr(key: str, value: float, stderr: float) -> Dict[str, float]:
    """``{key: value, key_stderr: stderr}``, the standard error left out when it is ``nan`` (one draw)."""
    out = {key: float(value)}
    if math.isfinite(stderr):
        out[f"{key}_stderr"] = float(stderr)
    return out
