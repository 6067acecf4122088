"""Alpha sweeps along the interpolation path and the seed paper's summary numbers.

Seed paper "In Search of the Successful Interpolation": Def. 1 (instability), Eq. 2 (gain), and the
"failure mode" of robust fine-tuning. ``alpha`` is the weight on the FINE-TUNED model (WiSE-FT
convention, see :mod:`flatlab.interpolation.state`): ``alpha = 0`` is the zero-shot end.

* instability   ``sup_alpha L_alpha - (L_0 + L_1) / 2``       (Def. 1; symmetric in the two ends)
* barrier       ``sup_alpha L_alpha - L_zs``                   (height above the zero-shot end)
* gain          ``sup_alpha A_alpha - A_zs`` on OOD data        (Eq. 2; accuracy in [0, 1] units)
* failure mode  no INTERIOR alpha (0 < alpha < 1) beats the zero-shot end: ``max_interior A <= A_zs``

``sup`` is over the evaluated grid (endpoints included, so barrier and gain are >= 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Sequence, Tuple

import torch

from flatlab.errors import ConfigError
from flatlab.interpolation.state import interpolate, interpolate_keys

_EPS = 1e-9  # tolerance when looking up alpha = 0 / 1 on a float grid


def alpha_grid(step: float = 0.05) -> Tuple[float, ...]:
    """``(0, step, 2*step, ..., 1)``, rounded to 10 decimals; default 21 points 0, 0.05, ..., 1.

    Raises:
        ConfigError: ``step`` not in (0, 1] or not dividing 1 into an integer number of steps.
    """
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step <= 1:
        raise ConfigError(f"step must be in (0, 1]; got {step!r}")
    n = round(1 / step)
    if abs(n * step - 1) > 1e-9:
        raise ConfigError(f"step must divide 1 into whole steps (e.g. 0.05, 0.1, 0.25); got {step!r}")
    return tuple(round(i / n, 10) for i in range(n + 1))


DEFAULT_ALPHAS = alpha_grid(0.05)


def _index(alphas: Sequence[float], target: float, what: str) -> int:
    for i, a in enumerate(alphas):
        if abs(a - target) <= _EPS:
            return i
    raise ConfigError(f"{what} needs alpha={target:g} on the grid; got alphas {list(alphas)}")


def _check_lengths(alphas: Sequence[float], values: Sequence[float], what: str) -> None:
    if len(alphas) != len(values) or not alphas:
        raise ConfigError(
            f"{what}: alphas and values must be non-empty and of equal length; got {len(alphas)} and {len(values)}"
        )


def instability(alphas: Sequence[float], losses: Sequence[float]) -> float:
    """``sup_alpha L_alpha - (L_0 + L_1) / 2`` (seed paper, Def. 1), loss units.

    Raises:
        ConfigError: unequal lengths, or alpha = 0 or 1 missing from ``alphas``.
    """
    _check_lengths(alphas, losses, "instability")
    l0 = losses[_index(alphas, 0.0, "instability")]
    l1 = losses[_index(alphas, 1.0, "instability")]
    return max(losses) - 0.5 * (l0 + l1)


def barrier(alphas: Sequence[float], losses: Sequence[float]) -> float:
    """``sup_alpha L_alpha - L_zs`` (zero-shot end, alpha = 0), loss units, >= 0.

    Raises:
        ConfigError: unequal lengths or alpha = 0 missing.
    """
    _check_lengths(alphas, losses, "barrier")
    return max(losses) - losses[_index(alphas, 0.0, "barrier")]


def gain(alphas: Sequence[float], accuracies: Sequence[float]) -> float:
    """``sup_alpha A_alpha - A_zs`` (seed paper, Eq. 2), in the accuracies' units, >= 0.

    Raises:
        ConfigError: unequal lengths or alpha = 0 missing.
    """
    _check_lengths(alphas, accuracies, "gain")
    return max(accuracies) - accuracies[_index(alphas, 0.0, "gain")]


def is_failure_mode(alphas: Sequence[float], accuracies: Sequence[float], *, tol: float = 0.0) -> bool:
    """True when no interior alpha (0 < alpha < 1) beats the zero-shot end by more than ``tol``.

    Raises:
        ConfigError: unequal lengths, alpha = 0 missing, or no interior alpha on the grid.
    """
    _check_lengths(alphas, accuracies, "failure mode")
    a_zs = accuracies[_index(alphas, 0.0, "failure mode")]
    interior = [acc for a, acc in zip(alphas, accuracies) if _EPS < a < 1 - _EPS]
    if not interior:
        raise ConfigError(f"failure mode needs at least one alpha strictly between 0 and 1; got alphas {list(alphas)}")
    return max(interior) <= a_zs + tol


@dataclass(frozen=True)
class SweepResult:
    """Loss and accuracy per alpha and split.

    Attributes:
        alphas: the grid (weight on the fine-tuned model).
        loss: ``{split: (L_alpha for alpha in alphas)}`` (loss units, e.g. nats).
        accuracy: ``{split: (A_alpha ...)}`` (fraction in [0, 1]).
    """

    alphas: Tuple[float, ...]
    loss: Mapping[str, Tuple[float, ...]]
    accuracy: Mapping[str, Tuple[float, ...]]

    def _split(self, split: str) -> str:
        if split not in self.loss:
            raise ConfigError(f"unknown split {split!r}; this sweep has: {', '.join(self.loss)}")
        return split

    def instability(self, split: str = "ood") -> float:
        """:func:`instability` of ``split``'s loss curve."""
        return instability(self.alphas, self.loss[self._split(split)])

    def barrier(self, split: str = "ood") -> float:
        """:func:`barrier` of ``split``'s loss curve."""
        return barrier(self.alphas, self.loss[self._split(split)])

    def gain(self, split: str = "ood") -> float:
        """:func:`gain` of ``split``'s accuracy curve."""
        return gain(self.alphas, self.accuracy[self._split(split)])

    def failure_mode(self, split: str = "ood", *, tol: float = 0.0) -> bool:
        """:func:`is_failure_mode` of ``split``'s accuracy curve."""
        return is_failure_mode(self.alphas, self.accuracy[self._split(split)], tol=tol)

    def best_alpha(self, split: str = "ood") -> float:
        """The alpha with the highest accuracy on ``split`` (the smallest such alpha on ties)."""
        acc = self.accuracy[self._split(split)]
        return self.alphas[max(range(len(acc)), key=lambda i: (acc[i], -i))]

    def summary(self) -> Dict[str, float]:
        """Flat metrics for tracking: ``{split}/instability``, ``/barrier``, ``/gain``, ``/best_alpha``,
        ``/failure_mode`` (1.0 or 0.0) for every split."""
        out: Dict[str, float] = {}
        for split in self.loss:
            out[f"{split}/instability"] = self.instability(split)
            out[f"{split}/barrier"] = self.barrier(split)
            out[f"{split}/gain"] = self.gain(split)
            out[f"{split}/best_alpha"] = self.best_alpha(split)
            out[f"{split}/failure_mode"] = float(self.failure_mode(split))
        return out


