"""Flat-minima optimizers on digits: SGD, SAM, TSAM, SGD-IRE, AdamW, AdmIRE, each tuned by Optuna TPE + ASHA."""

from flatlab import Arm, Study
from flatlab import space as sp

LR_SGD = sp.loguniform(1e-2, 0.5)
LR_ADAMW = sp.loguniform(3e-4, 1e-2)
IRE = {"kappa": sp.uniform(0.0, 5.0), "gamma": sp.uniform(0.5, 0.95), "mask_interval": 10, "switch_epoch": 5}

STUDY = Study(
    name="digits_flatness",
    workload="digits",
    workload_params={"model": "mlp", "width": 128},
    train={"batch_size": 64, "schedule": "cosine", "label_smoothing": 0.1},
    arms=(
        Arm("sgd", space={"lr": LR_SGD, "weight_decay": 5e-4}),
        Arm("sam", space={"lr": LR_SGD, "weight_decay": 5e-4, "rho": sp.loguniform(0.01, 0.5)}),
        Arm("tsam", space={"lr": LR_SGD, "weight_decay": 5e-4, "rho": sp.loguniform(0.01, 0.5),
                           "t": sp.choice([0.0, 1.0, 5.0, 20.0, 100.0]), "s": sp.choice([3, 5]), "noise_radius": sp.loguniform(0.01, 1.0)}),
        Arm("sgd_ire", space={"lr": LR_SGD, "weight_decay": 5e-4, **IRE}),
        Arm("adamw", space={"lr": LR_ADAMW, "weight_decay": sp.loguniform(1e-4, 1e-1)}),
        Arm("adamw_ire", space={"lr": LR_ADAMW, "weight_decay": sp.loguniform(1e-4, 1e-1), **IRE}),
    ),
    metric="val/accuracy",
    mode="max",
    num_trials=8,
    max_epochs=30,
    scheduler="asha",
    grace_period=5,
    reduction_factor=2,
    max_concurrent=2,
)
