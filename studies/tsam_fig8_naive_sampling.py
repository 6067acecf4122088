"""TSAM paper, Fig. 8: TSAM's sampler against naive uniform sampling of the perturbations, up to s = 10.

One study, ``tsam_fig8_naive_sampling`` (searcher ``grid``) on ResNet-18 (CIFAR stem) / CIFAR-100 at
t = 20 (the paper's best t there):

* arm ``tsam``: the released sampler (a random start, then an ascent step of length rho), s = 3;
* arm ``naive`` (optimizer ``tsam``): naive sampling, each perturbation uniform in the rho-ball with no
  ascent step (``rho = 0``, ``noise = "uniform"``, ``noise_radius`` = the tuned rho), s in {3, 5, 10}.

Both at TSAM's tuned lr and rho in Table 1's CIFAR-100 grid at t = 20 (a chained study: ``sp.best_of(
"tsam_table1_cifar100", arm="tsam", param=..., where={"t": 20.0})``, resolved at launch and logged with
``<param>.source``; the naive arm's radius is that same rho). The recipe of Table 1 (momentum 0.9, weight
decay 5e-4, label smoothing 0.1, batch 64, constant lr) at equal epochs, as the paper compares them
(``Budget(epochs=200)``, ours); every epoch logs the test
split (``test_every_epoch``) and the ``curves_by`` report draws the naive arm's test accuracy and training
loss per epoch, one curve per s. (1 + 3) x 3 seeds = 12 trials, FIFO; a step of either arm costs 2s
passes (s times SAM's cost; the naive arm's ascent gradient is still evaluated, with a step of 0), so s = 10
costs 10/3 of s = 3.
Paper scale: one GPU, 8 CPUs per trial. ``smoke`` scale (study ``tsam_fig8_naive_sampling_smoke``):
1/16-width ResNet-18, 32 synthetic images, s = 3 for both arms, ``Budget(epochs=1)``, 1 CPU, lr 0.03 and rho 0.1
instead of the chained values.
"""

from _tsam_settings import BY_NAME

from flatlab import Arm, Budget, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
SETTING = BY_NAME["cifar100"]
SOURCE = "tsam_table1_cifar100"  # studies/tsam_table1_images.py
T = SETTING.best_t  # 20


def build(scale: str):
    paper = scale == "paper"
    if paper:
        lr, rho = (sp.best_of(SOURCE, arm="tsam", param=p, where={"t": T}) for p in ("lr", "rho"))
    else:
        lr, rho = 0.03, 0.1
    base = {"lr": lr, "momentum": 0.9, "weight_decay": 5e-4, "t": T}
    naive = {**base, "rho": 0.0, "noise": "uniform", "noise_radius": rho, "s": sp.grid([3, 5, 10] if paper else [3])}
    train = {"batch_size": 64 if paper else 16, "schedule": "constant", "label_smoothing": 0.1}
    return Study(
        name="tsam_fig8_naive_sampling" + ("" if paper else f"_{scale}"),
        description="TSAM's sampler vs naive uniform sampling up to s = 10, ResNet-18/CIFAR-100 (TSAM Fig. 8)",
        workload=SETTING.workload,
        workload_params=SETTING.paper if paper else SETTING.smoke,
        train={**train, "test_every_epoch": True},
        arms=(Arm("tsam", space={**base, "rho": rho, "s": 3}), Arm("tsam", name="naive", space=naive)),
        metric="val/accuracy",
        mode="max",
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        budget=Budget(epochs=SETTING.epochs if paper else 1),  # equal epochs, the paper's protocol
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
        reports={"curves_by": {"metrics": "test/accuracy,train/loss", "arm": "naive", "by": "s"}},
    )
