"""Weight interpolation between a zero-shot and a fine-tuned model (WiSE-FT / robust fine-tuning).

Convention used everywhere in flatlab: ``alpha`` is the weight on the FINE-TUNED model,

    theta_alpha = (1 - alpha) * theta_zs + alpha * theta_ft,

as in WiSE-FT (Wortsman et al. 2022, paper and code), so ``alpha = 0`` is the zero-shot model and
``alpha = 1`` the fine-tuned one. NOTE: the seed paper ("In Search of the Successful Interpolation")
writes ``theta_alpha = alpha * theta_zs + (1 - alpha) * theta_ft``, i.e. its alpha is the weight on
the zero-shot model; its ``alpha`` equals our ``1 - alpha``.

Every floating-point tensor is interpolated (classification head and ``logit_scale`` included);
integer and bool tensors (e.g. BatchNorm's ``num_batches_tracked``) and non-tensor entries cannot be
mixed, so they are copied from the end ``alpha`` is nearer to: the zero-shot state dict for
``alpha < 0.5``, the fine-tuned one for ``alpha >= 0.5`` (the tie at 0.5 goes to the fine-tuned end).
Computed with ``torch.lerp``; ``alpha = 0`` / ``1`` return exact copies of the zero-shot / fine-tuned
state dict, every entry (floats and integers).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Collection, Dict, Mapping, Optional

import torch

from flatlab.errors import ConfigError

StateDict = Dict[str, Any]


def check_compatible(zs: Mapping[str, Any], ft: Mapping[str, Any]) -> None:
    """Raise unless ``zs`` and ``ft`` have the same keys, and tensors of the same shapes and dtypes.

    Raises:
        ConfigError: naming the first offending key (in ``zs`` order, then keys only in ``ft``).
    """
    for key, a in zs.items():
        if key not in ft:
            raise ConfigError(
                f"state dicts differ: key {key!r} is in the zero-shot state dict but not in the fine-tuned one"
            )
        b = ft[key]
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            raise ConfigError(
                f"state dicts differ at key {key!r}: {type(a).__name__} (zero-shot) vs {type(b).__name__} (fine-tuned)"
            )
        if not isinstance(a, torch.Tensor):
            continue
        if a.shape != b.shape:
            raise ConfigError(
                f"state dicts differ at key {key!r}: shape {tuple(a.shape)} (zero-shot) "
                f"vs {tuple(b.shape)} (fine-tuned)"
            )
        if a.dtype != b.dtype:
            raise ConfigError(
                f"state dicts differ at key {key!r}: dtype {a.dtype} (zero-shot) vs {b.dtype} (fine-tuned)"
            )
    for key in ft:
        if key not in zs:
            raise ConfigError(
                f"state dicts differ: key {key!r} is in the fine-tuned state dict but not in the zero-shot one"
            )


def _check_alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ConfigError(f"alpha must be a finite number (weight on the fine-tuned model); got {alpha!r}")
    return float(alpha)


def _nearer_end(a: Any, b: Any, alpha: float) -> Any:
    """The entry of the end ``alpha`` is nearer to (``a`` = zero-shot for alpha < 0.5, else ``b``), copied."""
    src = a if alpha < 0.5 else b
    if isinstance(src, torch.Tensor):
        dst_device = a.device if isinstance(a, torch.Tensor) else src.device
        return src.detach().clone().to(dst_device)
    return src


def _mix(a: torch.Tensor, b: torch.Tensor, alpha: float) -> torch.Tensor:
    b = b.to(a.device)
    if alpha == 0.0:
        return a.detach().clone()
    if alpha == 1.0:
        return b.detach().clone()
    return torch.lerp(a.detach(), b.detach(), alpha)


def interpolate(zs: Mapping[str, Any], ft: Mapping[str, Any], alpha: float) -> StateDict:
    """``(1 - alpha) * zs + alpha * ft`` for every floating tensor (WiSE-FT convention, module docstring).

    Args:
        zs: zero-shot state dict (``model.state_dict()``); defines key order and device.
        ft: fine-tuned state dict with the same keys, shapes and dtypes.
        alpha: weight on the FINE-TUNED model (the seed paper's ``1 - alpha``); any finite value, values
            outside [0, 1] extrapolate.

    Returns:
        A new ``OrderedDict`` (tensors are fresh copies; the inputs are not modified).

    Raises:
        ConfigError: non-finite ``alpha``; different keys, shapes or dtypes (naming the first key).
    """
    return interpolate_keys(zs, ft, alpha, keys=None)


def interpolate_keys(
    zs: Mapping[str, Any], ft: Mapping[str, Any], alpha: float, keys: Optional[Collection[str]]
) -> StateDict:
    """Layer-wise interpolation (seed paper, Def. 1.1): zero-shot everywhere except ``keys``, which are
    interpolated with weight ``alpha`` on the fine-tuned model. ``keys=None`` interpolates everything
    (:func:`interpolate`).

    Integer/bool tensors and non-tensor entries among ``keys`` (or everywhere when ``keys=None``) are
    copied from the end ``alpha`` is nearer to (``zs`` for ``alpha < 0.5``, ``ft`` for ``alpha >= 0.5``);
    all other entries are copies of ``zs``.

    Raises:
        ConfigError: as :func:`interpolate`; a key in ``keys`` that is not in the state dicts.
    """
    alpha = _check_alpha(alpha)
    check_compatible(zs, ft)
    if keys is not None:
        keys = set(keys)
        unknown = sorted(keys - set(zs))
        if unknown:
            raise ConfigError(
                f"key {unknown[0]!r} is not in the state dicts; valid keys start with: {', '.join(list(zs)[:8])}"
            )
    out: StateDict = OrderedDict()
    for key, a in zs.items():
        b = ft[key]
        if keys is not None and key not in keys:
            out[key] = a.detach().clone() if isinstance(a, torch.Tensor) else a
        elif isinstance(a, torch.Tensor) and a.is_floating_point():
            out[key] = _mix(a, b, alpha)
        else:
            out[key] = _nearer_end(a, b, alpha)
    return out
