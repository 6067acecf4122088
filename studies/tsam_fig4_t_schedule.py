"""TSAM paper, Fig. 4: scheduling the tilt t over training: constant, increasing (0 -> t), decreasing (t -> 0).

One study, ``tsam_fig4_t_schedule`` (searcher ``grid``): TSAM on ResNet-18 / CIFAR-100 with 20 % uniform
label noise, as the paper's figure, with t = 1 (the paper's best constant t there), ``t_schedule`` in
{constant, increase, decrease} (linear over the run), s = 3, momentum 0.9, weight decay 5e-4, label
smoothing 0.1, constant lr, batch 64, 3 seeds: 9 trials, FIFO. Budget: ``Budget(epochs=200)`` (ours), the
same for every schedule; a step costs 2s = 6 passes (s times SAM's cost) whatever the schedule.

lr and rho are chained from TSAM Table 1's noisy CIFAR-100 study (a chained study):
``sp.best_of("tsam_table1_cifar100_noisy", arm="tsam", param=..., where={"t": 1.0, "s": 3})``, the best
completed TSAM trial with this study's fixed t and s in that study's latest finished launch, by its
``val/accuracy``; resolved at launch and logged as params ``lr``/``rho`` with ``lr.source``/
``rho.source`` = ``<study>/<run_id>``. Launching before ``tsam_table1_cifar100_noisy`` has finished
starts nothing and says so; ``flatlab run --dry-run`` shows the values it would use now.
Paper scale: one GPU, 8 CPUs per trial. ``smoke`` scale (study ``tsam_fig4_t_schedule_smoke``):
1/16-width ResNet-18, 32 synthetic images with 20 % of their labels flipped, the three schedules,
``Budget(epochs=1)``, 1 CPU, and the constants lr 0.03, rho 0.1 instead of the chained values, so that it runs on its
own.
"""

from _tsam_settings import BY_NAME

from flatlab import Arm, Budget, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
SETTING = BY_NAME["cifar100_noisy"]  # the figure's setting: CIFAR-100 with 20 % label noise
SOURCE = "tsam_table1_cifar100_noisy"  # TSAM Table 1's grid there (studies/tsam_table1_images.py)
SMOKE_LR, SMOKE_RHO = 0.03, 0.1  # smoke scale: constants, so that it runs without the source study
T = SETTING.best_t  # 1


def build(scale: str):
    paper = scale == "paper"
    if paper:  # resolved at launch from the source study's best TSAM trial at this study's fixed settings
        lr = sp.best_of(SOURCE, arm="tsam", param="lr", where={"t": T, "s": 3})
        rho = sp.best_of(SOURCE, arm="tsam", param="rho", where={"t": T, "s": 3})
    else:
        lr, rho = SMOKE_LR, SMOKE_RHO
    return Study(
        name="tsam_fig4_t_schedule" + ("" if paper else f"_{scale}"),
        description="TSAM tilt schedules: constant vs increasing vs decreasing t, noisy CIFAR-100 (TSAM Fig. 4)",
        workload=SETTING.workload,
        workload_params=SETTING.paper if paper else SETTING.smoke,
        train={"batch_size": 64 if paper else 16, "schedule": "constant", "label_smoothing": 0.1},
        arms=(
            Arm(
                "tsam",
                space={
                    "lr": lr,
                    "momentum": 0.9,
                    "weight_decay": 5e-4,
                    "rho": rho,
                    "t": T,
                    "s": 3,
                    "t_schedule": sp.grid(["constant", "increase", "decrease"]),
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
