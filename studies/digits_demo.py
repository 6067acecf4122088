"""SGD vs AdamW on scikit-learn digits: Optuna TPE over lr, weight_decay (and momentum), ASHA, 8 trials per arm."""

from flatlab import Arm, Study
from flatlab import space as sp

STUDY = Study(
    name="digits_demo",
    workload="digits",
    workload_params={"model": "mlp", "width": 128},
    train={"batch_size": 64, "schedule": "cosine"},
    arms=(
        Arm(
            "sgd",
            space={
                "lr": sp.loguniform(1e-3, 1.0),
                "weight_decay": sp.loguniform(1e-6, 1e-2),
                "momentum": sp.uniform(0.0, 0.95),
            },
        ),
        Arm("adamw", space={"lr": sp.loguniform(1e-4, 3e-2), "weight_decay": sp.loguniform(1e-6, 1e-1)}),
    ),
    metric="val/accuracy",
    mode="max",
    num_trials=8,
    max_epochs=20,
    scheduler="asha",
    grace_period=4,
    reduction_factor=2,
    max_concurrent=2,
    seed=0,
)
