"""The workload contract: what a workload provides to the trainer (AlgoPerf-style, in one module).

A workload declares its hyperparameters, loads its data ONCE per study (on the driver; the arrays then
reach every trial through Ray's object store), builds the model, and gives the loss and the metrics.
The trainer does the rest, the same way for every workload and optimizer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Mapping, Optional, Tuple

import torch
from torch import nn

from flatlab.hparams import HParam, resolve


@dataclass
class Split:
    """One data split held in memory: ``inputs`` ``(N, ...)`` float32 and ``targets`` ``(N,)`` int64."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __post_init__(self) -> None:
        if self.inputs.shape[0] != self.targets.shape[0]:
            raise ValueError(
                f"inputs and targets disagree on the number of examples: {self.inputs.shape[0]} vs {self.targets.shape[0]}"
            )

    def __len__(self) -> int:
        return int(self.targets.shape[0])


@dataclass
class Data:
    """The splits of a workload: ``train`` and ``val`` always, ``test`` and OOD splits when available."""

    train: Split
    val: Split
    test: Optional[Split] = None
    extra: Dict[str, Split] = field(default_factory=dict)  # e.g. {"ood": Split(...)}
    meta: Dict[str, Any] = field(default_factory=dict)

    def eval_splits(self) -> Dict[str, Split]:
        """Splits evaluated every epoch (``val`` and the extra ones, e.g. ``ood``), by metric prefix."""
        return {"val": self.val, **self.extra}


@dataclass(frozen=True)
class TrainDefaults:
    """A workload's default training recipe (a study may override each)."""

    batch_size: int = 64
    schedule: str = "cosine"
    warmup_epochs: float = 0.0
    label_smoothing: float = 0.0


class Workload(ABC):
    """Base class of registered workloads.

    Class attributes:
        name: registry name (``digits``, ``cifar10`` ...).
        hparams: declared workload hyperparameters (model choice, width ...).
        train_defaults: default recipe.
        metrics: every metric name a trial of this workload reports (per epoch unless noted).
    """

    name: ClassVar[str]
    doc: ClassVar[str] = ""
    hparams: ClassVar[Tuple[HParam, ...]] = ()
    train_defaults: ClassVar[TrainDefaults] = TrainDefaults()
    metrics: ClassVar[Tuple[str, ...]] = (
        "train/loss",
        "train/accuracy",
        "val/loss",
        "val/accuracy",
        "lr",
        "epoch",
        "time/epoch_s",
        "test/loss",
        "test/accuracy",
    )

    def __init__(self, **params: Any) -> None:
        self.params: Dict[str, Any] = resolve(self.hparams, params, f"workload {self.name!r}")

    @abstractmethod
    def load_data(self, seed: int) -> Data:
        """Load (or build) the splits; deterministic in ``seed``. Called once per study, on the driver."""

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model (initialisation uses the global torch RNG, seeded by the trainer)."""

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        """Mean cross-entropy of ``outputs`` ``(N, C)`` against ``targets`` ``(N,)`` (nats)."""
        return nn.functional.cross_entropy(outputs, targets, label_smoothing=label_smoothing)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: Split, batch_size: int = 512) -> Dict[str, float]:
        """Mean loss (plain cross-entropy, nats) and top-1 accuracy of ``model`` in eval mode on ``split``."""
        was_training = model.training
        model.eval()
        total_loss, correct = 0.0, 0
        for start in range(0, len(split), batch_size):
            x = split.inputs[start : start + batch_size]
            y = split.targets[start : start + batch_size]
            out = model(x)
            total_loss += float(nn.functional.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(dim=-1) == y).sum())
        model.train(was_training)
        n = max(1, len(split))
        return {"loss": total_loss / n, "accuracy": correct / n}
