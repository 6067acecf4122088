"""A training-loss curve as ``(optimizer step, smoothed loss)`` points, and the first step at which it reaches
a target: "optimizer steps to reach a target loss" (IRE paper, Fig. 4). Plain numbers, no torch: the trainer
records the curve (:class:`flatlab.train.curve.LossCurve`), the tracking layer reads it back from MLflow."""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

Point = Tuple[int, float]
"""``(optimizer step, smoothed training loss)``."""


def first_step_at_or_below(points: Sequence[Point], target: float) -> Optional[int]:
    """The first recorded step whose smoothed loss is <= ``target`` (``None``: never reached).

    Args:
        points: ``(step, value)`` pairs in increasing step order (:meth:`flatlab.train.curve.LossCurve.points`, or the
            ``train_step/loss_smoothed`` history of a run); NaN values never count as reached.
        target: the loss to reach, in the curve's units (nats per token for language models).

    The resolution is the curve's stride: the exact step at which the smoothed loss first reached the
    target lies in ``(previous recorded step, result]``, so the result is an upper bound within one
    stride of it (IRE paper, Fig. 4 "steps to reach AdamW's final loss").
    """
    for step, value in points:
        if not math.isnan(value) and value <= target:
            return int(step)
    return None
