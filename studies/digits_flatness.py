"""Flatness comparison of SGD, SAM, ASAM, TSAM, IRE and AdamW arms on digits, each tuned on its own.

Which optimizer, fairly tuned, reaches flatter minima and generalises better? On scikit-learn's digits
(no download; a 2-core laptop runs it).

Every arm is tuned by its own Optuna TPE study with its own ASHA rungs (a trial is only compared with
trials of its own arm), on the validation accuracy. Each trial stops at the first epoch whose mean
training loss is <= ``TARGET_LOSS`` (the IRE paper's claim is "flatter at the same training loss"), or
after ``max_epochs``; its final model is then measured on 512 fixed training examples: Tr(F) with
labels sampled from the model (IRE's measure) and the mean and variance of L(theta + eps),
eps ~ N(0, sigma^2 I) (TSAM's Fig. 2). After the search each arm's best configuration is re-run over
fresh final seeds; ``flatlab compare`` reports those: test accuracy, flatness and epochs to the target
per arm with 95 % intervals, and paired differences against SGD.

Scales (``--scale``):

* ``full`` (default; study ``digits_flatness``): eight optimizers (SGD, SAM, ASAM, TSAM, SGD-IRE,
  SAM-IRE, AdamW, AdmIRE; the SAM/TSAM-over-AdamW variants are left out), 16 trials per arm, up to 30
  epochs, then 5 final seeds.
* ``demo`` (study ``digits_flatness_demo``, what ``make demo`` runs): SGD, SAM, TSAM, SGD-IRE, AdamW
  and AdmIRE, 4 trials per arm, up to 20 epochs, then 3 final seeds.

Ours, not the papers': the model (an MLP of width 128 on 8x8 digits), the ranges, the target loss and
the measures' sigma. TSAM runs s = 3 samples (the paper's grids use 3 and 5). IRE switches on at
epoch 2 and refreshes its mask every K = 10 steps.
"""

from _flatness_arms import flatness_arms

from flatlab import Study
from flatlab import space as sp

SCALES = ("full", "demo")
TARGET_LOSS = 0.05

LR_SGD = sp.loguniform(0.02, 0.5)
LR_ADAMW = sp.loguniform(5e-4, 1e-2)
ARMS = flatness_arms(LR_SGD, LR_ADAMW)  # the eight arms, as in fmnist_flatness.py
DEMO_ARMS = ("sgd", "sam", "tsam", "sgd_ire", "adamw", "adamw_ire")


def build(scale: str) -> Study:
    full = scale == "full"
    return Study(
        name="digits_flatness" if full else "digits_flatness_demo",
        description="flat-minima optimizers on digits: per-arm tuning, flatness at a matched training loss, "
        "final seeds",
        workload="digits",
        workload_params={"model": "mlp", "width": 128},
        train={"batch_size": 64, "schedule": "cosine", "stop_at_train_loss": TARGET_LOSS},
        arms=tuple(ARMS.values()) if full else tuple(ARMS[a] for a in DEMO_ARMS),
        metric="val/accuracy",
        mode="max",
        num_trials=16 if full else 4,
        max_epochs=30 if full else 20,
        scheduler="asha",
        grace_period=3,
        reduction_factor=2,
        max_concurrent=2,
        measures={"fisher_trace": {}, "neighbourhood_loss": {"sigma": 0.03, "draws": 20}},
        measure_examples=512,
        final_seeds=(1, 2, 3, 4, 5) if full else (1, 2, 3),
    )
