"""Search dimensions: the value types of an arm's space (:class:`Dim` and its kinds).

:class:`Float`, :class:`Int`, :class:`Choice` (also a ``grid``), :class:`Fixed`, the chained
:class:`BestOf` and its :class:`Resolved` value (and :class:`ResolvedChoice`, a choice of chained
references after launch), :class:`Conditional` (a ``when`` field) and
:class:`Unsupported` (a foreign object without a flatlab equivalent). Each maps to an Optuna
distribution and, where it is discrete, to a list of grid values. Study files build them with the
functions of :mod:`flatlab.space` (:mod:`flatlab.study.space`); :mod:`flatlab.study.foreign` converts
Optuna distributions and Ray Tune domains into them. This module imports no other flatlab study module.
"""

from __future__ import annotations

import builtins
import math
import re
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.lazy import lazy

optuna = lazy("optuna")


class Dim:
    """One search dimension. Building one never raises: :meth:`problem` is reported by study validation
    (naming the file, the arm and the field) and by :meth:`valid` before any use."""

    def problem(self) -> Optional[str]:
        """What is wrong with this dimension itself (``None`` if nothing)."""
        return None

    def valid(self, where: str = "") -> "Dim":
        """``self``; raises ``ConfigError`` (prefixed with ``where``) if :meth:`problem` finds something."""
        msg = self.problem()
        if msg:
            raise ConfigError(f"{where}: {msg}" if where else msg)
        return self

    def to_optuna(self) -> Any:
        """The equivalent ``optuna.distributions`` object."""
        raise NotImplementedError

    def suggest(self, trial: Any, name: str) -> Any:
        """A value for field ``name`` from the Optuna trial ``trial`` (``trial.suggest_*``, define-by-run)."""
        raise NotImplementedError

    def grid_values(self, where: str) -> List[Any]:
        """Values the ``grid`` searcher enumerates; raises ``ConfigError`` for continuous dimensions."""
        raise ConfigError(
            f"{where}: {self!r} is continuous and cannot be enumerated by searcher='grid'; "
            "use grid([...]) or choice([...]), or searcher='optuna'"
        )

    def check(self, hp: HParam, where: str) -> None:
        """Raise ``ConfigError`` if any value this dimension can take is outside ``hp``'s allowed range."""
        raise NotImplementedError

    def representative(self) -> Any:
        """One typical value (the middle of a range, geometric for log ranges; a choice's first value; a
        constant itself): study validation builds each arm's optimizer with these once, so that a
        combination it rejects is reported before any trial starts."""
        raise NotImplementedError

    def describe(self) -> str:
        return repr(self)


@dataclass(frozen=True)
class Float(Dim):
    """A float in ``[low, high]``, both finite, log-uniform if ``log`` (then ``low > 0`` is required)."""

    low: float
    high: float
    log: bool = False

    def problem(self) -> Optional[str]:
        kind = "loguniform" if self.log else "uniform"
        if not (_is_number(self.low) and _is_number(self.high)):
            return f"{kind}(low, high) needs numbers, got low={self.low!r}, high={self.high!r}"
        if not (_finite(self.low) and _finite(self.high) and _finite(self.high - self.low)):
            return (
                f"{kind}(low, high) needs finite bounds (and a finite width "
                f"high - low), got low={self.low!r}, high={self.high!r}"
            )
        if not self.low < self.high:
            return f"{kind}: low < high must hold, but got low={self.low}, high={self.high}"
        if self.log and self.low <= 0:
            return f"loguniform: low > 0 must hold for a log range, but got low={self.low}"
        return None

    def to_optuna(self) -> Any:
        self.valid()
        return optuna.distributions.FloatDistribution(float(self.low), float(self.high), log=self.log)

    def suggest(self, trial: Any, name: str) -> float:
        self.valid()
        return trial.suggest_float(name, float(self.low), float(self.high), log=self.log)

    def check(self, hp: HParam, where: str) -> None:
        self.valid(where)
        if hp.kind is builtins.int and hp.choices is None:
            raise ConfigError(
                f"{where}: {hp.name} takes {hp.allowed()}, not a float "
                f"range; use space.int({self.low:g}, {self.high:g})"
            )
        if hp.kind is not float or hp.choices is not None:
            raise ConfigError(f"{where}: {hp.name} takes {hp.allowed()}, not a float range")
        hp.validate(self.low, where)
        hp.validate(self.high, where)

    def representative(self) -> float:
        return math.sqrt(self.low * self.high) if self.log else 0.5 * (self.low + self.high)

    def describe(self) -> str:
        return f"{'loguniform' if self.log else 'uniform'}({self.low:g}, {self.high:g})"


