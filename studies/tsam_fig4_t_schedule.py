"""TSAM paper, Fig. 4: scheduling the tilt t over training: constant, increasing (0 -> t), decreasing (t -> 0).

One study, ``tsam_fig4_t_schedule`` (searcher ``grid``): TSAM on ResNet-18 / CIFAR-100 with t = 20
(the paper's best constant t there), ``t_schedule`` in {constant, increase, decrease} (linear over the
run), s = 3, rho = 0.1, lr = ``LR`` (constant), momentum 0.9, weight decay 5e-4, label smoothing 0.1,
batch 64, 200 epochs (ours), 3 seeds: 9 trials, FIFO. ``LR``/rho: set them from ``tsam_table1_images``.
Paper scale: one GPU, 8 CPUs per trial. ``smoke`` scale: 1/16-width ResNet-18, 32 synthetic images,
the three schedules, 1 epoch, 1 CPU.
"""

from flatlab import Arm, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
LR = 0.03
RHO = 0.1
T = 20.0


def build(scale: str):
    paper = scale == "paper"
    return Study(
        name="tsam_fig4_t_schedule",
        description="TSAM tilt schedules: constant vs increasing vs decreasing t, ResNet-18/CIFAR-100 (TSAM Fig. 4)",
        workload="cifar100",
        workload_params={"model": "resnet18"} if paper else {"model": "resnet18", "data_path": "synthetic", "synthetic_size": 32, "width_mult": 1 / 16},
        train={"batch_size": 64 if paper else 16, "schedule": "constant", "label_smoothing": 0.1},
        arms=(
            Arm(
                "tsam",
                space={
                    "lr": LR, "momentum": 0.9, "weight_decay": 5e-4, "rho": RHO, "t": T, "s": 3,
                    "t_schedule": sp.grid(["constant", "increase", "decrease"]),
                },
            ),
        ),
        metric="val/accuracy",
        mode="max",
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        max_epochs=200 if paper else 1,
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
    )
