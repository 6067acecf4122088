"""Mixup (Zhang et al. 2018, "mixup: Beyond Empirical Risk Minimization") of a training mini-batch,
drawing only from a given ``torch.Generator``.

One ``lambda ~ Beta(alpha, alpha)`` per mini-batch; every image is blended with the image at the mirrored
position of the batch (row ``i`` with row ``B - 1 - i``, the pairing of timm's ``Mixup``; the batch is
already in random order), and so are the one-hot targets:

    x_i' = lambda x_i + (1 - lambda) x_{B-1-i},   y_i' = lambda e(y_i) + (1 - lambda) e(y_{B-1-i})

with ``e(k)`` the one-hot row of class ``k``. Label smoothing ``eps`` stays in the loss: cross-entropy
against ``(1 - eps) y' + eps / C`` (``torch.nn.functional.cross_entropy`` with soft targets), the same
targets as timm's ``mixup_target`` with smoothing. ``lambda`` is drawn by inverting the Beta CDF at one
uniform draw from the generator (``scipy.stats.beta.ppf``), so the trainer's generator alone fixes it.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

from flatlab.errors import ConfigError
from flatlab.lazy import lazy

stats = lazy("scipy.stats")  # scipy.stats loads in a second


def mixup_lambda(generator: torch.Generator, alpha: float) -> float:
    """``lambda ~ Beta(alpha, alpha)`` from one uniform draw of ``generator`` (inverse CDF).

    Raises:
        ConfigError: ``alpha`` not a finite number > 0.
    """
    if not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ConfigError(f"mixup alpha must be a finite number > 0; got {alpha!r}")
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    return float(stats.beta.ppf(u, alpha, alpha))


def mix_batch(
    x: torch.Tensor, targets: torch.Tensor, num_classes: int, lam: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Blend a batch with its mirror at weight ``lam`` (module docstring).

    Args:
        x: ``(B, 3, H, W)`` images, uint8 (read as ``x / 255``) or float in [0, 1].
        targets: ``(B,)`` int64 class indices in ``[0, num_classes)``.
        lam: weight of each row's own image and label, in [0, 1].
    Returns:
        ``(x', y')``: ``(B, 3, H, W)`` float32 in [0, 1] and ``(B, num_classes)`` float32 soft targets
        (each row sums to 1), on ``x``'s and ``targets``' devices.

    Raises:
        ConfigError: ``lam`` outside [0, 1]; ``targets`` not integer ``(B,)`` matching ``x``'s rows.
    """
    if not 0.0 <= lam <= 1.0:
        raise ConfigError(f"mixup lambda must lie in [0, 1]; got {lam!r}")
    if targets.dim() != 1 or targets.is_floating_point() or len(targets) != len(x):
        raise ConfigError(
            f"mixup needs (B,) integer class targets for {len(x)} images; got {tuple(targets.shape)} {targets.dtype}"
        )
    xf = x.float().div(255.0) if x.dtype == torch.uint8 else x.float()
    one_hot = torch.nn.functional.one_hot(targets, num_classes).float()
    return lam * xf + (1 - lam) * xf.flip(0), lam * one_hot + (1 - lam) * one_hot.flip(0)


def mixup(
    x: torch.Tensor, targets: torch.Tensor, generator: torch.Generator, alpha: float, num_classes: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`mix_batch` at ``lambda`` = :func:`mixup_lambda` ``(generator, alpha)``."""
    return mix_batch(x, targets, num_classes, mixup_lambda(generator, alpha))


__all__ = ["mix_batch", "mixup", "mixup_lambda"]