@dataclass(frozen=True)
class Int(Dim):
    """An integer in ``[low, high]`` (both included), log-uniform if ``log``."""

    low: builtins.int
    high: builtins.int
    log: bool = False

    def problem(self) -> Optional[str]:
        if not (_is_int(self.low) and _is_int(self.high)):
            return f"int(low, high) needs integers, got low={self.low!r}, high={self.high!r}"
        if max(abs(self.low), abs(self.high)) > MAX_INT_RANGE:
            return (
                "int(low, high) needs |low|, |high| <= 2**53 (Optuna samples "
                f"integers as floats), got low={self.low}, high={self.high}"
            )
        if not self.low < self.high:
            return f"int: low < high must hold, but got low={self.low}, high={self.high}"
        if self.log and self.low <= 0:
            return f"int(log=True): low > 0 must hold, but got low={self.low}"
        return None

    def to_optuna(self) -> Any:
        self.valid()
        return optuna.distributions.IntDistribution(self.low, self.high, log=self.log)

    def suggest(self, trial: Any, name: str) -> builtins.int:
        self.valid()
        return trial.suggest_int(name, self.low, self.high, log=self.log)

    def grid_values(self, where: str) -> List[Any]:
        self.valid(where)
        return list(range(self.low, self.high + 1))

    def check(self, hp: HParam, where: str) -> None:
        self.valid(where)
        if hp.kind is not builtins.int and hp.kind is not float:
            raise ConfigError(f"{where}: {hp.name} takes {hp.allowed()}, not an integer range")
        hp.validate(self.low, where)
        hp.validate(self.high, where)

    def representative(self) -> builtins.int:
        middle = math.sqrt(self.low * self.high) if self.log else 0.5 * (self.low + self.high)
        return min(self.high, max(self.low, round(middle)))

    def describe(self) -> str:
        return f"int({self.low}, {self.high}{', log=True' if self.log else ''})"


@dataclass(frozen=True)
class Choice(Dim):
    """One of ``values`` (categorical). ``is_grid``: written as ``grid([...])`` (enumerated exhaustively)."""

    values: Tuple[Any, ...]
    is_grid: bool = False

    def problem(self) -> Optional[str]:
        name = "grid" if self.is_grid else "choice"
        if not isinstance(self.values, tuple):
            return f"{name}([...]) needs a list of values, got {self.values!r}"
        if len(self.values) == 0:
            return f"{name}([...]) needs at least one value, got an empty list"
        if len(set(map(repr, self.values))) != len(self.values):
            return f"{name}: values must be distinct, got {list(self.values)}"
        return None

    def to_optuna(self) -> Any:
        self.valid()
        return optuna.distributions.CategoricalDistribution(list(self.values))

    def suggest(self, trial: Any, name: str) -> Any:
        self.valid()
        return trial.suggest_categorical(name, list(self.values))

    def grid_values(self, where: str) -> List[Any]:
        self.valid(where)
        return list(self.values)

    def check(self, hp: HParam, where: str) -> None:
        self.valid(where)
        for v in self.values:
            hp.validate(v, where)

    def representative(self) -> Any:
        return self.values[0]

    def describe(self) -> str:
        return f"{'grid' if self.is_grid else 'choice'}({list(self.values)})"


@dataclass(frozen=True)
class Fixed(Dim):
    """A constant (same as writing the value itself in a space)."""

    value: Any

    def grid_values(self, where: str) -> List[Any]:
        return [self.value]

    def check(self, hp: HParam, where: str) -> None:
        hp.validate(self.value, where)

    def representative(self) -> Any:
        return self.value

    def describe(self) -> str:
        return repr(self.value)


SOURCE_SUFFIX = ".source"  # ``<field>.source``: where a chained value came from (``<study>/<run_id>``)
_STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class BestOf(Dim):
    """A value read from ANOTHER study's results when this study is launched (chained studies).

    ``param`` of the best completed trial of arm ``arm`` in the latest FINISHED launch of study
    ``study`` (best by that study's own metric and mode; final-stage re-runs are not candidates);
    ``param=None``: that trial's run as ``"run:<run_id>"`` (e.g. the ``finetuned`` model of
    ``clip_interpolate``); ``where``: ``(field, value)`` pairs a candidate trial's params must equal.
    :func:`flatlab.study.chain.resolve_chained` replaces it with a
    :class:`Resolved` constant once per launch; before that it is one grid value (itself), so a grid's
    size and the dry-run plan are known. Building one never raises (see :meth:`problem`).
    """

    study: str
    arm: str
    param: Optional[str] = None
    where: Tuple[Tuple[str, Any], ...] = ()

    def problem(self) -> Optional[str]:
        if not (isinstance(self.study, str) and _STUDY_NAME.match(self.study)):
            return (
                f"best_of(study, arm, param): study={self.study!r}; "
                "expected a study name (letters, digits, '_', '.', '-')"
            )
        if not (isinstance(self.arm, str) and self.arm):
            return f"best_of(study, arm, param): arm={self.arm!r}; expected the name of an arm of study {self.study!r}"
        if self.param is not None and not (isinstance(self.param, str) and self.param):
            return (
                f"best_of(study, arm, param): param={self.param!r}; expected a field name, or None for the run itself"
            )
        if not (
            isinstance(self.where, tuple)
            and all(isinstance(kv, tuple) and len(kv) == 2 and isinstance(kv[0], str) for kv in self.where)
        ):
            return (
                f"best_of(..., where=...): where={self.where!r}; expected "
                "a dict of field -> value, e.g. where={'t': 20.0}"
            )
        return None

    def to_optuna(self) -> Any:
        raise ConfigError(f"{self.describe()} is resolved at launch (flatlab.study.chain.resolve_chained), not sampled")

    def grid_values(self, where: str) -> List[Any]:
        self.valid(where)
        return [self]  # one value, known at launch

    def check(self, hp: HParam, where: str) -> None:
        self.valid(where)  # the value itself is checked against ``hp`` when it is resolved

    def representative(self) -> Any:
        return None  # unknown before launch: study validation does not probe the optimizer with it

    def describe(self) -> str:
        where = f", where={dict(self.where)!r}" if self.where else ""
        return f"best_of({self.study!r}, arm={self.arm!r}, param={self.param!r}{where})"


