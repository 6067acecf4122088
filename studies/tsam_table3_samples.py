"""TSAM paper, Table 3: the number of sampled perturbations per step, s = 3 vs s = 5, on the three image
settings of Table 1.

Studies (searcher ``grid``, one per setting of ``_tsam_settings.SETTINGS``): ``tsam_table3_samples_cifar100``
(ResNet-18 / CIFAR-100, t = 20), ``tsam_table3_samples_dtd`` (ViT-S/16 fine-tuned on DTD, t = 5) and
``tsam_table3_samples_cifar100_noisy`` (ResNet-18 / CIFAR-100 with 20 % label noise, t = 1): TSAM at the
paper's best t of that setting, momentum 0.9, weight decay 5e-4, label smoothing 0.1, batch 64, constant
lr, s in {3, 5} x 3 seeds = 6 trials each, FIFO. Budget: equal epochs, as the paper compares them
(``Budget(epochs=...)``, the setting's epochs, ours: 200, 30, 200), so s = 5 costs 5/3 of s = 3: a step costs
2s forward/backward passes (s times SAM's cost; ``compute/passes`` and ``time/epoch_s`` show the price next
to the accuracy).

lr and rho are chained from the setting's TSAM Table 1 study (a chained study): ``sp.best_of(
"tsam_table1_<setting>", arm="tsam", param=..., where={"t": t})``, the best completed TSAM trial at this
t (either s) of that study's latest finished launch, by its ``val/accuracy``. They are resolved when this
study is launched and logged as params ``lr``/``rho`` with ``lr.source``/``rho.source`` =
``<study>/<run_id>``; launching before the source has finished starts nothing and says so, and
``flatlab run --dry-run`` shows the values it would use now.
Paper scale: one GPU, 8 CPUs per trial. ``smoke`` scale (studies ``<name>_smoke``): the three settings on
synthetic data (1/16-width ResNet-18; a tiny random-weight ViT at 32x32 for DTD), both values of s,
``Budget(epochs=1)``, 1 CPU, and the constants lr 0.03, rho 0.1 instead of the chained values, so that they run on their
own.
"""

from _tsam_settings import SETTINGS

from flatlab import Arm, Budget, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
SMOKE_LR, SMOKE_RHO = 0.03, 0.1  # smoke scale: constants, so that it runs without the source study


def _study(st, paper: bool, suffix: str) -> Study:
    source = f"tsam_table1_{st.name}"  # studies/tsam_table1_images.py
    if paper:  # resolved at launch from the source study's best TSAM trial at this study's fixed t
        lr = sp.best_of(source, arm="tsam", param="lr", where={"t": st.best_t})
        rho = sp.best_of(source, arm="tsam", param="rho", where={"t": st.best_t})
    else:
        lr, rho = SMOKE_LR, SMOKE_RHO
    return Study(
        name=f"tsam_table3_samples_{st.name}" + suffix,
        description=f"TSAM with s = 3 vs s = 5 sampled perturbations, {st.name} (TSAM Table 3)",
        workload=st.workload,
        workload_params=st.paper if paper else st.smoke,
        train={"batch_size": 64 if paper else 16, "schedule": "constant", "label_smoothing": 0.1},
        arms=(
            Arm(
                "tsam",
                space={
                    "lr": lr,
                    "momentum": 0.9,
                    "weight_decay": 5e-4,
                    "rho": rho,
                    "t": st.best_t,
                    "s": sp.grid([3, 5]),
                },
            ),
        ),
        metric="val/accuracy",
        mode="max",
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        budget=Budget(epochs=st.epochs if paper else 1),  # equal epochs, the paper's protocol
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
    )


def build(scale: str):
    paper = scale == "paper"
    return [_study(st, paper, "" if paper else f"_{scale}") for st in SETTINGS]
