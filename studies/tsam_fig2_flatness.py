"""TSAM paper, Fig. 2: loss around the ERM, SAM and TSAM solutions as the noise scale grows.

How flat are the solutions of ERM, SAM and TSAM? Mean and variance of ``L(theta* + eps)``,
``eps ~ N(0, sigma^2 I)``, as the noise scale sigma grows, for the final models.

One study, ``tsam_fig2_flatness`` (searcher ``grid``): ResNet-18 (CIFAR stem) on CIFAR-100, as the TSAM
paper; arms ``erm`` (SGD), ``sam``, ``tsam``, each at one configuration, 3 seeds; 9 trials, FIFO.
Every trial measures ``neighbourhood_loss`` on its final model with a sweep over sigma
(``measures={"neighbourhood_loss": {"sigmas": SIGMAS, ...}}``): per sigma ``s`` the metrics
``flat/neighbourhood_loss/sigma_<s>`` (mean over noise draws) and ``flat/neighbourhood_loss/sigma_<s>_var``
(variance over draws), on the same 1,024 training examples and the same standard-normal draws for every
trial and every sigma (``eps = s * z``: paired across arms, seeds and scales). After the study the runner
logs the figure on the launch's parent run (:mod:`flatlab.analysis.flatness_sweep`):
``flatness_sweep/neighbourhood_loss_vs_sigma.png`` (mean and variance against sigma, one line per
arm, error bars over seeds) and its data as ``.csv``; the usual comparison table comes with it.

From the paper (ALGORITHMS.md section 2): the models compared (ERM, SAM, TSAM), the measure (mean and
variance of the loss under Gaussian parameter noise), CIFAR-100 / ResNet-18, batch 64, SGD momentum
0.9, weight decay 5e-4, label smoothing 0.1, constant lr, TSAM's best t = 20 on this task, each model
at its tuned best.

Each arm at its tuned best (a chained study): its lr (and SAM's and TSAM's rho, TSAM's s) are those of
the arm's best completed trial in ``tsam_table1_cifar100`` (TSAM's among the trials at t = 20), by that
study's ``val/accuracy``: ``sp.best_of("tsam_table1_cifar100", arm=..., param=...)``, resolved when this
study is launched and logged with ``<param>.source``; launching before that study has finished starts
nothing and says so (``flatlab run --dry-run`` shows the values it would use now).

Ours: 200 epochs for every arm (``Budget(epochs=200)``: equal epochs, the paper's protocol, at 1, 2 and 2s
passes a step for ERM, SAM and TSAM); the sigmas
(0.001 ... 0.05, log-spaced: the loss moves from its clean value to well above it for a ResNet-18 of
this size); 40 draws per sigma; the loss measured is the unsmoothed cross-entropy on 1,024 training
examples (the minimum the optimizers reached). One GPU and 8 CPUs per trial.

``smoke`` scale: ``tsam_fig2_flatness_smoke`` (its own MLflow experiment): synthetic CIFAR-100-shaped
data (32 images), 1/16-width ResNet-18, ``Budget(epochs=1)``, one seed, 3 sigmas x 4 draws on 16 examples, 1 CPU, and
the constants lr 0.01, rho 0.1, s = 3 instead of the chained values, so that it runs on its own.
"""

from flatlab import Arm, Budget, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
NAME = "tsam_fig2_flatness"
SIGMAS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05)
SMOKE_SIGMAS = (0.01, 0.05, 0.2)
SOURCE = "tsam_table1_cifar100"  # TSAM Table 1's ResNet-18 / CIFAR-100 grid (studies/tsam_table1_images.py)
T = 20.0  # the paper's best t on CIFAR-100 / ResNet-18


def tuned(arm: str, params, where=None):
    """``{param: sp.best_of(SOURCE, arm, param, where)}``: the arm's best trial's values in the source study."""
    return {p: sp.best_of(SOURCE, arm=arm, param=p, where=where) for p in params}


def _arms(paper: bool):
    base = {"momentum": 0.9, "weight_decay": 5e-4}
    if paper:
        erm, sam, tsam = tuned("erm", ["lr"]), tuned("sam", ["lr", "rho"]), tuned("tsam", ["lr", "rho", "s"], {"t": T})
    else:
        erm, sam, tsam = {"lr": 0.01}, {"lr": 0.01, "rho": 0.1}, {"lr": 0.01, "rho": 0.1, "s": 3}
    return (
        Arm("sgd", name="erm", space={**base, **erm}),
        Arm("sam", space={**base, **sam}),
        Arm("tsam", space={**base, **tsam, "t": T}),
    )


def build(scale: str):
    paper = scale == "paper"
    arms = _arms(paper)
    sigmas = SIGMAS if paper else SMOKE_SIGMAS
    return [
        Study(
            name=NAME if paper else f"{NAME}_smoke",
            description="ERM vs SAM vs TSAM: mean and variance of L(theta* + eps) against sigma (TSAM Fig. 2)",
            workload="cifar100",
            workload_params={"model": "resnet18"}
            if paper
            else {"model": "resnet18", "data_path": "synthetic", "synthetic_size": 32, "width_mult": 1 / 16},
            arms=arms,
            train={"batch_size": 64 if paper else 16, "schedule": "constant", "label_smoothing": 0.1},
            metric="val/accuracy",
            mode="max",
            searcher="grid",
            scheduler="fifo",
            grace_period=1,
            budget=Budget(epochs=200 if paper else 1),
            seeds=(0, 1, 2) if paper else (0,),
            resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
            max_concurrent=None if paper else 1,
            measures={
                "neighbourhood_loss": {
                    "sigma": sigmas[len(sigmas) // 2],
                    "sigmas": list(sigmas),
                    "draws": 40 if paper else 4,
                }
            },
            measure_examples=1024 if paper else 16,
            measure_split="train",
        )
    ]
