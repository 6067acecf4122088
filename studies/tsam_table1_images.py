"""TSAM paper, Table 1 (images): ERM, SAM and TSAM on CIFAR-100/ResNet-18, DTD/ViT and noisy CIFAR-100.

Studies (``build(scale)``, run in this order; the first three use searcher ``grid``, the paper's grid):

1. ``tsam_table1_cifar100``: ResNet-18 (CIFAR stem) on CIFAR-100.
2. ``tsam_table1_dtd``: fine-tuning an ImageNet-pretrained ViT-S/16 (timm) on DTD, 224x224.
3. ``tsam_table1_cifar100_noisy``: ResNet-18 on CIFAR-100 with 20% uniform label noise (study-level
   ``label_noise``: the data are loaded once per study, so data parameters never go in an arm).

The three settings (workloads, epochs, the paper's best t) are ``_tsam_settings.SETTINGS``, shared with
the Table 3 and Fig. 4 study files.

Arms: ``erm`` (SGD), ``sam``, ``tsam``; lr in {1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1} (constant),
momentum 0.9, weight decay 5e-4, label smoothing 0.1, batch 64; SAM and TSAM x rho in {0.05, 0.1, 0.2};
TSAM x t in {0, 1, 5, 20, 100} x s in {3, 5} (noise radius, distribution: the optimizer's defaults).
3 seeds (the table reports means). Trials per study: (7 + 21 + 210) x 3 = 714, FIFO. Epochs are our
choice (200 for CIFAR-100 from scratch, 30 for DTD fine-tuning). Paper scale: one GPU, 8 CPUs per trial.
The paper's best t: 20 (CIFAR-100), 5 (DTD), 1 (noisy CIFAR-100).

Figs. 3 and 7 (test accuracy and training loss over training, per t): every trial of studies 1-3 logs the
test split after every epoch (``test_every_epoch``; never selected on), and each study's ``curves_by``
report draws, for each t, the per-epoch ``test/accuracy`` and ``train/loss`` of TSAM's best
configuration at that t (chosen on ``val/accuracy``), the mean over its seeds
(``report/curves_t_test_accuracy.png``, ``report/curves_t_train_loss.png`` and their JSON, also
under ``curves/`` on the launch run).

4. ``tsam_table1_optuna`` (searcher ``optuna``): CIFAR-100/ResNet-18, the three arms with
   lr ~ logU(1e-4, 0.1), rho ~ U(0.05, 0.2), t in {0, 1, 5, 20, 100}, s in {3, 5}; 24 trials per arm
   (every arm gets the same budget), ASHA.

``smoke`` scale (studies named ``<name>_smoke``):
the same four studies on synthetic data (1/16-width ResNet-18; a tiny random-weight
ViT at 32x32 for DTD), one point of each grid, 1 epoch, 1 CPU.
"""

from _tsam_settings import SETTINGS

from flatlab import Arm, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
LRS = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1]
RHOS = [0.05, 0.1, 0.2]
TS = [0.0, 1.0, 5.0, 20.0, 100.0]
SS = [3, 5]
CURVES = {"metrics": "test/accuracy,train/loss", "arm": "tsam", "by": "t"}  # Figs. 3 and 7, per t


def _grid_arms(paper: bool):
    base = {"momentum": 0.9, "weight_decay": 5e-4, "lr": sp.grid(LRS if paper else [0.01])}
    rho = {"rho": sp.grid(RHOS if paper else [0.05])}
    return (
        Arm("sgd", name="erm", space=base),
        Arm("sam", space={**base, **rho}),
        Arm("tsam", space={**base, **rho, "t": sp.grid(TS if paper else [5.0]), "s": sp.grid(SS if paper else [3])}),
    )


def build(scale: str):
    paper = scale == "paper"
    suffix = (
        "" if paper else f"_{scale}"
    )  # each scale its own MLflow experiments (paper runs never mix with smoke runs)
    train = {"batch_size": 64 if paper else 16, "schedule": "constant", "label_smoothing": 0.1}
    common = dict(
        train=train,
        metric="val/accuracy",
        mode="max",
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
    )
    studies = [
        Study(
            name=f"tsam_table1_{st.name}" + suffix,
            description=f"ERM vs SAM vs TSAM, {st.name} (TSAM Table 1)",
            workload=st.workload,
            workload_params=st.paper if paper else st.smoke,
            arms=_grid_arms(paper),
            searcher="grid",
            scheduler="fifo",
            grace_period=1,
            max_epochs=st.epochs if paper else 1,
            reports={"curves_by": CURVES},  # Figs. 3 and 7
            **{**common, "train": {**train, "test_every_epoch": True}},
        )
        for st in SETTINGS
    ]
    base = {"momentum": 0.9, "weight_decay": 5e-4, "lr": sp.loguniform(1e-4, 0.1)}
    rho = {"rho": sp.uniform(0.05, 0.2)}
    studies.append(
        Study(
            name="tsam_table1_optuna" + suffix,
            description="ERM vs SAM vs TSAM on ResNet-18/CIFAR-100, Optuna TPE (smaller budget)",
            workload="cifar100",
            workload_params=SETTINGS[0].paper if paper else SETTINGS[0].smoke,
            arms=(
                Arm("sgd", name="erm", space=base),
                Arm("sam", space={**base, **rho}),
                Arm("tsam", space={**base, **rho, "t": sp.choice(TS), "s": sp.choice(SS)}),
            ),
            searcher="optuna",
            num_trials=24 if paper else 1,
            scheduler="asha" if paper else "fifo",
            grace_period=20 if paper else 1,
            reduction_factor=3,
            max_epochs=200 if paper else 1,
            **common,
        )
    )
    return studies
