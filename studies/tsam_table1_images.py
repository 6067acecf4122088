"""TSAM paper, Table 1 (images): ERM, SAM, ESAM1, ESAM2, PGN, RSAM and TSAM on CIFAR-100/ResNet-18, DTD/ViT
and noisy CIFAR-100.

Studies (``build(scale)``, run in this order; all but the last use searcher ``grid``, the paper's grid):

1. ``tsam_table1_cifar100``: ResNet-18 (CIFAR stem) on CIFAR-100.
2. ``tsam_table1_dtd``: fine-tuning an ImageNet-pretrained ViT-S/16 (timm) on DTD, 224x224.
3. ``tsam_table1_cifar100_noisy``: ResNet-18 on CIFAR-100 with 20% uniform label noise (study-level
   ``label_noise``: the data are loaded once per study, so data parameters never go in an arm).
4. ``tsam_table1_<dataset>_matched`` for each of the three: the compute-matched columns ESAM1, ESAM2, PGN
   and RSAM.

The three settings (workloads, epochs, the paper's best t, training rows) are ``_tsam_settings.SETTINGS``,
shared with the Table 3 and Fig. 4 study files.

Arms of 1-3: ``erm`` (SGD), ``sam``, ``tsam``, at equal epochs (``Budget(epochs=...)``, the paper's
protocol; a step costs 1, 2 and 2s passes, TSAM s times SAM's cost); lr in {1e-4, 3e-4, 1e-3, 3e-3, 1e-2,
3e-2, 0.1} (constant), momentum 0.9, weight decay 5e-4, label smoothing 0.1, batch 64. TSAM x rho in
{0.05, 0.1, 0.2} x t in {0, 1, 5, 20, 100} x s in {3, 5} (noise radius, distribution: the optimizer's
defaults). SAM x rho in {0.05, 0.1, 0.5, 1, 5, 15} (Appendix C). 3 seeds (the table reports means).
Trials per study: (7 + 42 + 210) x 3 = 777, FIFO. Epochs are our choice (200 for CIFAR-100 from scratch,
30 for DTD fine-tuning). Paper scale: one GPU, 8 CPUs per trial. The paper's best t: 20 (CIFAR-100), 5
(DTD), 1 (noisy CIFAR-100).

Arms of 4, the baselines the paper defines by compute (``docs/algorithms/sam_variants.md``), each trial at
TSAM's compute: ``Budget(passes=P)``, P = TSAM's passes per trial at s = 3, the setting's epochs x its
steps per epoch (``ceil(rows / batch)``) x 2s = 6 passes a step: CIFAR-100 (clean and noisy) 200 x 704 x 6
= 844,800, DTD 30 x 53 x 6 = 9,540 (TSAM at s = 5 spends 5/3 of it). ``esam1`` (optimizer ``sam``): SAM
run longer, 2 passes a step, so 3x TSAM's epochs (600 / 90); ``esam2`` tries k = 5 step sizes (1 + k = 6
passes a step, so TSAM's epochs); ``pgn`` x its coefficient alpha in {0.3, 0.5, 0.7, 0.9} (the paper's
grid; r is ``rho``) and ``rsam`` x lambda (``noise_std``) in {5e-4, 2.5e-3} x gamma in {1, 2} (ours,
around the released code's values: lambda from 5e-4 to 2.5e-3 over its run, gamma 2, as the paper's
recommended values were not at hand), 2 passes a step each, so 3x TSAM's epochs: the paper runs them "the
same amount of time as TSAM". Each x the SAM rho grid and the lr grid: (42 + 42 + 168 + 168) x 3 = 1260
trials. The launch turns the budget into each arm's epochs (``flatlab run --dry-run`` shows them).

Figs. 3 and 7 (test accuracy and training loss over training, per t): every trial of the grid studies of 1-3 logs the
test split after every epoch (``test_every_epoch``; never selected on), and each study's ``curves_by``
report draws, for each t, the per-epoch ``test/accuracy`` and ``train/loss`` of TSAM's best
configuration at that t (chosen on ``val/accuracy``), the mean over its seeds
(``report/curves_t_test_accuracy.png``, ``report/curves_t_train_loss.png`` and their JSON, also
under ``curves/`` on the launch run).

5. ``tsam_table1_optuna`` (searcher ``optuna``): CIFAR-100/ResNet-18, ERM, SAM and TSAM with
   lr ~ logU(1e-4, 0.1), rho ~ U(0.05, 0.2), t in {0, 1, 5, 20, 100}, s in {3, 5}; 24 trials per arm
   (every arm gets the same budget), ASHA.

``smoke`` scale (studies named ``<name>_smoke``):
the same studies on synthetic data (1/16-width ResNet-18; a tiny random-weight ViT at 32x32 for DTD), one
point of each grid, batch 16, ``Budget(epochs=1)`` for 1-3 and TSAM's passes of that epoch for 4 (CIFAR-100:
1 x 2 x 6 = 12 passes, so 3 epochs of SAM; DTD: 1 x 3 x 6 = 18), 1 CPU: all seven arms run.
"""

