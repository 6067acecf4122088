"""TSAM paper, Table 2: the models trained by ERM, SAM and TSAM, each evaluated on all three objectives.

Does TSAM reach lower values of every objective, its own and the others'? §5.2 of the paper evaluates each
trained model on the ERM objective ``L(theta)``, the SAM objective ``max_{||eps|| <= rho} L(theta + eps)``
and the tilted objective ``L^t(theta)``, on the training and on the test set: two 3x3 tables.

One study, ``tsam_table2_objectives`` (searcher ``grid``): ResNet-18 (CIFAR stem) on CIFAR-100, arms
``erm`` (SGD), ``sam`` and ``tsam`` at one configuration each, 3 seeds; 9 trials, FIFO. Every trial
evaluates its final model on the three registered measures (:mod:`flatlab.sharpness.objectives`):
``erm_objective``, ``sam_objective`` (SAM's ascent step of length rho) and ``tilted_objective`` (TSAM's
own estimator: s perturbations, each a random delta of radius ``noise_radius`` plus rho's normalised ascent,
then the log-mean-exp at tilt t), with rho and t those the arms train with, on the training set
(``flat/<measure>``) and on the test set (``measure_extra_splits=("test",)``: ``flat_test/<measure>``).
After the study the ``objectives`` report prints both tables (rows: the trained model; columns: the
objective; mean ± std over seeds) and logs them on the launch run; ``flatlab objectives
tsam_table2_objectives`` prints them again.

From the paper (ALGORITHMS.md section 2): the three trained models and three objectives, on train and
test; CIFAR-100 / ResNet-18, batch 64, SGD momentum 0.9, weight decay 5e-4, label smoothing 0.1, constant
lr; TSAM's best t = 20 on this task and s = 3; rho from the paper's grid {0.05, 0.1, 0.2}; each model
at its tuned best.

Each arm at its tuned best (a chained study, as ``tsam_fig2_flatness``): its lr (and SAM's and TSAM's
rho) are those of the arm's best completed trial in ``tsam_table1_cifar100`` (TSAM's among the trials at
t = 20 and s = 3), by that study's ``val/accuracy``: ``sp.best_of("tsam_table1_cifar100", arm=...,
param=...)``, resolved when this study is launched and logged with ``<param>.source``; launching before
that study has finished starts nothing and says so (``flatlab run --dry-run`` shows the values it would
use now).

Ours: the objectives' rho 0.1 (one value of the paper's grid, the same for every row so that the three
models are scored on the same objective, whatever rho each trained with), 200 epochs for every arm
(``Budget(epochs=200)``: equal epochs, the paper's protocol, at 1, 2 and 2s = 6 passes a step for ERM, SAM
and TSAM), the objectives over
the whole training and test sets (``measure_examples=0``), the loss evaluated being the unsmoothed
cross-entropy in eval mode, the tilted objective with s = 3 draws seeded by ``measure_seed`` (the same
draws for every trial). One GPU and 8 CPUs per trial.

``smoke`` scale: ``tsam_table2_objectives_smoke`` (its own MLflow experiment): synthetic CIFAR-100-shaped
data (32 images, 8 test images), 1/16-width ResNet-18, ``Budget(epochs=1)``, one seed, the objectives on 8 examples
of each split, 1 CPU, and the constants lr 0.01 and rho 0.1 instead of the chained values, so that it
runs on its own.
"""

from flatlab import Arm, Budget, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
NAME = "tsam_table2_objectives"
SOURCE = "tsam_table1_cifar100"  # TSAM Table 1's ResNet-18 / CIFAR-100 grid (studies/tsam_table1_images.py)
RHO, T, S = 0.1, 20.0, 3  # the objectives' rho, TSAM's t and s (the paper's best on CIFAR-100 / ResNet-18)


def tuned(arm: str, params, where=None):
    """``{param: sp.best_of(SOURCE, arm, param, where)}``: the arm's best trial's values in the source study."""
    return {p: sp.best_of(SOURCE, arm=arm, param=p, where=where) for p in params}


def _arms(paper: bool):
    base = {"momentum": 0.9, "weight_decay": 5e-4}
    if paper:
        erm, sam, tsam = (
            tuned("erm", ["lr"]),
            tuned("sam", ["lr", "rho"]),
            tuned("tsam", ["lr", "rho"], {"t": T, "s": S}),
        )
    else:
        erm, sam, tsam = {"lr": 0.01}, {"lr": 0.01, "rho": RHO}, {"lr": 0.01, "rho": RHO}
    return (
        Arm("sgd", name="erm", space={**base, **erm}),
        Arm("sam", space={**base, **sam}),
        Arm("tsam", space={**base, **tsam, "t": T, "s": S}),
    )


def build(scale: str):
    paper = scale == "paper"
    arms = _arms(paper)
    return [
        Study(
            name=NAME if paper else f"{NAME}_smoke",
            description="ERM, SAM and TSAM models on the ERM, SAM and tilted objectives, train and test (TSAM Table 2)",
            workload="cifar100",
            workload_params={"model": "resnet18"}
            if paper
            else {"model": "resnet18", "data_path": "synthetic", "synthetic_size": 32, "width_mult": 1 / 16},
            arms=arms,
            train={"batch_size": 64 if paper else 16, "schedule": "constant", "label_smoothing": 0.1},
            metric="val/accuracy",
            mode="max",
            searcher="grid",
            scheduler="fifo",
            grace_period=1,
            budget=Budget(epochs=200 if paper else 1),
            seeds=(0, 1, 2) if paper else (0,),
            resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
            max_concurrent=None if paper else 1,
            measures={
                "erm_objective": {},
                "sam_objective": {"rho": RHO},
                "tilted_objective": {"t": T, "s": S, "rho": RHO},
            },
            measure_examples=0 if paper else 8,
            measure_split="train",
            measure_extra_splits=("test",),
            reports={"objectives": {"split": "train", "extra": "test"}},
        )
    ]
