"""Search-space primitives: ``loguniform``, ``uniform``, ``integer`` (``flatlab.space.int``), ``choice``,
``fixed``, ``grid``, the conditional ``when`` and ``best_of`` (a value from another study's results,
resolved at launch), and the operations on a space (:func:`sample`, :func:`grid_points`, :func:`ordered`
...).

Each dimension (:mod:`flatlab.study.dims`, re-exported here) maps to an Optuna distribution (Optuna TPE /
random searchers, which suggest the active fields of a trial one by one, define-by-run) and, where it is
discrete, to a list of values (the ``grid`` searcher, which enumerates only active combinations:
OptunaSearch cannot take ``tune.grid_search``). Optuna distributions and Ray Tune domains written in a
space are converted by :func:`as_dim`.
"""

from __future__ import annotations

import builtins
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from flatlab.errors import ConfigError
from flatlab.study.dims import (  # noqa: F401  (re-exported: flatlab.space and study code import them from here)
    MAX_INT_RANGE,
    SOURCE_SUFFIX,
    BestOf,
    Choice,
    Condition,
    Conditional,
    Dim,
    Fixed,
    Float,
    Int,
    Resolved,
    ResolvedChoice,
    Unsupported,
    _among,
    _is_int,
)
from flatlab.study.foreign import from_foreign


def best_of(study: str, arm: str, param: Optional[str] = None, where: Optional[Dict[str, Any]] = None) -> BestOf:
    """``param`` of the best completed trial of ``arm`` in study ``study``'s latest finished launch,
    resolved at launch (:class:`BestOf`); ``param=None`` gives that trial's run as ``run:<run_id>``.
    ``where``: only trials whose params have these values compete (numbers compared as numbers), e.g.
    ``where={"t": 20.0}``: the best learning rate at the tilt this study fixes."""
    return BestOf(
        study, arm, param, tuple(where.items()) if isinstance(where, dict) else where if where is not None else ()
    )


def loguniform(low: float, high: float) -> Float:
    """Log-uniform float in ``[low, high]``, ``0 < low < high`` (e.g. learning rates)."""
    return Float(low, high, log=True)


def uniform(low: float, high: float) -> Float:
    """Uniform float in ``[low, high]``, ``low < high``."""
    return Float(low, high)


def integer(low: builtins.int, high: builtins.int, log: bool = False) -> Int:
    """Integer in ``[low, high]``, both included (exported as ``flatlab.space.int``)."""
    return Int(low, high, log)


def choice(values: Union[List[Any], Tuple[Any, ...]]) -> Choice:
    """One of ``values`` (sampled by Optuna; enumerated by the grid searcher)."""
    return Choice(_as_values(values))


def grid(values: Union[List[Any], Tuple[Any, ...]]) -> Choice:
    """Exhaustive values, as a paper's grid (enumerated by ``searcher='grid'``, categorical for Optuna)."""
    return Choice(_as_values(values), is_grid=True)


def _as_values(values: Any) -> Any:
    """A list or tuple as a tuple; anything else as it is, for :meth:`Choice.problem` to report (building
    a dimension never raises)."""
    return tuple(values) if isinstance(values, (list, tuple)) else values


def fixed(value: Any) -> Fixed:
    """A constant parameter (writing the plain value in a space means the same)."""
    return Fixed(value)


def when(parent: str, value: Any, space: "dict[str, Any]") -> "dict[str, Conditional]":
    """Fields that exist only when field ``parent`` takes ``value`` (or one of ``value`` if it is a list or
    tuple). Spread it into an arm's space::

        {"schedule": sp.choice(["cosine", "step"]),
         **sp.when("schedule", "step", {"step_epochs": sp.int(5, 30), "step_factor": sp.uniform(0.1, 0.5)})}

    ``parent`` is another field of the same space (a ``choice``, ``grid``, ``int`` or fixed value);
    ``when`` nests (the inner fields need both conditions). Several values of one parent go in one list:
    two ``**when(...)`` naming the same field would silently keep only the last (Python's dict rules).

    Raises:
        ConfigError: ``space`` is not a dict (the other problems are reported by study validation).
    """
    if not isinstance(space, Mapping):
        raise ConfigError(
            f"when({parent!r}, {value!r}, space): space must be a dict of field -> dimension, got {space!r}"
        )
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    out: Dict[str, Conditional] = {}
    for key, entry in space.items():
        dim = as_dim(entry)
        if isinstance(dim, Conditional):
            out[key] = Conditional(dim.dim, ((parent, values),) + dim.conditions)
        else:
            out[key] = Conditional(dim, ((parent, values),))
    return out


def as_dim(value: Any) -> Dim:
    """A :class:`Dim` from a space entry: a flatlab dimension as it is; an Optuna distribution or a Ray Tune
    domain (``tune.loguniform`` ...) converted (:mod:`flatlab.study.foreign`), or :class:`Unsupported`
    naming the flatlab equivalent; any other plain value becomes :class:`Fixed`."""
    if isinstance(value, Dim):
        return value
    converted = from_foreign(value)
    return converted if converted is not None else Fixed(value)


def is_searched(dim: Dim) -> bool:
    """Not an unconditional constant."""
    return not isinstance(dim, Fixed)


def inner(dim: Dim) -> Dim:
    """The dimension itself, without its condition."""
    return dim.dim if isinstance(dim, Conditional) else dim


