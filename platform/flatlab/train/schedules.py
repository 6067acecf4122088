"""Learning-rate schedules as per-step multipliers of the peak ``lr`` (driven by ``LambdaLR``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

import torch

SCHEDULES = ("constant", "cosine", "step", "milestones")


@dataclass(frozen=True)
class Schedule:
    """LR multiplier as a function of the optimizer step.

    Attributes:
        kind: ``constant``; ``cosine`` (linear warm-up, then half-cosine from 1 to ``final_factor``);
            ``step`` (multiply by ``step_factor`` every ``step_epochs`` epochs, after warm-up);
            ``milestones`` (multiply by ``step_factor`` at each epoch of ``milestones``, as
            ``torch.optim.lr_scheduler.MultiStepLR``: IRE paper, Fig. 2, lr / 5 at epochs 20, 50 and 80).
        total_steps: steps of the whole run.
        steps_per_epoch: optimizer steps per epoch.
        warmup_steps: linear warm-up from ``1/warmup_steps`` to 1 (0 = none); applies to every kind.
        final_factor: cosine end value as a fraction of the peak (e.g. 0.05 = lr_max/20).
        milestones: ``milestones`` schedule: the 0-based epochs from which one more factor of
            ``step_factor`` applies (from epoch 20 on: after 20 whole epochs).

    Raises:
        ValueError: an unknown ``kind``; ``milestones`` without milestones.
    """

    kind: str
    total_steps: int
    steps_per_epoch: int
    warmup_steps: int = 0
    final_factor: float = 0.0
    step_epochs: int = 30
    step_factor: float = 0.1
    milestones: Tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule={self.kind!r} is not allowed; expected one of {', '.join(SCHEDULES)}")
        if self.kind == "milestones" and not self.milestones:
            raise ValueError("schedule='milestones' needs milestones, e.g. milestones=(20, 50, 80)")

    def factor(self, step: int) -> float:
        """Multiplier of the peak lr at 0-based ``step`` (unitless)."""
        if self.warmup_steps and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        epoch = step // max(1, self.steps_per_epoch)
        if self.kind == "step":
            return self.step_factor ** (epoch // max(1, self.step_epochs))
        if self.kind == "milestones":
            return self.step_factor ** sum(epoch >= m for m in self.milestones)
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.final_factor + (1.0 - self.final_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        """A ``LambdaLR`` on ``optimizer.param_groups`` (wrappers share their base's groups)."""
        return torch.optim.lr_scheduler.LambdaLR(optimizer, self.factor)
