"""The generic training loop: any registered workload x any registered optimizer, one protocol.

Per epoch: shuffle with the trial's own generator, one ``optimizer.step(closure)`` per mini-batch
(the closure protocol of :mod:`flatlab.optim.protocol`), LR schedule per step, evaluation on every
eval split (and, with the trainer parameter ``test_every_epoch``, on the test split). The whole state
(model, optimizer, scheduler, RNGs, counters, the smoothed training-loss curve :attr:`Trainer.curve`)
round-trips through :meth:`Trainer.state_dict`, so a resumed trial continues bit-identically on CPU;
:meth:`Trainer.save`/:meth:`Trainer.load` store it as safetensors + JSON (:mod:`flatlab.train.checkpoint`),
which load without executing code.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

import torch

from flatlab.batch import Inputs, take
from flatlab.errors import ConfigError
from flatlab.optim.protocol import Progress, passes_of
from flatlab.optim.registry import get_optimizer
from flatlab.train.checkpoint import STATE_FILE, CheckpointError, StateSnapshot, load_state, save_state, snapshot_state
from flatlab.train.closure import BatchClosure
from flatlab.train.compiled import compile_model
from flatlab.train.compute import ComputeCounter, steps_within
from flatlab.train.config import loss_target, warmup_steps_of
from flatlab.train.curve import LossCurve
from flatlab.train.parallel import DataParallel, Shard, unwrap
from flatlab.train.precision import Precision, accumulation_dtype
from flatlab.train.resolved import resolve_trainer
from flatlab.train.schedules import Schedule
from flatlab.train.seeding import rng_state, seed_everything, set_rng_state
from flatlab.workloads.base import Data, Workload, to_device
from flatlab.workloads.registry import build_workload


class Diverged(RuntimeError):
    """The training loss became NaN or infinite (``step``: the 0-based step, ``loss``: its value)."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"training diverged at step {step}: loss={loss}")
        self.step = step
        self.loss = loss


