"""Trainer hyperparameters: the recipe knobs a study may fix or search (besides optimizer and workload).

Two of them set a training-loss target (at most one per trial, :func:`recipe_problems`): the first epoch
whose mean training loss is at or below it is the trial's ``train/epochs_to_target``, where the study's
flatness measures run (IRE paper: flatter at the same training loss).

* ``stop_at_train_loss``: the trial ends there; its ``flat/<measure>`` are of that model (a trial that
  never gets there trains to ``max_epochs`` and measures that model).
* ``measure_at_train_loss``: the trial measures there, logs the values as ``flat_at_target/<measure>``
  (:data:`flatlab.tracking.runs.AT_TARGET_PREFIX`), trains on to ``max_epochs`` and measures its final
  model as ``flat/<measure>``: flatness at a matched training loss AND at the end, from one run.

Either way a trial that never reaches the target logs ``train/target_reached = 0`` (a miss).
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.train.precision import PRECISIONS
from flatlab.train.schedules import SCHEDULES


class EpochList(HParam):
    """``None`` or a non-empty, strictly increasing list of ints, each within the bounds (epochs)."""

    def allowed(self) -> str:
        return f"None or a strictly increasing non-empty list of ints >= {self.low:g}"

    def validate(self, value: Any, where: str = "") -> Any:
        if value is None and self.nullable:
            return None
        ok = (
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        )
        if not ok or any(v < self.low for v in value) or any(b <= a for a, b in zip(value, value[1:])):
            raise ConfigError(
                f"{where + ': ' if where else ''}{self.name}={value!r} is not allowed; expected {self.allowed()}"
            )
        return tuple(value)


TRAINER_HPARAMS = (
    HParam("batch_size", 64, int, low=1, doc="mini-batch size (examples)"),
    HParam("schedule", "cosine", str, choices=SCHEDULES, doc="LR schedule over the run"),
    HParam("warmup_epochs", 0.0, float, low=0.0, doc="linear LR warm-up length (epochs)"),
    HParam(
        "warmup_steps",
        None,
        int,
        low=0,
        nullable=True,
        doc="linear LR warm-up length in optimizer steps, instead of warmup_epochs (None = warmup_epochs; the IRE "
        "paper's language models: 3000, 500, 300, 1000)",
    ),
    HParam("final_lr_factor", 0.0, float, low=0.0, high=1.0, doc="cosine end lr as a fraction of the peak"),
    HParam("step_epochs", 30, int, low=1, doc="step schedule: epochs between decays"),
    HParam(
        "step_factor", 0.1, float, low=0.0, high=1.0, low_open=True, doc="step and milestones schedules: decay factor"
    ),
    EpochList(
        "milestones",
        None,
        int,
        low=1,
        nullable=True,
        doc="milestones schedule: the epochs from which the lr is multiplied by step_factor once more, increasing "
        "(IRE paper Fig. 2: [20, 50, 80] with step_factor 0.2)",
    ),
    HParam(
        "label_smoothing", 0.0, float, low=0.0, high=1.0, high_open=True, doc="label smoothing of the training loss"
    ),
    HParam(
        "clip_norm",
        None,
        float,
        low=0.0,
        low_open=True,
        nullable=True,
        doc="clip the global L2 gradient norm to this after every backward pass (None = off; LMs: 1.0)",
    ),
    HParam(
        "micro_batch_size",
        None,
        int,
        low=1,
        nullable=True,
        doc="run each mini-batch in chunks of this many examples, accumulating gradients (None = whole batch; memory)",
    ),
    HParam(
        "stop_at_train_loss",
        None,
        float,
        low=0.0,
        low_open=True,
        nullable=True,
        doc="end the trial at the first epoch whose mean training loss is <= this (None = off); flatness is then "
        "measured at a matched training loss (IRE paper: flatter at the same loss), or after max_epochs where a "
        "trial never gets there. Logs train/epochs_to_target",
    ),
    HParam(
        "measure_at_train_loss",
        None,
        float,
        low=0.0,
        low_open=True,
        nullable=True,
        doc="at the first epoch whose mean training loss is <= this, run the study's measures (logged as "
        "flat_at_target/<measure>, with train/epochs_to_target), then train on to max_epochs and measure again "
        "(flat/<measure>); None = off; not with stop_at_train_loss",
    ),
    HParam(
        "sync_batchnorm",
        False,
        bool,
        doc="multi-worker trials (Resources(workers>1)) on GPUs: BatchNorm statistics over the global batch "
        "(SyncBatchNorm)",
    ),
    HParam(
        "curve_smoothing",
        0.9,
        float,
        low=0.0,
        high=1.0,
        high_open=True,
        doc="EMA factor of the training-loss curve used for steps-to-target (0 = raw loss; IRE paper, Fig. 4)",
    ),
    HParam(
        "precision",
        "fp32",
        str,
        choices=PRECISIONS,
        doc="fp32; bf16 (autocast, every pass of a step); fp16 (autocast + per-pass loss scaling, overflowing "
        "steps skipped)",
    ),
    HParam(
        "compile", False, bool, doc="torch.compile the model (first steps slower while it compiles; needs a C compiler)"
    ),
    HParam(
        "test_every_epoch",
        False,
        bool,
        doc="also log test/loss and test/accuracy after every epoch (published per-epoch test curves, e.g. DeepOBS's; "
        "never used for selection or stopping); default: once, after the last epoch",
    ),
)


#: the trainer parameters that set a training-loss target (at most one of them per trial)
TARGET_HPARAMS = ("stop_at_train_loss", "measure_at_train_loss")


def loss_target(hp: Mapping[str, Any]) -> Optional[float]:
    """The training-loss target of a resolved recipe ``hp``: ``stop_at_train_loss`` or
    ``measure_at_train_loss``, whichever is set (``None``: neither)."""
    for name in TARGET_HPARAMS:
        if hp.get(name) is not None:
            return float(hp[name])
    return None


def warmup_steps_of(hp: Mapping[str, Any], steps_per_epoch: int) -> int:
    """The LR warm-up of a resolved recipe ``hp`` in optimizer steps: ``warmup_steps`` where it is set,
    else ``round(warmup_epochs x steps_per_epoch)``."""
    if hp.get("warmup_steps") is not None:
        return int(hp["warmup_steps"])
    return int(round(float(hp.get("warmup_epochs") or 0.0) * steps_per_epoch))


def recipe_problems(hp: Mapping[str, Any]) -> List[str]:
    """What the trainer parameters ``hp`` (each already valid on its own) break together, one message per
    rule: ``stop_at_train_loss`` and ``measure_at_train_loss`` both set (a trial either stops at its target
    or trains past it); the ``milestones`` schedule without ``milestones``; ``warmup_steps`` with a
    non-zero ``warmup_epochs`` (one warm-up, in one unit)."""
    out = []
    if hp.get("warmup_steps") is not None and hp.get("warmup_epochs"):
        out.append(
            f"warmup_steps={hp['warmup_steps']!r} and warmup_epochs={hp['warmup_epochs']!r} are both set; set one "
            "(warmup_steps counts optimizer steps, warmup_epochs epochs)"
        )
    if hp.get("schedule") == "milestones" and not hp.get("milestones"):
        out.append("schedule='milestones' needs milestones, the epochs of the decays, e.g. milestones=[20, 50, 80]")
    stop, measure = (hp.get(name) for name in TARGET_HPARAMS)
    if stop is not None and measure is not None:
        return out + [
            f"stop_at_train_loss={stop!r} and measure_at_train_loss={measure!r} are both set; set at most one: "
            f"stop_at_train_loss ends the trial at the target (flat/* measured there), measure_at_train_loss "
            f"measures there (flat_at_target/*) and trains on to max_epochs (flat/* at the end)"
        ]
    return out
