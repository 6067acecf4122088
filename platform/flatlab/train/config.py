"""Trainer hyperparameters: the recipe knobs a study may fix or search (besides optimizer and workload)."""

from __future__ import annotations

from flatlab.hparams import HParam
from flatlab.train.precision import PRECISIONS
from flatlab.train.schedules import SCHEDULES

TRAINER_HPARAMS = (
    HParam("batch_size", 64, int, low=1, doc="mini-batch size (examples)"),
    HParam("schedule", "cosine", str, choices=SCHEDULES, doc="LR schedule over the run"),
    HParam("warmup_epochs", 0.0, float, low=0.0, doc="linear LR warm-up length (epochs)"),
    HParam("final_lr_factor", 0.0, float, low=0.0, high=1.0, doc="cosine end lr as a fraction of the peak"),
    HParam("step_epochs", 30, int, low=1, doc="step schedule: epochs between decays"),
    HParam("step_factor", 0.1, float, low=0.0, high=1.0, low_open=True, doc="step schedule: decay factor"),
    HParam("label_smoothing", 0.0, float, low=0.0, high=1.0, high_open=True, doc="label smoothing of the training loss"),
    HParam(
        "clip_norm", None, float, low=0.0, low_open=True, nullable=True,
        doc="clip the global L2 gradient norm to this after every backward pass (None = off; LMs: 1.0)",
    ),
    HParam(
        "micro_batch_size", None, int, low=1, nullable=True,
        doc="run each mini-batch in chunks of this many examples, accumulating gradients (None = whole batch; memory)",
    ),
    HParam(
        "stop_at_train_loss", None, float, low=0.0, low_open=True, nullable=True,
        doc="end the trial at the first epoch whose mean training loss is <= this (None = off); flatness is then "
        "measured at a matched training loss (IRE paper: flatter at the same loss). Logs train/epochs_to_target",
    ),
    HParam(
        "sync_batchnorm", False, bool,
        doc="multi-worker trials (Resources(workers>1)) on GPUs: BatchNorm statistics over the global batch (SyncBatchNorm)",
    ),
    HParam(
        "curve_smoothing", 0.9, float, low=0.0, high=1.0, high_open=True,
        doc="EMA factor of the training-loss curve used for steps-to-target (0 = raw loss; IRE paper, Fig. 4)",
    ),
    HParam(
        "precision", "fp32", str, choices=PRECISIONS,
        doc="fp32; bf16 (autocast, every pass of a step); fp16 (autocast + per-pass loss scaling, overflowing steps skipped)",
    ),
    HParam("compile", False, bool, doc="torch.compile the model (first steps slower while it compiles; needs a C compiler)"),
    HParam(
        "test_every_epoch", False, bool,
        doc="also log test/loss and test/accuracy after every epoch (published per-epoch test curves, e.g. DeepOBS's; "
        "never used for selection or stopping); default: once, after the last epoch",
    ),
)
