"""The flatness measures a study declares, validated and run: one place where trials compute flatness.

A study declares the measures it wants as ``{name: {param: value}}``, e.g.::

    {"fisher_trace": {}, "hessian_trace": {"probes": 30},
     "neighbourhood_loss": {"sigma": 0.03, "draws": 40}, "avg_sharpness": {"rho": 0.5, "adaptive": True}}

:func:`resolve_measures` validates that declaration before anything runs (every problem in one error);
:func:`measure_subset` picks the study's fixed evaluation subset (the same rows for every trial);
:func:`compute_measures` runs the measures on a trial's final model and returns ``flat/*`` metrics and
``time/measures_s`` (wall seconds of all measures together).

Registered measures (``flatlab measures`` lists them; :mod:`flatlab.sharpness.registry`, where the
registry and its lookups live, names where each is defined): ``fisher_trace`` (IRE paper: Tr(F) with
sampled labels), ``hessian_trace`` (Hutchinson 1989), ``neighbourhood_loss`` (TSAM paper, Fig. 2; with
a sweep over ``sigmas``), ``avg_sharpness`` (seed "In Search of the Successful Interpolation", App. A)
and the TSAM paper's three objectives of Table 2, ``erm_objective``, ``sam_objective`` and
``tilted_objective`` (:mod:`flatlab.sharpness.objectives`).
Each declares its metric keys (:attr:`Measure.metrics`) and their ranges (:attr:`Measure.support`, read
by comparison tables to clip intervals of means). Every measure draws its noise, probes or labels from
a generator seeded with ``compute_measures``' ``seed``: trials measured with the same seed on the same
subset see the same draws. Equations, units, metric keys and defaults: ``docs/algorithms/flatness.md``.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Mapping, Optional, Union

import torch
from torch import nn

from flatlab.batch import take
from flatlab.errors import ConfigError, did_you_mean
from flatlab.ranges import LOSS, NONNEGATIVE
from flatlab.sharpness import _state
from flatlab.sharpness.average import sigma_key
from flatlab.sharpness.data import DEFAULT_BATCH_SIZE, EvalSubset, LossFn, token_cross_entropy
from flatlab.sharpness.registry import (
    MEASURES,
    Measure,
    declared_ranges,
    get_measure,
    list_measures,
    measure_support,
    register_measure,
    sweep_key,
)

TIME_KEY = "time/measures_s"


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
    "declared_ranges",
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
    "sweep_key",
]
