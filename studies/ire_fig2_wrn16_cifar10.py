"""IRE paper, Fig. 2: SAM-IRE on WRN-16-8 / CIFAR-10, gamma x kappa, IRE switched on at epoch 30 of 100.

Studies (``build(scale)``, run in this order):

1. ``ire_fig2_wrn16_cifar10`` (searcher ``grid``, the paper's grid): arm ``sam_ire`` with gamma in
   {0.8, 0.9, 0.95} x kappa in {2, 5, 10}, and arm ``sam`` for the figure's kappa = 0 column, rho = 0.05,
   momentum 0, IRE from epoch 30 (``switch_epoch=30``, 0-based), 100 epochs, batch 128, lr 0.1 with a
   cosine schedule, weight decay 5e-4, label smoothing 0.1; 3 seeds (the figure shows means).
   (9 + 1) x 3 = 30 trials, FIFO (every trial runs all 100 epochs).
2. ``ire_fig2_wrn16_cifar10_optuna`` (searcher ``optuna``, TPE): arm ``sam_ire`` with gamma ~ U(0.8, 0.95),
   kappa ~ U(0, 10), 16 trials with ASHA (grace 40 epochs: after the switch-on).

The grid, against the paper's:

* kappa = 0 is plain SAM whatever gamma is: SAM-IRE with kappa = 0 steps exactly as its base, bitwise,
  without the curvature pass (tests/optim/test_ire.py). Writing it as a fourth kappa value would run it
  once per gamma, 9 trials of which 6 repeat another; it is one arm ``sam`` instead, run once per seed.
  ``flatlab compare`` then reports the best SAM-IRE configuration against that SAM arm on the same seeds
  (the reference: the first arm alphabetically); ``flatlab results --by-config`` lists every one.
* One learning-rate schedule, no schedule dimension: the figure has none. Its notes do not state the
  schedule; ours is the cosine schedule of the paper's Table 1 CIFAR runs (``train={"schedule": ...}``
  changes it for the whole study).

Our choices where the paper's notes are silent: lr 0.1 and the cosine schedule. Paper scale: one GPU
and 4 CPUs per trial. ``smoke`` scale (studies named ``<name>_smoke``, so they never mix with paper
runs in MLflow): the same studies on a 1/16-width WRN-16-8 and 32 synthetic CIFAR-shaped images,
gamma {0.9} x kappa {2} plus the SAM arm, IRE on from epoch 0, 1 epoch, 1 CPU: runs offline in seconds.
"""

from flatlab import Arm, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")


def build(scale: str):
    paper = scale == "paper"
    suffix = "" if paper else f"_{scale}"  # each scale its own MLflow experiments
    common = dict(
        workload="cifar10",
        workload_params={"model": "wrn16_8"}
        if paper
        else {"model": "wrn16_8", "width_mult": 1 / 16, "data_path": "synthetic", "synthetic_size": 32},
        train={"batch_size": 128 if paper else 16, "label_smoothing": 0.1, "schedule": "cosine"},
        metric="val/accuracy",
        mode="max",
        max_epochs=100 if paper else 1,
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=4, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
    )
    sam = {"rho": 0.05, "momentum": 0.0, "lr": 0.1, "weight_decay": 5e-4}
    fixed = {**sam, "switch_epoch": 30 if paper else 0}
    grid = Study(
        name="ire_fig2_wrn16_cifar10" + suffix,
        description="SAM-IRE gamma x kappa, and SAM (kappa = 0), on WRN-16-8/CIFAR-10 (IRE Fig. 2)",
        arms=(
            Arm("sam", space=dict(sam)),
            Arm(
                "sam_ire",
                space={
                    **fixed,
                    "gamma": sp.grid([0.8, 0.9, 0.95] if paper else [0.9]),
                    "kappa": sp.grid([2.0, 5.0, 10.0] if paper else [2.0]),
                },
            ),
        ),
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        **common,
    )
    optuna = Study(
        name="ire_fig2_wrn16_cifar10_optuna" + suffix,
        description="SAM-IRE on WRN-16-8/CIFAR-10, Optuna TPE over gamma and kappa (smaller budget)",
        arms=(
            Arm(
                "sam_ire",
                space={
                    **fixed,
                    "gamma": sp.uniform(0.8, 0.95),
                    "kappa": sp.uniform(0.0, 10.0),
                },
            ),
        ),
        searcher="optuna",
        num_trials=16 if paper else 1,
        scheduler="asha" if paper else "fifo",
        grace_period=40 if paper else 1,
        reduction_factor=2,
        **common,
    )
    return [grid, optuna]
