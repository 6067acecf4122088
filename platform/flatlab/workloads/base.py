"""The workload contract: what a workload provides to the trainer (AlgoPerf-style, in one module).

A workload declares its hyperparameters, loads its data ONCE per study (on the driver; the arrays then
reach every trial through Ray's object store), builds the model, and gives the loss and the metrics.
The trainer does the rest, the same way for every workload and optimizer. Data, model, loss and
evaluation only: a workload never reads tracking (MLflow) or study code; what needs all trials of a
study is a report the study asks for (``Study.reports``, :mod:`flatlab.reports.declared`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Optional, Tuple, Union

import torch
from torch import nn

from flatlab.batch import Inputs, take  # noqa: F401 (take re-exported)
from flatlab.hparams import HParam, resolve
from flatlab.ranges import CORRELATIONS, SHARES, Support, metric_support  # noqa: F401 (re-exported)


def _move(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # Host -> CUDA copies are asynchronous only from pinned (page-locked) memory: stage the batch there
    # first (torch's caching host allocator reuses the pinned blocks, and keeps each one until its copy
    # has finished). Anything else, CPU -> CPU included, is a plain ``t.to(device)`` (a no-op on CPU).
    if device.type == "cuda" and t.device.type == "cpu":
        t = t if t.is_pinned() else t.pin_memory()
    return t.to(device, non_blocking=True)


def to_device(inputs: Inputs, device: torch.device | str) -> Inputs:
    """``inputs`` moved to ``device`` (tensor or dict of tensors); to CUDA through pinned memory with
    ``non_blocking=True``, so the copy overlaps the previous step's kernels."""
    device = torch.device(device)
    if isinstance(inputs, dict):
        return {k: _move(v, device) for k, v in inputs.items()}
    return _move(inputs, device)


def _rows(inputs: Inputs) -> int:
    if isinstance(inputs, dict):
        sizes = {int(v.shape[0]) for v in inputs.values()}
        if len(sizes) != 1:
            raise ValueError(f"input tensors disagree on the number of examples: {sorted(sizes)}")
        return sizes.pop()
    return int(inputs.shape[0])


