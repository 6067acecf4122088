"""TSAM paper, Appendix C: SAM over a wide range of rho, rho in {0.05, 0.1, 0.5, 1, 5, 15}.

One study, ``tsam_appc_sam_rho`` (searcher ``grid``): SAM on ResNet-18 (CIFAR stem) / CIFAR-100, rho over
the appendix's grid {0.05, 0.1, 0.5, 1, 5, 15}, 3 seeds: 18 trials, FIFO. The recipe of TSAM Table 1
(momentum 0.9, weight decay 5e-4, label smoothing 0.1, batch 64, constant lr) at Table 1's epochs,
``Budget(epochs=200)`` (ours; SAM's step costs 2 passes, a third of TSAM's at s = 3); the lr is
SAM's tuned best in Table 1's CIFAR-100 grid (a chained study: ``sp.best_of("tsam_table1_cifar100",
arm="sam", param="lr")``, resolved at launch and logged with ``lr.source``; launching before that study
has finished starts nothing and says so).
Paper scale: one GPU, 8 CPUs per trial. ``smoke`` scale (study ``tsam_appc_sam_rho_smoke``): 1/16-width
ResNet-18, 32 synthetic images, rho in {0.05, 15}, ``Budget(epochs=1)``, 1 CPU, lr 0.01 instead of the chained value.
"""

from _tsam_settings import BY_NAME

from flatlab import Arm, Budget, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
RHOS = [0.05, 0.1, 0.5, 1.0, 5.0, 15.0]  # TSAM paper, Appendix C
SETTING = BY_NAME["cifar100"]


def build(scale: str):
    paper = scale == "paper"
    lr = sp.best_of("tsam_table1_cifar100", arm="sam", param="lr") if paper else 0.01
    return Study(
        name="tsam_appc_sam_rho" + ("" if paper else f"_{scale}"),
        description="SAM over rho in {0.05, 0.1, 0.5, 1, 5, 15}, ResNet-18/CIFAR-100 (TSAM Appendix C)",
        workload=SETTING.workload,
        workload_params=SETTING.paper if paper else SETTING.smoke,
        train={"batch_size": 64 if paper else 16, "schedule": "constant", "label_smoothing": 0.1},
        arms=(
            Arm(
                "sam",
                space={
                    "lr": lr,
                    "momentum": 0.9,
                    "weight_decay": 5e-4,
                    "rho": sp.grid(RHOS if paper else [0.05, 15.0]),
                },
            ),
        ),
        metric="val/accuracy",
        mode="max",
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        budget=Budget(epochs=SETTING.epochs if paper else 1),
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
    )