@dataclass(frozen=True)
class Resolved(Fixed):
    """A :class:`BestOf` after resolution: the constant ``value`` and where it came from (``source``,
    ``<study>/<run_id>``). Behaves as :class:`Fixed` everywhere."""

    source: str = ""

    def describe(self) -> str:
        return f"{self.value!r} (from {self.source})"


@dataclass(frozen=True)
class ResolvedChoice(Choice):
    """A :class:`Choice` some of whose values were chained references (``mlflow:<study>/<arm>?...``),
    each replaced at launch by the run it names (``run:<run_id>``): ``sources[i]`` is ``values[i]``'s
    reference, ``""`` for a value given as it is. Behaves as :class:`Choice` everywhere."""

    sources: Tuple[str, ...] = ()


MAX_INT_RANGE = 2**53  # largest |bound| of an int range: Optuna's IntDistribution computes in float64


def _finite(x: Any) -> bool:
    """``x`` converts to a finite float (not NaN, not infinite, not an int beyond float's range)."""
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def _is_number(x: Any) -> bool:
    return isinstance(x, (builtins.int, float)) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, builtins.int) and not isinstance(x, bool)


@dataclass(frozen=True)
class Unsupported(Dim):
    """A space entry that has no flatlab equivalent (an Optuna distribution with ``step``, ``tune.randn`` ...).
    Building it never raises: :meth:`problem` (``message``, naming the flatlab equivalent) is reported by
    study validation, naming the arm and the field."""

    message: str

    def problem(self) -> Optional[str]:
        return self.message

    def check(self, hp: HParam, where: str) -> None:
        self.valid(where)

    def describe(self) -> str:
        return f"<{self.message}>"


Condition = Tuple[str, Tuple[Any, ...]]  # (parent field, the values of it that make the field active)


@dataclass(frozen=True)
class Conditional(Dim):
    """``dim``, active in a trial only when every condition holds: for each ``(parent, values)`` in
    ``conditions`` the trial's value of field ``parent`` is one of ``values`` (same type and equal; an
    inactive parent makes its children inactive too). Written with :func:`when`. An inactive field is
    absent from the trial's config, so from its MLflow params, and its declared default applies."""

    dim: Dim
    conditions: Tuple[Condition, ...]

    def problem(self) -> Optional[str]:
        for parent, values in self.conditions:
            if not isinstance(parent, str) or not parent:
                return f"when(parent, value, space): parent must be a field name, got {parent!r}"
            if not values:
                return f"when({parent!r}, value, space): value must be a value or a non-empty list of values, got []"
        return self.dim.problem()

    def active(self, config: "dict[str, Any]") -> bool:
        """All conditions hold for the (partial) trial config ``config``."""
        return all(parent in config and _among(config[parent], values) for parent, values in self.conditions)

    def to_optuna(self) -> Any:
        return self.dim.to_optuna()

    def suggest(self, trial: Any, name: str) -> Any:
        return self.dim.suggest(trial, name)

    def grid_values(self, where: str) -> List[Any]:
        return self.dim.grid_values(where)

    def check(self, hp: HParam, where: str) -> None:
        self.valid(where)
        self.dim.check(hp, where)

    def representative(self) -> Any:
        return self.dim.representative()

    def condition_text(self) -> str:
        """E.g. ``schedule == 'step'``, ``model in ['cnn', 'mlp'] and width == 64``."""
        return " and ".join(f"{p} == {v[0]!r}" if len(v) == 1 else f"{p} in {list(v)!r}" for p, v in self.conditions)

    def describe(self) -> str:
        return f"{self.dim.describe()} if {self.condition_text()}"


def _among(x: Any, values: Tuple[Any, ...]) -> bool:
    """``x`` equals one of ``values`` with the same type (``True`` is not ``1``, ``1`` is not ``1.0``)."""
    return any(type(x) is type(v) and x == v for v in values)
