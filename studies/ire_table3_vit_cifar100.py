"""IRE paper, Table 3: ViT-T and ViT-S on CIFAR-100, AdamW and SAM with and without IRE.

Studies (``build(scale)``, run in this order):

1. ``ire_table3_vit_cifar100`` (searcher ``grid``, the paper's grid; the model is a grid dimension):
   arms ``adamw``, ``adamw_ire`` (AdmIRE), ``sam_adamw`` (SAM over AdamW), ``sam_adamw_ire``
   (IRE(SAM(AdamW))) x model in {vit_t, vit_s} (patch 4, timm); IRE arms x gamma in {0.99, 0.9, 0.8}
   x kappa in {20, 50}, switched on when the training
   loss first falls below 0.5 (shifted by the label-smoothing floor, as in ``ire_table1_cnn_cifar``:
   0.778 + 0.5 nats); every arm steps with AdamW at the paper's lr 1e-4 (cosine), weight decay 5e-4,
   batch 64, label smoothing 0.1, AutoAugment + crop + flip; 3 seeds. (2 + 12 + 2 + 12) x 3 = 84 trials, FIFO.
2. ``ire_table3_vit_cifar100_optuna`` (searcher ``optuna``): ViT-T, the four arms with lr ranges and,
   for IRE, gamma ~ U(0.8, 0.99), kappa ~ U(20, 50); 6 trials per arm, ASHA.

The SAM arms are SAM over AdamW as in the paper (``sam_adamw``, ``sam_adamw_ire``: the same SAM and IRE
wrappers over the ``adamw`` entry); rho 0.1 (the CIFAR-100 value) and AdamW's betas (0.9, 0.999) and
eps 1e-8 are our choices, the paper states none for these arms. The epoch count (200) is our choice;
the notes give none.
Paper scale: one GPU and 8 CPUs per trial. ``smoke`` scale (studies named ``<name>_smoke``):
1/16-width ViT-T, 32 synthetic images,
gamma {0.9} x kappa {20}, 2 epochs with a threshold the first epoch always meets, 1 CPU.
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


def build(scale: str):
    paper = scale == "paper"
    suffix = (
        "" if paper else f"_{scale}"
    )  # each scale its own MLflow experiments (paper runs never mix with smoke runs)
    switch = round(smoothed_loss_floor(100) + 0.5, 3) if paper else 100.0
    data = {"augment": "autoaugment"}
    if not paper:
        data.update(data_path="synthetic", synthetic_size=32, width_mult=1 / 16)
    common = dict(
        workload="cifar100",
        train={"batch_size": 64 if paper else 16, "schedule": "cosine", "label_smoothing": LABEL_SMOOTHING},
        metric="val/accuracy",
        mode="max",
        max_epochs=200 if paper else 2,
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
    )
    adamw = {"lr": 1e-4, "weight_decay": 5e-4}
    sam = {**adamw, "rho": 0.1}
    ire = {
        "gamma": sp.grid([0.99, 0.9, 0.8] if paper else [0.9]),
        "kappa": sp.grid([20.0, 50.0] if paper else [20.0]),
        "switch_loss": switch,
    }
    models = {"model": sp.grid(["vit_t", "vit_s"] if paper else ["vit_t"])}
    grid = Study(
        name="ire_table3_vit_cifar100" + suffix,
        description="AdamW/SAM +- IRE on ViT-T/S, CIFAR-100 (IRE Table 3)",
        workload_params=data,
        arms=(
            Arm("adamw", space={**adamw, **models}),
            Arm("adamw_ire", space={**adamw, **ire, **models}),
            Arm("sam_adamw", space={**sam, **models}),
            Arm("sam_adamw_ire", space={**sam, **ire, **models}),
        ),
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        **common,
    )
    ire_tpe = {"gamma": sp.uniform(0.8, 0.99), "kappa": sp.uniform(20.0, 50.0), "switch_loss": switch}
    adamw_tpe = {"lr": sp.loguniform(3e-5, 1e-3), "weight_decay": 5e-4}
    sam_tpe = {**adamw_tpe, "rho": 0.1}
    optuna = Study(
        name="ire_table3_vit_cifar100_optuna" + suffix,
        description="AdamW/SAM +- IRE on ViT-T/CIFAR-100, Optuna TPE over lr, gamma, kappa (smaller budget)",
        workload_params={**data, "model": "vit_t"},
        arms=(
            Arm("adamw", space=adamw_tpe),
            Arm("adamw_ire", space={**adamw_tpe, **ire_tpe}),
            Arm("sam_adamw", space=sam_tpe),
            Arm("sam_adamw_ire", space={**sam_tpe, **ire_tpe}),
        ),
        searcher="optuna",
        num_trials=6 if paper else 1,
        scheduler="asha" if paper else "fifo",
        grace_period=50 if paper else 1,
        reduction_factor=3,
        **common,
    )
    return [grid, optuna]