@dataclass
class Split:
    """One data split held in memory.

    ``inputs``: ``(N, ...)`` tensor, or a dict of such tensors (e.g. ``input_ids``, ``attention_mask``),
    or an object that only looks like a tensor and decodes rows when indexed (``shape``, ``x[idx]`` for
    a LongTensor or slice -> tensor; optionally ``prefetch(idx)``, which the trainer calls one mini-batch
    ahead), e.g. :class:`~flatlab.workloads.lazy_images.LazyImages`;
    ``targets``: ``(N,)`` class ids, ``(N, T)`` token ids, or ``(N,)`` float regression targets.
    """

    inputs: Inputs
    targets: torch.Tensor

    def __post_init__(self) -> None:
        n = _rows(self.inputs)
        if n != self.targets.shape[0]:
            raise ValueError(f"inputs and targets disagree on the number of examples: {n} vs {self.targets.shape[0]}")

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
        loss_support: the range of :meth:`loss` and of the reported ``<split>/loss`` (see
            :meth:`metric_support`).
    """

    name: ClassVar[str]
    doc: ClassVar[str] = ""
    #: ``False`` for evaluation-only workloads (e.g. ``clip_interpolate``): a trial then calls
    #: :meth:`evaluate_only` once (:func:`flatlab.train.evaluation.evaluate_trial`) and trains nothing.
    trains: ClassVar[bool] = True
    #: Parameters whose value names a model checkpoint the workload reads (a local file). In a study they
    #: may also name an earlier trial's run (``run:<run_id>``, or ``mlflow:<study>/<arm>?...`` resolved at
    #: launch); the platform fetches it before the workload is built (:mod:`flatlab.tracking.checkpoints`).
    checkpoint_params: ClassVar[Tuple[str, ...]] = ()
    #: ``True`` when :meth:`augment` works on a batch already on the training device (tensor ops only,
    #: random draws from the CPU ``generator``): the trainer then copies in-memory batches first and
    #: augments on the accelerator. Same result on CPU either way.
    augments_on_device: ClassVar[bool] = False
    #: Parameters that change what :meth:`load_data` returns. Data is loaded once per study, so these
    #: may only be set study-wide (``Study.workload_params``), never in an arm's search space.
    data_hparams: ClassVar[Tuple[str, ...]] = ()
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

    #: The range ``(low, high)`` of the workload's loss: ``(0, inf)`` for cross-entropy (with or without
    #: label smoothing, a cross-entropy of two distributions) and mean squared error; ``None`` (unbounded)
    #: for a loss that can be negative, such as the toys' closed-form landscapes.
    loss_support: ClassVar[Optional[Support]] = (0.0, math.inf)

    @classmethod
    def metric_support(cls, metric: str) -> Optional[Support]:
        """The range of this workload's ``metric`` (:func:`metric_support` with :attr:`loss_support`)."""
        return metric_support(metric, cls.loss_support)

    def __init__(self, **params: Any) -> None:
        self.params: Dict[str, Any] = resolve(self.hparams, params, f"workload {self.name!r}")

    def check_data(self) -> None:  # noqa: B027 (a hook with nothing to check by default, not abstract)
        """Raise :class:`~flatlab.workloads.sources.DataUnavailable` now when :meth:`load_data` would find no
        data; cheap (looks for files, reads none when it can). ``flatlab run`` calls it on the driver before
        Ray, MLflow or any trial starts, so missing data is one error line (default: nothing to check)."""

    @abstractmethod
    def load_data(self, seed: int) -> Data:
        """Load (or build) the splits; deterministic in ``seed``. Called once per study, on the driver."""

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model (initialisation uses the global torch RNG, seeded by the trainer)."""

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        """Mean cross-entropy of ``outputs`` ``(..., C)`` against ``targets`` ``(...)`` class indices, or
        against soft targets ``(..., C)`` (floating, rows summing to 1, e.g. from :meth:`mix`) (nats per target)."""
        c = outputs.shape[-1]
        soft = targets.is_floating_point()
        return nn.functional.cross_entropy(
            outputs.reshape(-1, c),
            targets.reshape(-1, c) if soft else targets.reshape(-1),
            label_smoothing=label_smoothing,
        )

    def evaluate_only(self, model: nn.Module, data: Data) -> Dict[str, float]:
        """Metrics of an evaluation-only trial (``trains = False``) of ``model``, freshly built by
        :meth:`build_model`; training workloads never call it."""
        raise NotImplementedError(f"workload {self.name!r} trains; evaluate_only is for trains=False workloads")

    def augment(self, inputs: Inputs, generator: torch.Generator) -> Inputs:
        """Training-time augmentation of a mini-batch (default: none). Must draw only from ``generator``."""
        return inputs

    def mix(self, inputs: Inputs, targets: torch.Tensor, generator: torch.Generator) -> Tuple[Inputs, torch.Tensor]:
        """Training-time mixing of a mini-batch's inputs and targets together, after :meth:`augment` and on
        the training device (default: none, ``(inputs, targets)``; Mixup returns soft targets ``(B, C)``,
        which :meth:`loss` and :meth:`batch_stats` accept). Must draw only from ``generator``."""
        return inputs, targets

    def batch_stats(self, outputs: torch.Tensor, targets: torch.Tensor) -> Tuple[Union[int, torch.Tensor], int]:
        """``(correct, counted)`` for the running train accuracy (top-1 over every target position).

        ``correct`` may be a 0-d tensor on the training device: the trainer sums it there and reads it
        once per epoch, so a training step never waits for the accelerator.
        """
        if targets.is_floating_point():  # soft targets (mix): the class of largest weight counts as the label
            targets = targets.argmax(dim=-1)
        return (outputs.argmax(dim=-1) == targets).sum(), int(targets.numel())

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: Split, batch_size: int = 512) -> Dict[str, float]:
        """Mean cross-entropy (nats per target) and top-1 accuracy of ``model`` in eval mode on ``split``.

        Workloads with other metrics (perplexity, Matthews correlation ...) override this; every key
        returned is reported as ``<split>/<key>``.
        """
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        total_loss, correct, count = 0.0, 0, 0
        for start in range(0, len(split), batch_size):
            x = to_device(take(split.inputs, slice(start, start + batch_size)), device)
            y = split.targets[start : start + batch_size].to(device)
            out = model(x)
            total_loss += float(
                nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="sum")
            )
            c, n = self.batch_stats(out, y)
            correct, count = correct + c, count + n
        model.train(was_training)
        count = max(1, count)
        return {"loss": total_loss / count, "accuracy": int(correct) / count}
