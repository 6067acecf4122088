"""The flatness measures registry: one place where trials and studies compute flatness.

A study declares the measures it wants as ``{name: {param: value}}``, e.g.::

    {"fisher_trace": {}, "hessian_trace": {"probes": 30},
     "neighbourhood_loss": {"sigma": 0.03, "draws": 40}, "avg_sharpness": {"rho": 0.5, "adaptive": True}}

:func:`resolve_measures` validates that declaration before anything runs (every problem in one error);
:func:`measure_subset` picks the study's fixed evaluation subset (the same rows for every trial);
:func:`compute_measures` runs the measures on a trial's final model and returns ``flat/*`` metrics and
``time/measures_s`` (wall seconds of all measures together).

Registered measures (``flatlab measures`` lists them): ``fisher_trace`` (IRE paper: Tr(F) with sampled
labels), ``hessian_trace`` (Hutchinson 1989), ``neighbourhood_loss`` (TSAM paper, Fig. 2; with a sweep
over ``sigmas``), ``avg_sharpness`` (seed "In Search of the Successful Interpolation", App. A) and the
TSAM paper's three objectives of Table 2, ``erm_objective``, ``sam_objective`` and ``tilted_objective``
(:mod:`flatlab.sharpness.objectives`).
Each declares its metric keys (:attr:`Measure.metrics`) and their ranges (:attr:`Measure.support`, read
by comparison tables to clip intervals of means). Every measure draws its noise, probes or labels from
a generator seeded with ``compute_measures``' ``seed``: trials measured with the same seed on the same
subset see the same draws. Equations, units, metric keys and defaults: ``docs/algorithms/flatness.md``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from flatlab.batch import take
from flatlab.errors import ConfigError, did_you_mean
from flatlab.hparams import HParam, resolve
from flatlab.ranges import LOSS, NONNEGATIVE, Support, declared_support
from flatlab.registry import Registry
from flatlab.sharpness import _state
from flatlab.sharpness.average import average_sharpness, neighbourhood_loss
from flatlab.sharpness.data import DEFAULT_BATCH_SIZE, EvalSubset, LossFn, token_cross_entropy
from flatlab.sharpness.fisher import FISHER_ESTIMATORS, fisher_trace
from flatlab.sharpness.hessian import hessian_trace
from flatlab.sharpness.objectives import NOISES, erm_objective, log_mean_exp, sam_objective, tilted_objective

Compute = Callable[[nn.Module, EvalSubset, LossFn, Mapping[str, Any], int], Dict[str, float]]
"""``compute(model, subset, loss_fn, params, seed) -> {metric name: value}`` (params already resolved)."""

TIME_KEY = "time/measures_s"


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


MEASURES: Registry[Measure] = Registry("measure")


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


# ---- the registered measures ---------------------------------------------------------------------


def _with_stderr(key: str, value: float, stderr: float) -> Dict[str, float]:
    out = {key: float(value)}
    if math.isfinite(stderr):  # nan with a single draw: no standard error to report
        out[f"{key}_stderr"] = float(stderr)
    return out


def _fisher(model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int) -> Dict[str, float]:
    # The Fisher of the model's own predictive distribution: cross-entropy on sampled labels whatever
    # the training loss (label smoothing, a subset of logits ...), so loss_fn is not used.
    est = fisher_trace(model, subset, n_samples=p["samples"], estimator=p["estimator"], seed=seed)
    return _with_stderr("flat/fisher_trace", est.value, est.stderr)


def _hessian(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    est = hessian_trace(model, subset, n_probes=p["probes"], seed=seed, loss_fn=loss_fn)
    return _with_stderr("flat/hessian_trace", est.value, est.stderr)


def sweep_key(measure: str, param: str, value: Union[float, str], stat: str = "") -> str:
    """The metric name of a measure's sweep over one of its parameters at ``value``:
    ``flat/<measure>/<param>_<value>`` (``value`` with ``:g``; MLflow names allow no ``@`` or ``=``), then
    ``stat`` appended (``_var``, ``_stderr``: the ``_stderr`` ending keeps it among the auxiliary columns of
    comparison tables). The sweeps: ``neighbourhood_loss`` over ``sigma``, ``sam_objective`` over ``rho``,
    ``tilted_objective`` over ``t`` (:data:`flatlab.ranges.SWEEPS`)."""
    return f"flat/{measure}/{param}_{value if isinstance(value, str) else format(value, 'g')}{stat}"


def sigma_key(sigma: Union[float, str], stat: str = "") -> str:
    """``neighbourhood_loss``'s sweep at noise scale ``sigma`` (:func:`sweep_key`):
    ``flat/neighbourhood_loss/sigma_0.01`` (the mean), then ``stat`` = ``_var`` or ``_stderr`` appended."""
    return sweep_key("neighbourhood_loss", "sigma", sigma, stat)


def _neighbourhood(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    est = neighbourhood_loss(model, subset, sigma=p["sigma"], n_draws=p["draws"], seed=seed, loss_fn=loss_fn)
    out = _with_stderr("flat/neighbourhood_loss", est.mean, est.stderr)
    out["flat/neighbourhood_loss_var"] = float(est.variance)
    out["flat/neighbourhood_loss_clean"] = float(est.clean_loss)
    for sigma in p["sigmas"] or ():  # the same seed: the same standard-normal draws z at every sigma (eps = sigma z)
        at = neighbourhood_loss(model, subset, sigma=sigma, n_draws=p["draws"], seed=seed, loss_fn=loss_fn)
        out[sigma_key(sigma)] = float(at.mean)
        out[sigma_key(sigma, "_var")] = float(at.variance)
        if math.isfinite(at.stderr):
            out[sigma_key(sigma, "_stderr")] = float(at.stderr)
    return out


class _FloatList(HParam):
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


def _avg_sharpness(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    est = average_sharpness(
        model, subset, rho=p["rho"], n_draws=p["draws"], adaptive=p["adaptive"], seed=seed, loss_fn=loss_fn
    )
    out = _with_stderr("flat/avg_sharpness", est.value, est.stderr)
    out["flat/avg_sharpness_clean"] = float(est.clean_loss)
    return out


register_measure(
    Measure(
        name="fisher_trace",
        doc="Tr(F), Fisher with labels sampled from the model's softmax; (B, C) logits, or (B, T, V) token "
        "logits averaged per token (nats per parameter unit^2)",
        source="IRE paper (Improving Generalization and Convergence by Enhancing Implicit Regularization), "
        "flatness measure Tr(F) ~ Tr(H)",
        hparams=(
            HParam("samples", 1, int, low=1, doc="independent label draws per example (the estimate averages them)"),
            HParam(
                "estimator",
                "per_example",
                str,
                choices=FISHER_ESTIMATORS,
                doc="per_example: per-example gradients (tensor inputs); batch: Sophia/IRE's batch-gradient estimator",
            ),
        ),
        compute=_fisher,
        metrics=("flat/fisher_trace", "flat/fisher_trace_stderr"),
        support={"flat/fisher_trace": NONNEGATIVE, "flat/fisher_trace_stderr": NONNEGATIVE},
    )
)

register_measure(
    Measure(
        name="hessian_trace",
        doc="Hutchinson estimate of Tr(H) of the loss, Rademacher probes (loss units per parameter unit^2)",
        source="Hutchinson 1989; IRE paper's Tr(nabla^2 L)",
        hparams=(HParam("probes", 30, int, low=1, doc="Rademacher probes v, each giving v^T H v"),),
        compute=_hessian,
        metrics=("flat/hessian_trace", "flat/hessian_trace_stderr"),
        support={"flat/hessian_trace_stderr": NONNEGATIVE},  # the trace itself: unbounded (saddles, single probes)
    )
)

register_measure(
    Measure(
        name="neighbourhood_loss",
        doc="mean and variance of L(theta + eps), eps ~ N(0, sigma^2 I) (loss units; _var in loss units^2)",
        source="TSAM paper (Reweighting Local Minima with Tilted SAM), Fig. 2",
        hparams=(
            HParam(
                "sigma",
                0.03,
                float,
                low=0.0,
                low_open=True,
                doc="noise standard deviation per coordinate, parameter units "
                "(default 0.03: ours; the TSAM paper plots a range of scales)",
            ),
            HParam("draws", 40, int, low=2, doc="noise draws (>= 2 for the variance)"),
            _FloatList(
                "sigmas",
                None,
                float,
                low=0.0,
                low_open=True,
                doc="optional further noise scales (a sweep, TSAM Fig. 2): per sigma s, the keys "
                "flat/neighbourhood_loss/sigma_<s>, .../sigma_<s>_var, .../sigma_<s>_stderr",
            ),
        ),
        compute=_neighbourhood,
        metrics=(
            "flat/neighbourhood_loss",
            "flat/neighbourhood_loss_var",
            "flat/neighbourhood_loss_stderr",
            "flat/neighbourhood_loss_clean",
            sigma_key("<s>"),
            sigma_key("<s>", "_var"),
            sigma_key("<s>", "_stderr"),
        ),
        support={
            "flat/neighbourhood_loss": LOSS,
            "flat/neighbourhood_loss_var": NONNEGATIVE,
            "flat/neighbourhood_loss_stderr": NONNEGATIVE,
            "flat/neighbourhood_loss_clean": LOSS,
            sigma_key("<s>"): LOSS,
            sigma_key("<s>", "_var"): NONNEGATIVE,
            sigma_key("<s>", "_stderr"): NONNEGATIVE,
        },
    )
)

register_measure(
    Measure(
        name="avg_sharpness",
        doc="adaptive average sharpness E[L(theta + delta)] - L(theta), delta ~ N(0, rho^2 diag(|theta|^2)) "
        "(loss units)",
        source="'In Search of the Successful Interpolation' (robust fine-tuning of CLIP), App. A; "
        "Andriushchenko et al. 2023",
        hparams=(
            HParam(
                "rho",
                1.0,
                float,
                low=0.0,
                low_open=True,
                doc="noise scale, relative to |theta| when adaptive (seed paper App. A: 1.0)",
            ),
            HParam("draws", 20, int, low=1, doc="noise draws (seed paper: 20)"),
            HParam("adaptive", True, bool, doc="c = |theta| elementwise (True) or c = 1 (False)"),
        ),
        compute=_avg_sharpness,
        metrics=("flat/avg_sharpness", "flat/avg_sharpness_stderr", "flat/avg_sharpness_clean"),
        support={"flat/avg_sharpness_stderr": NONNEGATIVE, "flat/avg_sharpness_clean": LOSS},  # the value: unbounded
    )
)


def _erm_objective(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    return {"flat/erm_objective": erm_objective(model, subset, loss_fn=loss_fn).value}


def _sam_objective(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    def at(rho: float):
        return sam_objective(
            model, subset, rho=rho, steps=p["steps"], init_radius=p["init_radius"], seed=seed, loss_fn=loss_fn
        )

    got = at(p["rho"])
    out = {"flat/sam_objective": got.value, "flat/sam_objective_clean": got.clean_loss}
    for rho in p["rhos"] or ():  # the same seed: the same random start direction at every rho
        out[sweep_key("sam_objective", "rho", rho)] = at(rho).value
    return out


def _tilted_objective(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    got = tilted_objective(model, subset, seed=seed, loss_fn=loss_fn, **{k: v for k, v in p.items() if k != "ts"})
    out = {"flat/tilted_objective": got.value, "flat/tilted_objective_clean": got.clean_loss}
    for t in p["ts"] or ():  # the same perturbed losses L_j at every t: the curve against t is paired
        out[sweep_key("tilted_objective", "t", t)] = log_mean_exp(got.losses, t)
    return out


TSAM_TABLE2 = "TSAM paper (Reweighting Local Minima with Tilted SAM), section 5.2, Table 2"

register_measure(
    Measure(
        name="erm_objective",
        doc="L(theta), the mean loss over the subset: the ERM objective (loss units)",
        source=TSAM_TABLE2,
        hparams=(),
        compute=_erm_objective,
        metrics=("flat/erm_objective",),
        support={"flat/erm_objective": LOSS},
    )
)

register_measure(
    Measure(
        name="sam_objective",
        doc="max over ||eps||_2 <= rho of L(theta + eps), by SAM's ascent (steps=1) or projected ascent (loss units)",
        source=f"{TSAM_TABLE2}; Foret et al. 2021",
        hparams=(
            HParam("rho", 0.05, float, low=0.0, low_open=True, doc="L2 radius, global (TSAM paper grid: 0.05-0.2)"),
            HParam("steps", 1, int, low=1, doc="ascent steps: 1 = SAM's ascent rho*g/||g||; more = projected ascent"),
            HParam(
                "init_radius",
                0.0,
                float,
                low=0.0,
                high=1.0,
                doc="start: 0 = theta (SAM's ascent); more = a random point at init_radius * rho (stationary points)",
            ),
            _FloatList(
                "rhos",
                None,
                float,
                low=0.0,
                low_open=True,
                doc="optional further radii (a sweep, TSAM Figs. 5-6): per radius r, flat/sam_objective/rho_<r>",
            ),
        ),
        compute=_sam_objective,
        metrics=("flat/sam_objective", "flat/sam_objective_clean", sweep_key("sam_objective", "rho", "<s>")),
        support={
            "flat/sam_objective": LOSS,
            "flat/sam_objective_clean": LOSS,
            sweep_key("sam_objective", "rho", "<s>"): LOSS,
        },
    )
)

register_measure(
    Measure(
        name="tilted_objective",
        doc="(1/t) log mean_j exp(t L(theta + eps_j)), eps_j = delta_j + rho g_j/||g_j|| as TSAM samples them "
        "(loss units)",
        source=f"{TSAM_TABLE2}; Eq. 1, Algorithms 1-2",
        hparams=(
            HParam("t", 1.0, float, low=0.0, high=1e6, doc="tilt (0: mean over samples; paper's best 1, 5 or 20)"),
            HParam("s", 3, int, low=1, doc="perturbations sampled (paper: 3, 5)"),
            HParam("rho", 0.05, float, low=0.0, doc="ascent step added to each delta_j (0: none)"),
            HParam("noise_radius", 1.0, float, low=0.0, doc="radius r of delta_j, global L2 norm (TSAM's default)"),
            HParam("noise", "gaussian", str, choices=NOISES, doc="delta_j: clipped Gaussian or uniform in the r-ball"),
            _FloatList(
                "ts",
                None,
                float,
                low=0.0,
                high=1e6,
                doc="optional further tilts (a sweep, TSAM Figs. 5-6), from the same L_j: per tilt v, "
                "flat/tilted_objective/t_<v>",
            ),
        ),
        compute=_tilted_objective,
        metrics=("flat/tilted_objective", "flat/tilted_objective_clean", sweep_key("tilted_objective", "t", "<s>")),
        support={
            "flat/tilted_objective": LOSS,
            "flat/tilted_objective_clean": LOSS,
            sweep_key("tilted_objective", "t", "<s>"): LOSS,
        },
    )
)


# ---- validation ------------------------------------------------------------------------------------


def resolve_measures(spec: Mapping[str, Mapping[str, Any]], where: str) -> Dict[str, Dict[str, Any]]:
    """Validate a study's measures declaration and fill in the defaults.

    Args:
        spec: ``{measure name: {param: value}}``; ``{}`` as the value takes every default.
        where: what declared it, e.g. ``"study 'digits_flatness', measures"``; starts every message.

    Returns:
        ``{measure name: {param: value}}`` with every declared parameter, in the order of ``spec``.

    Raises:
        ConfigError: ``spec`` or one of its values is not a mapping, an unknown measure (listing the
            valid names), an unknown parameter (listing the accepted ones) or a value outside its
            allowed range; all problems in one error, one per line.
    """
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"{where}: measures must be a mapping {{measure name: {{param: value}}}}, e.g. "
            f"{{'hessian_trace': {{'probes': 30}}}}; got {type(spec).__name__} {spec!r}"
        )
    valid = list_measures()
    problems = []
    out: Dict[str, Dict[str, Any]] = {}
    for name, given in spec.items():
        if not isinstance(name, str) or name not in valid:
            problems.append(
                f"{where}: unknown measure {name!r}{did_you_mean(name, valid)}; valid measures: {', '.join(valid)}"
            )
            continue
        if not isinstance(given, Mapping):
            problems.append(
                f"{where}, measure {name!r}: parameters must be a mapping {{param: value}} ({{}} for the defaults); "
                f"got {type(given).__name__} {given!r}"
            )
            continue
        try:
            out[name] = get_measure(name).resolve(given, f"{where}, measure {name!r}")
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("\n".join(problems))
    return out


# ---- running ------------------------------------------------------------------------------------------


def compute_measures(
    model: nn.Module,
    subset: EvalSubset,
    loss_fn: Optional[LossFn],
    resolved: Mapping[str, Mapping[str, Any]],
    seed: int = 0,
) -> Dict[str, float]:
    """Run every measure of ``resolved`` on ``model`` over ``subset``.

    The model is evaluated in eval mode (BatchNorm uses and keeps its running statistics, dropout is
    off); its parameters, buffers, ``.grad`` and training flags are exactly as before afterwards, also
    when a measure raises.

    Args:
        model: the trial's final model, on the device it was trained on.
        subset: the fixed evaluation subset (:func:`measure_subset`).
        loss_fn: ``loss_fn(outputs, targets) -> scalar`` batch-mean loss (``None``: cross-entropy, per token
            for ``(B, T, V)`` logits);
            ``fisher_trace`` always uses cross-entropy on sampled labels.
        resolved: ``{measure: params}``, normally from :func:`resolve_measures` (validated again here).
        seed: seed of every measure's noise, probes and sampled labels; the same seed gives the same
            draws for every trial (paired comparisons).

    Returns:
        ``{metric name: float}``: each measure's :attr:`Measure.metrics` (``docs/algorithms/flatness.md``)
        and ``time/measures_s`` (wall seconds, all measures). Values may be ``nan``/``inf`` for a diverged
        model.

    Raises:
        ConfigError: an invalid ``resolved``; a measure that cannot apply to this model or subset (e.g.
            ``fisher_trace`` on outputs that are not ``(B, C)`` logits), the message naming the measure.
    """
    resolved = resolve_measures(resolved, "compute_measures")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"compute_measures: seed must be an int; got {seed!r}")
    if not isinstance(subset, EvalSubset):
        raise ConfigError(
            f"compute_measures: subset must be an EvalSubset (see measure_subset); got {type(subset).__name__}"
        )
    loss_fn = loss_fn or token_cross_entropy
    out: Dict[str, float] = {}
    start = time.perf_counter()
    with _state.eval_mode(model):
        for name, params in resolved.items():
            try:
                out.update(get_measure(name).compute(model, subset, loss_fn, params, seed))
            except ConfigError as exc:
                raise ConfigError(f"measure {name!r} cannot run on this model: {exc}") from exc
    out[TIME_KEY] = time.perf_counter() - start
    return out


def measure_subset(
    split: Any,
    examples: int,
    seed: int,
    batch_size: int = DEFAULT_BATCH_SIZE,
    device: Union[str, torch.device] = "cpu",
) -> EvalSubset:
    """The fixed evaluation subset a study measures on: ``examples`` rows of ``split``.

    The rows are the first ``examples`` of a permutation drawn with ``torch.Generator().manual_seed(seed)``,
    then sorted (kept in the split's order), so every trial with the same split and seed gets the same
    rows; ``examples`` of 0 or at least ``len(split)`` takes every row. Batches of ``batch_size``
    consecutive chosen rows, moved to ``device``.

    Inputs are passed to the model the way the trainer passes them: a tensor ``(N, ...)`` (or a
    tensor-like such as :class:`~flatlab.workloads.lazy_images.LazyImages`, decoded here) as
    ``model(x)``; a dict of ``(N, ...)`` tensors as ``model(x)`` too (stored as the one-element tuple
    ``(x,)`` in the batch); a tuple/list of ``(N, ...)`` tensors as ``model(*x)``.

    Args:
        split: a :class:`flatlab.workloads.base.Split` (``inputs``, ``targets`` with ``N`` rows).
        examples: subset size ``m`` (0 = all).
        seed: seed of the row choice (independent of the measures' noise seed).
        batch_size: rows per batch (memory, not the result: the loss is example-weighted).
        device: where the subset's tensors live (the model's device avoids a copy per pass).

    Returns:
        :class:`EvalSubset` of ``min(examples, N)`` (or ``N``) examples.

    Raises:
        ConfigError: ``examples < 0``, ``batch_size < 1``, a non-int seed, an empty split, or a
            split without ``inputs``/``targets``.
    """
    _state.check_count("examples", examples, minimum=0)
    _state.check_count("batch_size", batch_size)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an int; got {seed!r}")
    if not (hasattr(split, "inputs") and hasattr(split, "targets")):
        raise ConfigError(f"split must have inputs and targets (a flatlab Split); got {type(split).__name__}")
    n = len(split.targets)
    if n == 0:
        raise ConfigError("the split to measure on has no examples")
    m = n if examples == 0 or examples >= n else examples
    if m == n:
        idx = torch.arange(n)
    else:
        gen = torch.Generator().manual_seed(seed)
        idx = torch.randperm(n, generator=gen)[:m].sort().values

    def rows(ix: Any) -> Any:
        if isinstance(split.inputs, (tuple, list)):
            return tuple(take(t, ix) for t in split.inputs)
        return take(split.inputs, ix)

    x, y = rows(idx), split.targets[idx]
    batches = []
    for i in range(0, m, batch_size):
        part = slice(i, i + batch_size)
        xb = tuple(t[part] for t in x) if isinstance(x, tuple) else take(x, part)
        batches.append(((xb,) if isinstance(xb, dict) else xb, y[part]))
    return EvalSubset(tuple(batches)).to(device)


__all__ = [
    "LOSS",
    "MEASURES",
    "Measure",
    "NONNEGATIVE",
    "TIME_KEY",
    "compute_measures",
    "get_measure",
    "list_measures",
    "measure_subset",
    "measure_support",
    "register_measure",
    "resolve_measures",
    "sigma_key",
]