import math

from _tsam_settings import SETTINGS

from flatlab import Arm, Budget, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
LRS = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1]
RHOS = [0.05, 0.1, 0.2]
SAM_RHOS = [0.05, 0.1, 0.5, 1.0, 5.0, 15.0]  # Appendix C, for SAM and the compute-matched baselines
TS = [0.0, 1.0, 5.0, 20.0, 100.0]
SS = [3, 5]
PGN_ALPHAS = [0.3, 0.5, 0.7, 0.9]
RSAM_NOISE_STDS = [5e-4, 2.5e-3]
RSAM_GAMMAS = [1.0, 2.0]
ESAM2_K = 5  # 1 + k = 6 passes a step: TSAM's 2s at s = 3
MATCHED_S = 3  # the compute-matched baselines get TSAM's passes at this s (2s a step)
CURVES = {"metrics": "test/accuracy,train/loss", "arm": "tsam", "by": "t"}  # Figs. 3 and 7, per t


def tsam_passes(epochs: int, rows: int, batch: int, s: int = MATCHED_S) -> int:
    """TSAM's passes per trial: ``epochs`` x its steps per epoch (``ceil(rows / batch)``) x 2s passes a step."""
    return epochs * math.ceil(rows / batch) * 2 * s


def _base(paper: bool):
    return {"momentum": 0.9, "weight_decay": 5e-4, "lr": sp.grid(LRS if paper else [0.01])}


def _sam_rho(paper: bool):
    return {"rho": sp.grid(SAM_RHOS if paper else [0.05])}


def _grid_arms(paper: bool):
    base, sam_rho = _base(paper), _sam_rho(paper)
    rho = {"rho": sp.grid(RHOS if paper else [0.05])}
    return (
        Arm("sgd", name="erm", space=base),
        Arm("sam", space={**base, **sam_rho}),
        Arm("tsam", space={**base, **rho, "t": sp.grid(TS if paper else [5.0]), "s": sp.grid(SS if paper else [3])}),
    )


def _matched_arms(paper: bool):
    base, sam_rho = _base(paper), _sam_rho(paper)
    one = (lambda grid: sp.grid(grid)) if paper else (lambda grid: sp.grid(grid[-1:]))
    return (
        Arm("sam", name="esam1", space={**base, **sam_rho}),
        Arm("esam2", space={**base, **sam_rho, "k": ESAM2_K}),
        Arm("pgn", space={**base, **sam_rho, "alpha": one(PGN_ALPHAS)}),
        Arm("rsam", space={**base, **sam_rho, "noise_std": one(RSAM_NOISE_STDS), "gamma": one(RSAM_GAMMAS)}),
    )


def build(scale: str):
    paper = scale == "paper"
    suffix = (
        "" if paper else f"_{scale}"
    )  # each scale its own MLflow experiments (paper runs never mix with smoke runs)
    batch = 64 if paper else 16
    train = {"batch_size": batch, "schedule": "constant", "label_smoothing": 0.1}
    common = dict(
        train=train,
        metric="val/accuracy",
        mode="max",
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
    )
    studies = []
    for st in SETTINGS:
        name, epochs, rows = st.name, (st.epochs if paper else 1), st.rows[0 if paper else 1]
        grid = dict(
            workload=st.workload,
            workload_params=st.paper if paper else st.smoke,
            searcher="grid",
            scheduler="fifo",
            grace_period=1,
            **{**common, "train": {**train, "test_every_epoch": True}},
        )
        studies.append(
            Study(
                name=f"tsam_table1_{name}" + suffix,
                description=f"ERM, SAM and TSAM at equal epochs, {name} (TSAM Table 1)",
                arms=_grid_arms(paper),
                budget=Budget(epochs=epochs),  # the paper's protocol: equal epochs
                reports={"curves_by": CURVES},  # Figs. 3 and 7
                **grid,
            )
        )
        passes = tsam_passes(epochs, rows, batch)
        studies.append(
            Study(
                name=f"tsam_table1_{name}_matched" + suffix,
                description=f"ESAM1, ESAM2, PGN and RSAM at TSAM's {passes} passes (s = {MATCHED_S}), {name} "
                "(TSAM Table 1)",
                arms=_matched_arms(paper),
                budget=Budget(passes=passes),  # TSAM's compute per trial
                **grid,
            )
        )
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
            budget=Budget(epochs=200 if paper else 1),
            **common,
        )
    )
    return studies