def ordered(space: "dict[str, Dim]") -> List[str]:
    """The fields of ``space`` with every condition's parent before its children, otherwise in declaration
    order (an unconditional space keeps its order).

    Raises:
        ConfigError: the conditions form a cycle (``a`` needs ``b`` which needs ``a``).
    """
    parents = {
        k: {p for p, _ in d.conditions if p in space and p != k} if isinstance(d, Conditional) else set()
        for k, d in space.items()
    }
    out: List[str] = []
    placed: set = set()
    while len(out) < len(space):
        ready = [k for k in space if k not in placed and parents[k] <= placed]
        if not ready:
            left = [k for k in space if k not in placed]
            raise ConfigError(f"fields {left} depend on each other through when(...): the conditions form a cycle")
        out.append(ready[0])
        placed.add(ready[0])
    return out


def sample(space: "dict[str, Dim]", pick: Callable[[str, Dim], Any]) -> "dict[str, Any]":
    """One trial's values: every active field (fixed values as they are, ``pick(name, dim)`` for the searched
    ones, parents before children); inactive fields are absent.

    Raises:
        ConfigError: from :func:`ordered`.
    """
    config: Dict[str, Any] = {}
    for name in ordered(space):
        dim = space[name]
        if isinstance(dim, Conditional):
            if not dim.active(config):
                continue
            dim = dim.dim
        config[name] = dim.value if isinstance(dim, Fixed) else pick(name, dim)
    return config


def grid_points(space: "dict[str, Dim]", where: str) -> List["dict[str, Any]"]:
    """The cartesian product of every dimension's grid values, in declaration order (last varies fastest),
    with only active combinations: a conditional field multiplies only the points where it is active and
    is absent from the others.

    Raises:
        ConfigError: a continuous dimension (naming ``where`` and the field), or a cycle of conditions.
    """
    points: List[Dict[str, Any]] = [{}]
    for name in ordered(space):
        dim = space[name]
        values = dim.grid_values(f"{where}, field {name!r}")
        grown: List[Dict[str, Any]] = []
        for p in points:
            if isinstance(dim, Conditional) and not dim.active(p):
                grown.append(p)  # inactive here: the field is absent from this point
            else:
                grown.extend({**p, name: v} for v in values)
        points = grown
    return points


def representatives(space: "dict[str, Dim]") -> List["dict[str, Any]"]:
    """Typical trial configs (:meth:`Dim.representative` of every searched field): the plain one, plus one
    per conditional field inactive there, with its parents (and theirs) set to the first value that
    activates it. Study validation builds the arm's optimizer with each.

    Raises:
        ConfigError: from :func:`ordered`.
    """
    base = sample(space, lambda n, d: d.representative())
    out = [base]
    for name, dim in space.items():
        if not isinstance(dim, Conditional) or name in base:
            continue
        forced: Dict[str, Any] = {}
        todo = list(dim.conditions)
        while todo:
            parent, values = todo.pop(0)
            if parent in forced or parent not in space:
                continue
            forced[parent] = values[0]
            if isinstance(space[parent], Conditional):
                todo.extend(space[parent].conditions)  # type: ignore[attr-defined]
        config = sample(space, lambda n, d, forced=forced: forced[n] if n in forced else d.representative())
        if config not in out:
            out.append(config)
    return out


def condition_problems(space: "dict[str, Dim]") -> List[Tuple[str, str]]:
    """``(field, message)`` for every condition that cannot work: a parent that is not a field of the space,
    is continuous, or never takes the value; a cycle of conditions."""
    out: List[Tuple[str, str]] = []
    for name, dim in space.items():
        if not isinstance(dim, Conditional) or dim.problem():
            continue
        for parent, values in dim.conditions:
            if parent == name:
                out.append((name, f"when({parent!r}, ...) makes the field depend on itself"))
                continue
            if parent not in space:
                out.append(
                    (
                        name,
                        f"when({parent!r}, ...): condition on unknown field {parent!r}; the arm's fields: "
                        f"{', '.join(k for k in space if k != name)}",
                    )
                )
                continue
            pdim = inner(space[parent])
            if pdim.problem():
                continue  # reported on the parent's own field
            takes = _takes(pdim)
            if takes is None:
                out.append(
                    (
                        name,
                        f"when({parent!r}, ...): {parent!r} is {pdim.describe()}, continuous; a condition "
                        f"needs a discrete parent: choice([...]), grid([...]), int(low, high) or a fixed value",
                    )
                )
                continue
            for v in values:
                if not takes(v):
                    out.append(
                        (
                            name,
                            f"when({parent!r}, {v!r}, ...): {parent!r} never takes {v!r}; it takes {pdim.describe()}",
                        )
                    )
    if not out:
        try:
            ordered(space)
        except ConfigError as exc:
            out.append((next(k for k, d in space.items() if isinstance(d, Conditional)), str(exc)))
    return out


def _takes(dim: Dim) -> Optional[Callable[[Any], bool]]:
    """Whether a value is one ``dim`` can take; ``None`` for continuous dimensions."""
    if isinstance(dim, Fixed):
        return lambda v: _among(v, (dim.value,))
    if isinstance(dim, Choice):
        return lambda v: _among(v, dim.values)
    if isinstance(dim, Int):
        return lambda v: _is_int(v) and dim.low <= v <= dim.high
    return None
