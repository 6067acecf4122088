"""TSAM paper, Table 3: the number of sampled perturbations per step, s = 3 vs s = 5.

One study, ``tsam_table3_samples`` (searcher ``grid``): TSAM on ResNet-18 / CIFAR-100 at the paper's
best tilt for that setting (t = 20), rho = 0.1 and lr = ``LR`` (constant), momentum 0.9, weight decay
5e-4, label smoothing 0.1, batch 64, 200 epochs (ours), s in {3, 5} x 3 seeds = 6 trials, FIFO. A step
costs 2s forward/backward passes, so ``time/epoch_s`` shows the price of s = 5 next to its accuracy.
``LR`` and rho are the values we expect ``tsam_table1_images`` to select; set them from its result.
Paper scale: one GPU, 8 CPUs per trial. ``smoke`` scale: 1/16-width ResNet-18, 32 synthetic images,
both values of s, 1 epoch, 1 CPU.
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
        name="tsam_table3_samples",
        description="TSAM with s = 3 vs s = 5 sampled perturbations, ResNet-18/CIFAR-100 (TSAM Table 3)",
        workload="cifar100",
        workload_params={"model": "resnet18"} if paper else {"model": "resnet18", "data_path": "synthetic", "synthetic_size": 32, "width_mult": 1 / 16},
        train={"batch_size": 64 if paper else 16, "schedule": "constant", "label_smoothing": 0.1},
        arms=(Arm("tsam", space={"lr": LR, "momentum": 0.9, "weight_decay": 5e-4, "rho": RHO, "t": T, "s": sp.grid([3, 5])}),),
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