Evaluate = Callable[[Dict[str, torch.Tensor], str], Any]
"""``evaluate(state_dict, split) -> (loss, accuracy)`` or ``{"loss": ..., "accuracy": ...}``."""

Interpolator = Callable[[Mapping[str, Any], Mapping[str, Any], float], Dict[str, Any]]


def _as_pair(result: Any, split: str, alpha: float) -> Tuple[float, float]:
    if isinstance(result, Mapping) and "loss" in result and "accuracy" in result:
        loss, acc = result["loss"], result["accuracy"]
    elif isinstance(result, (tuple, list)) and len(result) == 2:
        loss, acc = result
    else:
        raise ConfigError(
            f"evaluate(state_dict, {split!r}) at alpha={alpha:g} must return (loss, accuracy) or "
            f"{{'loss': ..., 'accuracy': ...}}; got {type(result).__name__}"
        )
    loss, acc = float(loss), float(acc)
    if not math.isfinite(acc):
        raise ConfigError(f"evaluate returned a non-finite accuracy {acc!r} for split {split!r} at alpha={alpha:g}")
    return loss, acc


def alpha_sweep(
    zs: Mapping[str, Any],
    ft: Mapping[str, Any],
    evaluate: Evaluate,
    *,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    splits: Sequence[str] = ("id", "ood"),
    interpolator: Interpolator = interpolate,
) -> SweepResult:
    """Evaluate loss and accuracy of ``interpolator(zs, ft, alpha)`` for every alpha and split.

    Args:
        zs, ft: zero-shot and fine-tuned state dicts.
        evaluate: user function ``evaluate(state_dict, split) -> (loss, accuracy)`` (it loads the state
            dict into its model and evaluates on ``split``).
        alphas: weights on the fine-tuned model; default 0, 0.05, ..., 1.
        splits: split names passed to ``evaluate`` (e.g. ``("id", "ood")`` or several OOD sets).
        interpolator: :func:`~flatlab.interpolation.state.interpolate` (default), or e.g.
            ``functools.partial(interpolate_keys, keys=...)`` for layer-wise interpolation.

    Returns:
        :class:`SweepResult`.

    Raises:
        ConfigError: empty ``alphas``/``splits``, bad ``evaluate`` results, incompatible state dicts.
    """
    alphas = tuple(float(a) for a in alphas)
    splits = tuple(splits)
    if not alphas or not splits:
        raise ConfigError(f"alpha_sweep needs at least one alpha and one split; got {len(alphas)} and {len(splits)}")
    if len(set(splits)) != len(splits):
        raise ConfigError(f"split names must be unique; got {list(splits)}")
    loss: Dict[str, list] = {s: [] for s in splits}
    acc: Dict[str, list] = {s: [] for s in splits}
    for alpha in alphas:
        state = interpolator(zs, ft, alpha)
        for split in splits:
            split_loss, split_acc = _as_pair(evaluate(state, split), split, alpha)
            loss[split].append(split_loss)
            acc[split].append(split_acc)
    return SweepResult(alphas, {s: tuple(v) for s, v in loss.items()}, {s: tuple(v) for s, v in acc.items()})


def layerwise_alpha_sweep(
    zs: Mapping[str, Any],
    ft: Mapping[str, Any],
    evaluate: Evaluate,
    groups: Mapping[str, Sequence[str]],
    *,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    splits: Sequence[str] = ("id", "ood"),
) -> Dict[str, SweepResult]:
    """One :func:`alpha_sweep` per group with layer-wise interpolation (seed paper, Def. 1.1): zero-shot
    weights everywhere except that group's keys.

    Args:
        groups: ``{group name: state-dict keys}``, e.g. from
            :func:`flatlab.sharpness.grouping.group_parameters`.

    Returns:
        ``{group name: SweepResult}`` in group order.
    """

    def for_group(keys: Sequence[str]) -> Interpolator:
        return lambda a, b, alpha: interpolate_keys(a, b, alpha, keys=keys)

    return {
        name: alpha_sweep(zs, ft, evaluate, alphas=alphas, splits=splits, interpolator=for_group(keys))
        for name, keys in groups.items()
    }
