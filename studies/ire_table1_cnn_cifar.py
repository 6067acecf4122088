"""IRE paper, Table 1: WRN-28-10 and ResNet-56 on CIFAR-10/100, SGD and SAM with and without IRE.

Studies (``build(scale)``, run in this order):

1. ``ire_table1_cnn_cifar10`` and 2. ``ire_table1_cnn_cifar100`` (searcher ``grid``, the paper's
   grid; the model is a grid dimension): arms ``sgd``, ``sgd_ire``, ``sam``, ``sam_ire`` x model in
   {wrn28_10, resnet56}; IRE arms x gamma in {0.99, 0.9, 0.8} x kappa in {1, 2}; lr 0.1 cosine,
   momentum 0.9, batch 128, weight decay 5e-4, label smoothing 0.1; SAM rho 0.05 (CIFAR-10) / 0.1
   (CIFAR-100); 100 epochs (CIFAR-10) / 200 epochs (CIFAR-100); 3 seeds (the table reports means).
   Per dataset: (2 + 12 + 2 + 12) x 3 = 84 trials, FIFO.
3. ``ire_table1_cnn_optuna`` (searcher ``optuna``): CIFAR-100 / ResNet-56, the four arms with
   lr ~ logU(0.03, 0.3) and, for IRE, gamma ~ U(0.8, 0.99), kappa ~ U(1, 2); 8 trials per arm, ASHA.

IRE switch-on: the paper switches IRE on when the training loss first falls below 0.1. The trainer's
training loss includes label smoothing 0.1, whose minimum is the entropy of the smoothed target,
0.500 nats (10 classes) / 0.778 nats (100 classes), so a literal 0.1 would never be reached; we use
that floor + 0.1 (see ``switch_loss``), i.e. the same distance above the smallest reachable loss.
Paper scale: one GPU and 8 CPUs per trial. ``smoke`` scale (studies named ``<name>_smoke``):
the same arms on 1/16-width ResNet-56 and
32 synthetic images per dataset, gamma {0.9} x kappa {2}, 2 epochs with a switch threshold the first
epoch always meets (so the loss-triggered switch-on runs), 1 CPU.
"""

import math

from flatlab import Arm, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
LABEL_SMOOTHING = 0.1


def smoothed_loss_floor(num_classes: int, eps: float = LABEL_SMOOTHING) -> float:
    """Smallest label-smoothed cross-entropy (nats): the entropy of the smoothed one-hot target."""
    hi, lo = 1 - eps + eps / num_classes, eps / num_classes
    return -(hi * math.log(hi) + (num_classes - 1) * lo * math.log(lo))


def switch_loss(num_classes: int, paper_threshold: float) -> float:
    """The paper's train-loss threshold, shifted by the label-smoothing floor (module docstring)."""
    return round(smoothed_loss_floor(num_classes) + paper_threshold, 3)


def _arms(paper: bool, rho: float, switch: float, model):
    base = {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "model": model}
    ire = {
        "gamma": sp.grid([0.99, 0.9, 0.8] if paper else [0.9]),
        "kappa": sp.grid([1.0, 2.0] if paper else [2.0]),
        "switch_loss": switch,
    }
    return (
        Arm("sgd", space=base),
        Arm("sgd_ire", space={**base, **ire}),
        Arm("sam", space={**base, "rho": rho}),
        Arm("sam_ire", space={**base, "rho": rho, **ire}),
    )


def build(scale: str):
    paper = scale == "paper"
    suffix = (
        "" if paper else f"_{scale}"
    )  # each scale its own MLflow experiments (paper runs never mix with smoke runs)
    data = {} if paper else {"data_path": "synthetic", "synthetic_size": 32, "width_mult": 1 / 16}
    common = dict(
        train={"batch_size": 128 if paper else 16, "schedule": "cosine", "label_smoothing": LABEL_SMOOTHING},
        metric="val/accuracy",
        mode="max",
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
        grace_period=1,
    )
    studies = []
    for dataset, classes, rho, epochs in (("cifar10", 10, 0.05, 100), ("cifar100", 100, 0.1, 200)):
        switch = switch_loss(classes, 0.1) if paper else 100.0
        models = sp.grid(["wrn28_10", "resnet56"] if paper else ["resnet56"])
        studies.append(
            Study(
                name=f"ire_table1_cnn_{dataset}" + suffix,
                description=f"SGD/SAM +- IRE on WRN-28-10 and ResNet-56, {dataset} (IRE Table 1)",
                workload=dataset,
                workload_params=data,
                arms=_arms(paper, rho, switch, models),
                searcher="grid",
                scheduler="fifo",
                max_epochs=epochs if paper else 2,
                **common,
            )
        )
    lr = sp.loguniform(0.03, 0.3)
    ire = {
        "gamma": sp.uniform(0.8, 0.99),
        "kappa": sp.uniform(1.0, 2.0),
        "switch_loss": switch_loss(100, 0.1) if paper else 100.0,
    }
    base = {"lr": lr, "momentum": 0.9, "weight_decay": 5e-4}
    studies.append(
        Study(
            name="ire_table1_cnn_optuna" + suffix,
            description="SGD/SAM +- IRE on ResNet-56/CIFAR-100, Optuna TPE over lr, gamma, kappa (smaller budget)",
            workload="cifar100",
            workload_params={"model": "resnet56", **data},
            arms=(
                Arm("sgd", space=base),
                Arm("sgd_ire", space={**base, **ire}),
                Arm("sam", space={**base, "rho": 0.1}),
                Arm("sam_ire", space={**base, "rho": 0.1, **ire}),
            ),
            searcher="optuna",
            num_trials=8 if paper else 1,
            scheduler="asha" if paper else "fifo",
            max_epochs=200 if paper else 2,
            reduction_factor=3,
            **{**common, "grace_period": 50 if paper else 1},
        )
    )
    return studies
