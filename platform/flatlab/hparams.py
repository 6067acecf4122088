"""Declared hyperparameters: type, default, allowed range, documentation.

Optimizers and workloads declare their hyperparameters with :class:`HParam`; study validation,
``flatlab optimizers`` / ``flatlab workloads`` and the builders all read the same declaration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from flatlab.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class HParam:
    """One hyperparameter.

    Attributes:
        name: the field's name as used in studies (``rho``, ``kappa``, ``mask_interval`` ...).
        default: value used when a study does not set it.
        kind: ``float``, ``int``, ``bool`` or ``str``.
        low, high: numeric bounds (``None`` = unbounded); ``low_open`` / ``high_open`` make them strict.
        choices: allowed values for categorical parameters.
        doc: one line, with units and the paper reference where it applies.
    """

    name: str
    default: Any
    kind: type = float
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    choices: Optional[Tuple[Any, ...]] = None
    doc: str = ""
    nullable: bool = False

    def allowed(self) -> str:
        """Human-readable allowed values, e.g. ``float in (0, 1)`` or ``one of 'gaussian', 'uniform'``."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind is bool:
            return "True or False"
        if self.low is None and self.high is None:
            text = f"any {self.kind.__name__}"
        else:
            lo = "-inf" if self.low is None else _fmt(self.low)
            hi = "inf" if self.high is None else _fmt(self.high)
            left = "(" if (self.low is None or self.low_open) else "["
            right = ")" if (self.high is None or self.high_open) else "]"
            text = f"{self.kind.__name__} in {left}{lo}, {hi}{right}"
        return text + (" or None" if self.nullable else "")

    def validate(self, value: Any, where: str = "") -> Any:
        """Return ``value`` coerced to ``kind``.

        Raises:
            ConfigError: naming the field and the allowed values, for a value of the wrong type, outside
                the range, a float that is not finite (nan, inf) or beyond float32's range, an int beyond 64 bits.
        """
        prefix = f"{where}: " if where else ""
        if value is None and self.nullable:
            return None
        bad = ConfigError(f"{prefix}{self.name}={value!r} is not allowed; expected {self.allowed()}")
        if self.choices is not None:
            if value not in self.choices:
                raise bad
            return value
        if self.kind is bool:
            if not isinstance(value, bool):
                raise bad
            return value
        if self.kind is str:
            if not isinstance(value, str):
                raise bad
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if self.kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise bad
            value = int(value)
            if abs(value) > MAX_INT:  # torch, numpy and SQLite hold it in 64 bits
                raise ConfigError(
                    f"{prefix}{self.name}={value!r} is too large; expected {self.allowed()}, |value| <= 2**63 - 1"
                )
        else:
            if isinstance(value, int) and abs(value) > MAX_INT:
                raise bad
            value = float(value)
            if not math.isfinite(value):  # nan, inf, -inf: no field takes them
                raise ConfigError(f"{prefix}{self.name}={value!r} is not allowed; expected a finite {self.allowed()}")
            if abs(value) > MAX_FLOAT:  # torch holds optimizer scalars in float32: 1e308 would overflow there
                raise ConfigError(
                    f"{prefix}{self.name}={value!r} is too large; expected {self.allowed()}, |value| <= {MAX_FLOAT:.4g}"
                )
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise bad
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            raise bad
        return value


MAX_INT = 2**63 - 1  # the largest int a field may take (64-bit signed, as torch and numpy store it)
MAX_FLOAT = 3.4028234663852886e38  # the largest float a field may take (float32's largest, torch's default dtype)


def _fmt(x: float) -> str:
    return f"{x:g}"


def resolve(
    declared: Sequence[HParam], given: Mapping[str, Any], where: str, *, allow_extra: bool = False
) -> Dict[str, Any]:
    """Fill defaults and validate ``given`` against ``declared``.

    Raises:
        ConfigError: ``given`` is not a mapping; unknown names (listing the accepted ones) and values
            outside their allowed ranges, all of them in one error, one per line.
    """
    if not isinstance(given, Mapping):
        raise ConfigError(
            f"{where}={given!r} ({type(given).__name__}); expected a dict of parameter -> value, e.g. {{}}"
        )
    by_name = {h.name: h for h in declared}
    problems = []
    if not allow_extra:
        unknown = sorted(set(given) - set(by_name), key=repr)
        if unknown:
            named = ", ".join(f"{u}{did_you_mean(u, by_name)}" for u in unknown)
            problems.append(
                f"{where}: unknown parameter(s) {named}; accepted: {', '.join(sorted(by_name)) or '(none)'}"
            )
    out = {h.name: h.default for h in declared}
    for name, value in given.items():
        if name in by_name:
            try:
                out[name] = by_name[name].validate(value, where)
            except ConfigError as exc:
                problems.append(str(exc))
    if problems:  # every problem at once, one per line
        raise ConfigError("\n".join(problems))
    return out
