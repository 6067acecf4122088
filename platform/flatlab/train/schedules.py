"""Learning-rate schedules as per-step multipliers of the peak ``lr`` (driven by ``LambdaLR``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SCHEDULES = ("constant", "cosine", "step")


@dataclass(frozen=True)
class Schedule:
    """LR multiplier as a function of the optimizer step.

    Attributes:
        kind: ``constant``; ``cosine`` (linear warm-up, then half-cosine from 1 to ``final_factor``);
            ``step`` (multiply by ``step_factor`` every ``step_epochs`` epochs, after warm-up).
        total_steps: steps of the whole run.
        steps_per_epoch: optimizer steps per epoch.
        warmup_steps: linear warm-up from ``1/warmup_steps`` to 1 (0 = none); applies to every kind.
        final_factor: cosine end value as a fraction of the peak (e.g. 0.05 = lr_max/20).
    """

    kind: str
    total_steps: int
    steps_per_epoch: int
    warmup_steps: int = 0
    final_factor: float = 0.0
    step_epochs: int = 30
    step_factor: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule={self.kind!r} is not allowed; expected one of {', '.join(SCHEDULES)}")

    def factor(self, step: int) -> float:
        """Multiplier of the peak lr at 0-based ``step`` (unitless)."""
        if self.warmup_steps and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        if self.kind == "step":
            epoch = step // max(1, self.steps_per_epoch)
            return self.step_factor ** (epoch // max(1, self.step_epochs))
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.final_factor + (1.0 - self.final_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        """A ``LambdaLR`` on ``optimizer.param_groups`` (wrappers share their base's groups)."""
        return torch.optim.lr_scheduler.LambdaLR(optimizer, self.factor)
