"""IRE paper, Fig. 2: SAM-IRE on WRN-16-8 / CIFAR-10, gamma x kappa, IRE switched on at epoch 30 of 100,
and the trace of the Hessian (~ Tr(F)) over training.

Studies (``build(scale)``, run in this order):

1. ``ire_fig2_wrn16_cifar10`` (searcher ``grid``, the paper's grid): arm ``sam_ire`` with gamma in
   {0.8, 0.9, 0.95} x kappa in {2, 5, 10}, and arm ``sam`` for the figure's kappa = 0 column, rho = 0.05,
   momentum 0, IRE from epoch 30 (``switch_epoch=30``, 0-based), 100 epochs, batch 128, lr 0.1, weight
   decay 5e-4, label smoothing 0.1; each under the figure's two learning-rate schedules (a grid dimension
   ``schedule`` of both arms): panel (a) a constant lr 0.1, panels (b)-(d) lr 0.1 divided by 5 at epochs
   20, 50 and 80 (``schedule="milestones"``, ``milestones=[20, 50, 80]``, ``step_factor=0.2``); 3 seeds
   (the figure shows means). (9 + 1) x 2 x 3 = 60 trials, FIFO (every trial runs all 100 epochs).
   Every trial measures Tr(F) (``fisher_trace``, labels sampled from the model, the paper's estimate of
   Tr(H)) on 1,024 training examples every 5 epochs (``measure_every=5``): ``flat_curve/fisher_trace``
   against the epoch is the figure's curve; ``flat/fisher_trace`` is the final model's.
2. ``ire_fig2_wrn16_cifar10_optuna`` (searcher ``optuna``, TPE): arm ``sam_ire`` with gamma ~ U(0.8, 0.95),
   kappa ~ U(0, 10), under the milestones schedule, 16 trials with ASHA (grace 40 epochs: after the
   switch-on); Tr(F) on the final model.

The grid, against the paper's:

* kappa = 0 is plain SAM whatever gamma is: SAM-IRE with kappa = 0 steps exactly as its base, bitwise,
  without the curvature pass (tests/optim/test_ire.py). Writing it as a fourth kappa value would run it
  once per gamma, 9 trials of which 6 repeat another; it is one arm ``sam`` instead, run once per seed.
  ``flatlab compare`` then reports the best SAM-IRE configuration against that SAM arm on the same seeds
  (the reference: the first arm alphabetically); ``flatlab results --by-config`` lists every one.
* Panels (b)-(d) share the milestones schedule; they differ in what the paper plots from the runs, so
  the grid holds the schedule once.

Ours: Tr(F) every 5 epochs (not every epoch: one per-example Fisher pass over 1,024 images costs about
an epoch's compute on this model) with one label draw, on 1,024 training examples. Paper scale: one GPU
and 4 CPUs per trial. ``smoke`` scale (studies named ``<name>_smoke``, so they never mix with paper
runs in MLflow): the same studies on a 1/16-width WRN-16-8 and 32 synthetic CIFAR-shaped images,
gamma {0.9} x kappa {2} plus the SAM arm, the milestones schedule only (a milestone at epoch 1), IRE on
from epoch 0, 1 epoch, Tr(F) every epoch on 8 examples, 1 CPU: runs offline in seconds.
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
        train={
            "batch_size": 128 if paper else 16,
            "label_smoothing": 0.1,
            "schedule": "milestones",
            "milestones": [20, 50, 80] if paper else [1],
            "step_factor": 0.2,
        },
        metric="val/accuracy",
        mode="max",
        max_epochs=100 if paper else 1,
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=4, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
        measures={"fisher_trace": {}},
        measure_examples=1024 if paper else 8,
    )
    schedules = {"schedule": sp.grid(["constant", "milestones"] if paper else ["milestones"])}  # (a); (b)-(d)
    sam = {"rho": 0.05, "momentum": 0.0, "lr": 0.1, "weight_decay": 5e-4}
    fixed = {**sam, "switch_epoch": 30 if paper else 0}
    grid = Study(
        name="ire_fig2_wrn16_cifar10" + suffix,
        description="SAM-IRE gamma x kappa, and SAM (kappa = 0), on WRN-16-8/CIFAR-10 (IRE Fig. 2)",
        arms=(
            Arm("sam", space={**sam, **schedules}),
            Arm(
                "sam_ire",
                space={
                    **fixed,
                    **schedules,
                    "gamma": sp.grid([0.8, 0.9, 0.95] if paper else [0.9]),
                    "kappa": sp.grid([2.0, 5.0, 10.0] if paper else [2.0]),
                },
            ),
        ),
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        measure_every=5 if paper else 1,
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
