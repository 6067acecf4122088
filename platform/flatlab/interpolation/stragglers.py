"""Straggler layers and straggler pruning (seed paper "In Search of the Successful Interpolation",
Algorithm 1).

A straggler layer is a group whose layer-wise sharpness (:func:`flatlab.sharpness.layerwise_sharpness`)
is approximately zero: perturbing it barely changes the loss. Algorithm 1 zeroes a Bernoulli(0.5)
random half of the entries of every straggler layer of the FINE-TUNED model, then interpolates with
the zero-shot model (alpha = weight on the fine-tuned model, WiSE-FT convention).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Collection, List, Mapping

import torch

from flatlab.errors import ConfigError
from flatlab.interpolation.state import StateDict, interpolate

DEFAULT_THRESHOLD = 1e-3  # loss units (nats); "approximately zero" at rho = 1, 20 draws


def find_stragglers(layer_sharpness: Mapping[str, Any], *, threshold: float = DEFAULT_THRESHOLD) -> List[str]:
    """Names of the groups whose sharpness is below ``threshold`` (in their order).

    Args:
        layer_sharpness: ``{group: value}``, values being floats or objects with a ``.value`` (e.g.
            :class:`flatlab.sharpness.SharpnessEstimate`).
        threshold: in loss units; a group is a straggler when ``value < threshold`` (small negative
            Monte-Carlo values count as ~0).

    Raises:
        ConfigError: a non-finite threshold or value.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ConfigError(f"threshold must be a finite number (loss units); got {threshold!r}")
    out = []
    for name, v in layer_sharpness.items():
        value = float(getattr(v, "value", v))
        if not math.isfinite(value):
            raise ConfigError(f"layer-wise sharpness of {name!r} is {value!r}; expected a finite number")
        if value < threshold:
            out.append(name)
    return out


def prune_stragglers(
    ft: Mapping[str, Any], keys: Collection[str], *, seed: int = 0, drop_prob: float = 0.5
) -> StateDict:
    """Seed paper Algorithm 1, pruning step: a copy of ``ft`` with each entry of each floating tensor in
    ``keys`` zeroed independently with probability ``drop_prob`` (Bernoulli mask, 0.5 = a random half).

    Masks are drawn from a CPU ``torch.Generator`` seeded with ``seed``, tensor by tensor in the state
    dict's key order, so the same ``seed`` and ``keys`` give the same masks on any device. All other
    entries are copied unchanged.

    Raises:
        ConfigError: a key not in ``ft``, a non-floating tensor in ``keys``, ``drop_prob`` outside [0, 1].
    """
    if isinstance(drop_prob, bool) or not isinstance(drop_prob, (int, float)) or not 0.0 <= drop_prob <= 1.0:
        raise ConfigError(f"drop_prob must be in [0, 1]; got {drop_prob!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an int; got {seed!r}")
    wanted = set(keys)
    unknown = sorted(wanted - set(ft))
    if unknown:
        raise ConfigError(f"straggler key {unknown[0]!r} is not in the fine-tuned state dict")
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    out: StateDict = OrderedDict()
    for key, value in ft.items():
        if key not in wanted:
            out[key] = value.detach().clone() if isinstance(value, torch.Tensor) else value
            continue
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise ConfigError(f"straggler key {key!r} is not a floating-point tensor; only weights can be pruned")
        drop = torch.rand(value.shape, generator=gen) < drop_prob  # (*shape,) bool, on CPU
        out[key] = value.detach().masked_fill(drop.to(value.device), 0.0)
    return out


def pruned_interpolation(
    zs: Mapping[str, Any],
    ft: Mapping[str, Any],
    alpha: float,
    keys: Collection[str],
    *,
    seed: int = 0,
    drop_prob: float = 0.5,
) -> StateDict:
    """Seed paper Algorithm 1: ``interpolate(zs, prune_stragglers(ft, keys), alpha)``.

    For a sweep, prune once and pass the pruned state dict to
    :func:`flatlab.interpolation.sweep.alpha_sweep` instead of calling this per alpha.
    """
    return interpolate(zs, prune_stragglers(ft, keys, seed=seed, drop_prob=drop_prob), alpha)
