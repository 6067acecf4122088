"""Tuning curves on Fashion-MNIST: what a random search of n trials finds for SGD, SAM and SGD-IRE, and
whether the flatness of the trial it picks depends on n.

A pool of independent trials per arm (``searcher="random"``, ``scheduler="fifo"``: every trial drawn from
the arm's prior and trained to the end, trial seeds cycling through ``SEEDS`` so that the seed is part of
each draw), flatness measured on every trial's final model. ``flatlab compare fmnist_tuning_curves
--tuning-curves`` then gives, per arm and n = 1..N (docs/comparing.md):

* the median tuning curve of the validation accuracy with its simultaneous 95 % band (Lourie et al. 2024,
  computed by ``opda``) and the unbiased expected best of n (Tang et al. 2020);
* the test accuracy and each flatness measure of the trial a search of n picks by validation (every
  subset of n counted exactly, Sivaprasad et al., ICML 2020), and the probability that the arm's pick beats
  SGD's at that n;

and ``--correlation`` asks whether flatness predicts generalisation over all 3 x N trained models (Jiang et
al., ICLR 2020: Kendall's tau per measure against the test accuracy and the generalisation gap).

Scales (``--scale``):

* ``cpu`` (default; study ``fmnist_tuning_curves``): ``small_cnn`` on the stratified ``TRAIN_SIZE``-image
  training subset of ``fmnist_flatness``, ``VAL_SIZE`` validation images, the official test set;
  ``TRIALS`` trials per arm of ``EPOCHS`` epochs, two 1-core trials at a time; the measures of
  ``fmnist_flatness`` (Tr(F) with sampled labels; the mean loss under N(0, sigma^2 I) parameter noise) on 512
  training examples. Sized for at most 60 minutes on 2 free cores: an epoch costs about 1.5 one-core
  seconds for SGD and SGD-IRE and 2.9 for SAM (``bench/fmnist_epoch_cost.py``), so the 3 x 32 trials of 8
  epochs train in about 3 x 32 x 8 x 2 = 1,540 one-core seconds, and measuring, evaluating, starting and
  logging them add about 8 s each, about 2,300 core-seconds in all: 20 minutes of training on 2 cores, the
  rest start-up and measurement.
* ``smoke`` (study ``fmnist_tuning_curves_smoke``): synthetic images, 4 trials of 2 epochs per arm (tests).

Ours, not the papers': the priors (those of ``fmnist_flatness``), ``small_cnn``, the budget. No final stage:
the pool is the answer.
"""

from _flatness_arms import flatness_arms

from flatlab import Resources, Study
from flatlab import space as sp

SCALES = ("cpu", "smoke")
NAME = "fmnist_tuning_curves"
ARMS = ("sgd", "sam", "sgd_ire")
TRAIN_SIZE, VAL_SIZE = 20000, 5000
TRIALS, EPOCHS, SEEDS = 32, 8, (0, 1, 2, 3)
SIGMA = 0.05

_ARMS = flatness_arms(sp.loguniform(0.01, 0.3), sp.loguniform(3e-4, 1e-2))


def build(scale: str) -> Study:
    common = dict(
        description="random-search pools of SGD, SAM and SGD-IRE on Fashion-MNIST: tuning curves and flatness",
        workload="fashion_mnist",
        arms=tuple(_ARMS[a] for a in ARMS),
        metric="val/accuracy",
        mode="max",
        searcher="random",
        scheduler="fifo",
        resources=Resources(cpu=1),
        max_concurrent=2,
        seeds=SEEDS,
    )
    if scale == "smoke":
        return Study(
            name=f"{NAME}_smoke",
            workload_params={
                "model": "small_cnn",
                "width": 8,
                "data_path": "synthetic",
                "synthetic_size": 512,
                "val_size": 64,
            },
            train={"batch_size": 32, "schedule": "cosine"},
            num_trials=4,
            max_epochs=2,
            measures={"fisher_trace": {}, "neighbourhood_loss": {"sigma": SIGMA, "draws": 4}},
            measure_examples=32,
            **common,
        )
    return Study(
        name=NAME,
        workload_params={"model": "small_cnn", "train_size": TRAIN_SIZE, "val_size": VAL_SIZE},
        train={"batch_size": 128, "schedule": "cosine"},
        num_trials=TRIALS,
        max_epochs=EPOCHS,
        measures={"fisher_trace": {}, "neighbourhood_loss": {"sigma": SIGMA, "draws": 20}},
        measure_examples=512,
        **common,
    )