class _TrainStats:
    """Sums the workload's ``batch_stats`` over an epoch (``correct`` may stay a device tensor)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.correct: Any = 0
        self.counted = 0

    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        c, n = self.workload.batch_stats(outputs, targets)
        self.correct = self.correct + c
        self.counted += n


@dataclass(frozen=True)
class TrialSpec:
    """Everything that defines one training run; a trial is reproducible from it.

    Attributes:
        workload, workload_params: registered workload name and its parameters.
        optimizer, optimizer_params: registered optimizer name and its hyperparameters (``lr`` ...).
        trainer_params: recipe (batch size, schedule, label smoothing ...; see ``TRAINER_HPARAMS``).
        epochs: length of the run (the LR schedule spans all of it).
        seed: model initialisation, shuffling and any sampling inside optimizers.
        device: torch device string.
        max_passes: a budget in passes (gradient evaluations over mini-batches, as the optimizer declares
            them: :func:`flatlab.optim.protocol.passes_of`) instead of ``epochs``: the run is the most steps
            whose passes fit in it (the last epoch may end part-way), and the LR schedule spans them.
        max_steps: a budget in optimizer steps instead of ``epochs``: the run is exactly that many steps
            (the last epoch may end part-way), and the LR schedule spans them. At most one of ``max_passes``
            and ``max_steps``.
        max_seconds: a budget in training seconds: the run ends at the first epoch boundary at or past it
            (``epochs`` still bounds it, and the LR schedule spans ``epochs``).
    """

    workload: str
    optimizer: str
    epochs: int
    seed: int = 0
    workload_params: Mapping[str, Any] = field(default_factory=dict)
    optimizer_params: Mapping[str, Any] = field(default_factory=dict)
    trainer_params: Mapping[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    max_passes: Optional[int] = None
    max_steps: Optional[int] = None
    max_seconds: Optional[float] = None


class Trainer:
    """Trains ``spec`` on ``data`` (loaded once by the caller; see :meth:`Workload.load_data`).

    ``curve``: the :class:`~flatlab.train.curve.LossCurve` of the primary-pass mini-batch loss (EMA
    factor ``curve_smoothing``), one update per optimizer step, for steps-to-target (IRE paper, Fig. 4).

    ``target_epoch``: the first epoch (1-based) whose mean training loss was at or below the recipe's
    training-loss target (``stop_at_train_loss`` or ``measure_at_train_loss``,
    :func:`~flatlab.train.config.loss_target`); ``None`` until then, or without a target.
    ``target_metrics``: what the caller measured on the model of that epoch (the trial loop's
    ``flat_at_target/*``), ``{name: float}``. Both are part of the state, so a resumed trial knows it has
    reached and measured its target and does neither again.

    ``compute``: the :class:`~flatlab.train.compute.ComputeCounter` of the run (passes, examples, seconds),
    logged every epoch as ``compute/*``; ``max_steps`` and ``epochs``: the run's length (``max_steps``
    ``None`` unless the spec has a pass budget); :attr:`finished`: whether it is over.

    ``parallel``: data parallelism (DDP; :mod:`flatlab.train.parallel`): every rank builds the same
    Trainer and trains on its slice of every global batch of ``batch_size`` rows; the metrics are those
    of the global batch (losses and accuracy reduced over the ranks). ``None``: one process.

    Raises:
        ConfigError: a parameter outside its allowed range (from the registries' declarations); a workload
            that trains nothing (``trains = False``: :func:`flatlab.train.evaluation.evaluate_trial`).
    """

    def __init__(
        self, spec: TrialSpec, data: Data, workload: Optional[Workload] = None, parallel: Optional[DataParallel] = None
    ) -> None:
        if spec.max_passes is not None and spec.max_steps is not None:
            raise ConfigError(
                f"trainer: max_passes={spec.max_passes} and max_steps={spec.max_steps} are both set; set at most one"
            )
        self.spec = spec
        self.workload = workload or build_workload(spec.workload, **dict(spec.workload_params))
        if not self.workload.trains:
            raise ConfigError(
                f"workload {spec.workload!r} trains nothing (trains = False): run its trials with "
                f"flatlab.train.evaluation.evaluate_trial"
            )
        self.hp = resolve_trainer(self.workload.train_defaults, spec.trainer_params)
        self.data = data
        self.device = torch.device(spec.device)
        seed_everything(spec.seed)
        self.model = self.workload.build_model().to(self.device)
        # precision / compile: autocast + fp16 loss scaling live in the closure; compiling in
        # place keeps state_dict keys, evaluation and the closure's BatchNorm hooks on the same module.
        self.precision = Precision(self.hp["precision"], self.device)
        if self.hp["compile"]:
            compile_model(self.model)
        # -- data parallelism: `net` is what the closure runs (the DDP wrapper), `model` the module in it
        self.parallel = parallel if parallel is not None and parallel.world > 1 else None
        self.net = self.model
        if self.parallel is not None:
            self.net = self.parallel.wrap(self.model, self.device, sync_batchnorm=self.hp["sync_batchnorm"])
            self.model = unwrap(self.net)
            last = len(data.train) % self.hp["batch_size"]
            if 0 < last < self.parallel.world:
                raise ConfigError(
                    f"trainer: batch_size={self.hp['batch_size']} leaves a last mini-batch of {last} rows of the "
                    f"{len(data.train)} training rows, fewer than the {self.parallel.world} workers (every worker "
                    f"needs a row): choose another batch_size"
                )
        # -- end data parallelism
        self.optimizer = get_optimizer(spec.optimizer).create(
            self.model.named_parameters(), **dict(spec.optimizer_params)
        )
        n = len(data.train)
        self.steps_per_epoch = math.ceil(n / self.hp["batch_size"])
        warmup_steps = warmup_steps_of(self.hp, self.steps_per_epoch)
        self.compute = ComputeCounter()
        self.max_steps = (
            spec.max_steps if spec.max_passes is None else self._steps_in_budget(spec.max_passes, warmup_steps)
        )
        self.epochs = spec.epochs if self.max_steps is None else math.ceil(self.max_steps / self.steps_per_epoch)
        self.schedule = Schedule(
            kind=self.hp["schedule"],
            total_steps=self.steps_per_epoch * spec.epochs if self.max_steps is None else self.max_steps,
            steps_per_epoch=self.steps_per_epoch,
            warmup_steps=warmup_steps,
            final_factor=self.hp["final_lr_factor"],
            step_epochs=self.hp["step_epochs"],
            step_factor=self.hp["step_factor"],
            milestones=tuple(self.hp["milestones"] or ()),
        )
        self.scheduler = self.schedule.scheduler(self.optimizer)
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.epoch = 0  # completed epochs
        self.step = 0  # completed optimizer steps
        self.last_train_loss: Optional[float] = None
        self.loss_target = loss_target(self.hp)
        self.target_epoch: Optional[int] = None
        self.target_metrics: Dict[str, float] = {}
        # Steps between reads of the divergence flag: every step on CPU (free there), every 16 on
        # accelerators (each read waits for the device; a diverged trial runs at most 15 steps more).
        self.check_every = 1 if self.device.type == "cpu" else 16
        self.curve = LossCurve(self.hp["curve_smoothing"], device=self.device)
        # Augment on the device when the training inputs are in memory (not decoded on demand) and the
        # workload's augmentation is device-agnostic; on CPU both orders are the same computation.
        self._augment_on_device = (
            self.device.type != "cpu"
            and getattr(self.workload, "augments_on_device", False)
            and isinstance(data.train.inputs, (torch.Tensor, dict))
        )

    def _loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.workload.loss(outputs, targets, self.hp["label_smoothing"])

    def _steps_in_budget(self, max_passes: int, warmup_steps: int) -> int:
        """The steps of a run with ``max_passes`` passes, from the optimizer's declared cost
        (:func:`~flatlab.train.compute.steps_within`); the optimizer first learns the epoch length and
        the warm-up (``on_progress``), which IRE's prediction of its switch-on reads.

        Raises:
            ConfigError: the budget does not cover the first step.
        """
        on_progress = getattr(self.optimizer, "on_progress", None)
        if on_progress is not None:
            total = self.steps_per_epoch * self.spec.epochs
            on_progress(Progress(0, 0, total, self.steps_per_epoch, warmup_steps))
        steps = steps_within(max_passes, lambda i: passes_of(self.optimizer, i)[1])
        if steps == 0:
            raise ConfigError(
                f"trainer: max_passes={max_passes} does not cover the first step of optimizer "
                f"{self.spec.optimizer!r} ({passes_of(self.optimizer, 0)[1]} passes); give a larger budget"
            )
        return steps

    @property
    def finished(self) -> bool:
        """Whether the run is over: its pass budget's steps taken, its seconds budget spent (training
        seconds, checked at epoch boundaries), or its epochs done."""
        if self.max_steps is not None:
            return self.step >= self.max_steps
        if self.spec.max_seconds is not None and self.compute.train_s >= self.spec.max_seconds:
            return True
        return self.epoch >= self.epochs

    def _evaluate(self, split: Any) -> Dict[str, float]:
        """The workload's metrics on ``split``, its time and examples counted as evaluation (forward only)."""
        t0 = time.perf_counter()
        with self.precision.autocast():
            out = self.workload.evaluate(self.model, split)
        self.compute.eval_s += time.perf_counter() - t0
        self.compute.eval_examples += len(split)
        return out

    def run_epoch(self) -> Dict[str, float]:
        """Train one epoch and evaluate; returns the epoch's metrics.

        Raises:
            Diverged: the mini-batch loss became non-finite.
        """
        t0 = time.perf_counter()
        self.model.train()
        wide = accumulation_dtype(self.device)  # float64 (float32 on MPS)
        loss_sum = torch.zeros((), dtype=wide, device=self.device)  # on the device: no per-step copy
        stats = _TrainStats(self.workload)  # running train accuracy, fed by the primary pass's outputs
        first_bad = torch.full((), -1, dtype=torch.int64, device=self.device)  # first step with a non-finite loss
        bad_loss = torch.zeros((), dtype=wide, device=self.device)  # and that loss
        rows, lr = 0, self.optimizer.param_groups[0]["lr"]  # training rows stepped on (a pass budget may stop early)
        for x, y, global_rows, shard in self._batches():
            loss = self._train_step(x, y, global_rows, shard, stats)
            # Divergence is flagged on the device and read every `check_every` steps (and at the end of the
            # epoch), so the loop never waits for an accelerator; the step it reports is still exact.
            newly_bad = ~torch.isfinite(loss) & (first_bad < 0)
            first_bad = torch.where(newly_bad, self.step, first_bad)
            wide_loss = loss.to(wide)
            bad_loss = torch.where(newly_bad, wide_loss, bad_loss)
            if (self.step + 1) % self.check_every == 0:
                self._raise_if_diverged(first_bad, bad_loss)
            loss_sum += wide_loss * global_rows
            rows += global_rows
            self.curve.update(loss)
            lr = self.optimizer.param_groups[0]["lr"]
            self.scheduler.step()
            self.step += 1
        self._raise_if_diverged(first_bad, bad_loss)
        self.compute.train_s += time.perf_counter() - t0
        self.epoch += 1
        self.last_train_loss = float(loss_sum) / max(1, rows)
        if self.target_epoch is None and self.loss_target is not None and self.last_train_loss <= self.loss_target:
            self.target_epoch = self.epoch
        metrics = self._epoch_metrics(stats, lr)
        metrics["time/epoch_s"] = time.perf_counter() - t0
        return metrics

    def _batches(self) -> Iterator[Tuple[Inputs, torch.Tensor, int, Optional[Shard]]]:
        """The epoch's mini-batches in a fresh random order, augmented and on the device: ``(inputs,
        targets, rows of the global batch, this rank's shard of it or None)``; stops at ``max_steps``. With
        data parallelism each rank takes its rows of each global batch and augments them with its own
        generator (reseeded per epoch); inputs decoded on demand are prefetched one batch ahead."""
        train, bs, dp = self.data.train, self.hp["batch_size"], self.parallel
        perm = torch.randperm(len(train), generator=self.generator)
        prefetch = getattr(train.inputs, "prefetch", None)  # inputs decoded on demand (e.g. LazyImages)
        augment_generator = self.generator
        if dp is not None:
            augment_generator = torch.Generator().manual_seed(dp.augment_seed(self.spec.seed, self.epoch))
        for start in range(0, len(train), bs):
            if self.max_steps is not None and self.step >= self.max_steps:
                return
            idx = perm[start : start + bs]
            nxt = perm[start + bs : start + 2 * bs]
            global_rows, shard = len(idx), None
            if dp is not None:  # this rank's rows of the global batch (and of the next one)
                shard = dp.shard_of(global_rows)
                idx, nxt = idx[dp.shard(global_rows)], nxt[dp.shard(len(nxt))]
            batch = take(train.inputs, idx)
            if prefetch is not None and start + bs < len(train):
                prefetch(nxt)  # decode the next mini-batch while this one trains
            if self._augment_on_device:  # in-memory data on an accelerator: copy the uint8 batch, augment there
                x = self.workload.augment(to_device(batch, self.device), augment_generator)
            else:
                x = to_device(self.workload.augment(batch, augment_generator), self.device)
            x, y = self.workload.mix(x, to_device(train.targets[idx], self.device), augment_generator)
            yield x, y, global_rows, shard

    def _train_step(
        self, x: Inputs, y: torch.Tensor, global_rows: int, shard: Optional[Shard], stats: "_TrainStats"
    ) -> torch.Tensor:
        """One optimizer step on a mini-batch; returns its loss (the global batch's mean under data
        parallelism: NaN on one rank is NaN on all, so all stop alike).

        Raises:
            Diverged: the closure computed no loss.
        """
        on_progress = getattr(self.optimizer, "on_progress", None)
        if on_progress is not None:
            on_progress(
                Progress(
                    step=self.step,
                    epoch=self.epoch,
                    total_steps=self.schedule.total_steps,
                    steps_per_epoch=self.steps_per_epoch,
                    warmup_steps=self.schedule.warmup_steps,
                    last_epoch_train_loss=self.last_train_loss,
                )
            )
        closure = BatchClosure(
            self.net,
            self._loss,
            x,
            y,
            clip_norm=self.hp["clip_norm"],
            micro_batch=self.hp["micro_batch_size"],
            on_outputs=stats.add,
            precision=self.precision,
            parallel=self.parallel,
            shard=shard,
        )
        self.optimizer.step(closure)
        self.compute.add_step(*passes_of(self.optimizer, self.step), global_rows)
        if self.precision.scaler is not None:
            self.precision.scaler.update(closure.overflowed)  # an overflowed step was skipped: back off
        loss = closure.loss
        if loss is None:
            raise Diverged(self.step, float("nan"))
        return self.parallel.mean(loss) if self.parallel is not None else loss

    def _epoch_metrics(self, stats: "_TrainStats", lr: float) -> Dict[str, float]:
        """The metrics of the epoch just trained (:attr:`epoch` already counts it): training loss, accuracy
        (over every rank's rows) and learning rate, the loss scaler's, each evaluation split's, the test
        split's when tested every epoch, the optimizer's and the compute spent."""
        dp = self.parallel
        if dp is not None:  # -- data parallelism: training accuracy over every rank's rows
            both = dp.sum(
                torch.tensor([float(stats.correct), float(stats.counted)], dtype=torch.float64, device=self.device)
            )
            stats.correct, stats.counted = int(round(float(both[0]))), int(round(float(both[1])))
        metrics: Dict[str, float] = {"epoch": self.epoch, "train/loss": self.last_train_loss, "lr": lr}
        if stats.counted:
            metrics["train/accuracy"] = int(stats.correct) / stats.counted
        if self.precision.scaler is not None:
            metrics["train/skipped_steps"] = self.precision.scaler.pop_skipped()
            metrics["train/loss_scale"] = self.precision.scaler.scale
        for prefix, split in self.data.eval_splits().items():
            for k, v in self._evaluate(split).items():
                metrics[f"{prefix}/{k}"] = v
        if self.hp["test_every_epoch"]:
            metrics.update(self._epoch_test(metrics))
        pop = getattr(self.optimizer, "pop_metrics", None)
        if pop is not None:
            metrics.update(pop())
        metrics.update(self.compute.metrics())
        return metrics

    @staticmethod
    def _raise_if_diverged(first_bad: torch.Tensor, bad_loss: torch.Tensor) -> None:
        step = int(first_bad)  # the one host read (a device sync on accelerators)
        if step >= 0:
            raise Diverged(step, float(bad_loss))

    @property
    def reached_target(self) -> bool:
        """Whether the epoch just completed is the first to reach the training-loss target (``target_epoch``)."""
        return self.target_epoch is not None and self.target_epoch == self.epoch

    def _epoch_test(self, metrics: Mapping[str, float]) -> Dict[str, float]:
        """The test metrics of ``test_every_epoch`` (reported for published per-epoch test curves, never
        selected on). A workload whose validation split IS its test split (``val_size = 0``) has just
        evaluated it: its ``val/*`` values are copied, not computed twice."""
        if self.data.test is None:
            return {}
        if self.data.val is self.data.test:
            return {f"test/{k[len('val/') :]}": v for k, v in metrics.items() if k.startswith("val/")}
        return self.evaluate_test()

    def evaluate_test(self) -> Dict[str, float]:
        """``test/loss`` and ``test/accuracy`` (empty if the workload has no test split)."""
        if self.data.test is None:
            return {}
        return {f"test/{k}": v for k, v in self._evaluate(self.data.test).items()}

    def state_dict(self) -> Dict[str, Any]:
        """Model, optimizer (wrapped bases included), scheduler, RNG states, counters, the loss curve and the
        training-loss target's state (``target_epoch``, ``target_metrics``)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "generator": self.generator.get_state(),
            "epoch": self.epoch,
            "step": self.step,
            "last_train_loss": self.last_train_loss,
            "curve": self.curve.state_dict(),
            "target_epoch": self.target_epoch,
            "target_metrics": dict(self.target_metrics),
            "compute": self.compute.state_dict(),
            **({"loss_scaler": self.precision.scaler.state_dict()} if self.precision.scaler is not None else {}),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; training then continues bit-identically on CPU.

        A checkpoint written before the loss curve existed restores everything else; the curve then
        starts afresh at the checkpoint's step (points before it are missing). One written before the
        training-loss target's state existed restores it as not reached, not measured.
        """
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.generator.set_state(state["generator"])
        self.epoch = state["epoch"]
        self.step = state["step"]
        self.last_train_loss = state["last_train_loss"]
        self.target_epoch = state.get("target_epoch")
        self.target_metrics = {str(k): float(v) for k, v in (state.get("target_metrics") or {}).items()}
        self.compute.load_state_dict(state.get("compute"))  # a checkpoint from before the count: from 0
        if self.precision.scaler is not None and "loss_scaler" in state:
            self.precision.scaler.load_state_dict(state["loss_scaler"])
        if "curve" in state:
            self.curve.load_state_dict(state["curve"])
        else:
            self.curve = LossCurve(self.hp["curve_smoothing"], device=self.device, start_step=self.step)

    def save(self, directory: str) -> None:
        """Write :meth:`state_dict` into ``directory`` (created if missing) as ``trainer.safetensors``
        (every tensor) and ``trainer.json`` (the rest); see :mod:`flatlab.train.checkpoint`.

        Raises:
            TypeError: a part of the state is neither a tensor nor plain data (a bug in an optimizer's
                ``state_dict``).
        """
        save_state(self.state_dict(), directory)

    def snapshot(self) -> StateSnapshot:
        """:meth:`state_dict` captured now (tensors copied to CPU) for a :meth:`~StateSnapshot.write` later,
        from another thread while training goes on; what it writes loads with :meth:`load`.

        Raises:
            TypeError: as :meth:`save`.
        """
        return snapshot_state(self.state_dict())

    def load(self, directory: str) -> None:
        """Load a state written by :meth:`save`. Nothing read can execute code (no pickle).

        Raises:
            CheckpointError: ``directory`` does not hold flatlab's two files (e.g. an old pickle
                ``trainer.pt``), or they are malformed or do not fit this trial (another model, another
                optimizer); the message names the file.
        """
        state = load_state(directory)
        try:
            self.load_state_dict(state)
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError, OverflowError) as exc:
            where = os.path.join(directory, STATE_FILE)
            raise CheckpointError(
                f"{where}: the checkpoint does not fit this trial ({type(exc).__name__}: {exc})"
            ) from exc
