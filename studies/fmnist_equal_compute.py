"""Flat-minima optimizers on Fashion-MNIST at equal compute: SGD, SAM, TSAM, SGD-IRE, AdamW and AdmIRE,
every trial of every arm given the same number of passes.

``fmnist_flatness`` gives every arm the same epochs, so TSAM (s = 3, six passes a step) spends six times
SGD's compute and SAM twice. Here every trial spends ``CPU_PASSES`` passes (gradient evaluations over
mini-batches of 128, as each optimizer declares them, :func:`flatlab.optim.protocol.passes_of`;
``Study(budget=Budget(passes=...))``, :mod:`flatlab.study.budget`): SGD and AdamW train 20 epochs of the
12,000-image subset, SAM 10 (``fmnist_flatness``'s epochs), TSAM about 3.3, and the IRE arms a little less
than their base optimizer (one extra backward pass per mask refresh, every K = 10 steps). Each arm's
cosine schedule spans its own steps and its ASHA rungs sit at the same fraction of its budget, so at about
the same passes.

The questions (docs/results.md):

* do SAM's and TSAM's flatness and accuracy hold when SGD gets the same compute? ``flatlab compare
  fmnist_equal_compute`` (reference SGD), at the level of the tuning;
* does IRE reach the target in fewer passes than its base optimizer? ``flatlab compare
  fmnist_equal_compute --time-to-target`` (SGD-IRE against SGD) and ``--time-to-target --reference
  adamw`` (AdmIRE against AdamW), to ``TARGET_ACCURACY`` validation accuracy (``Study(target_metric=...)``),
  a target every final run of SGD and AdamW reached in the first launch. A target at the reference's median
  final value is missed by about half its runs, so with two seeds per tuning most tunings' median time is
  infinite and the speed-up cannot be tested: AlgoPerf likewise sets targets its baselines reach;
* ``--at-equal passes`` compares every arm at the largest budget every arm reached, from the per-epoch
  histories.

The design is ``fmnist_flatness``'s (docs/comparing.md's nested-design arithmetic): ``CPU_TUNINGS``
independent tunings of ``CPU_TRIALS`` ASHA trials per arm (Optuna TPE, each arm on its own), two final
seeds per tuning; the same workload, subset, measures (Tr(F) and the neighbourhood loss, at the end and at
the first epoch whose training loss is <= ``TARGET_LOSS``), search ranges and arms (``_flatness_arms``).

Sizing of ``cpu`` (``small_cnn`` at about 9 ms per pass of 128 on one thread): a trial is 1,880 passes,
about 17 one-core seconds of training at any arm. ASHA at a third of the budget and halving runs a search
trial about 0.58 of the budget, so a tuning is 6 arms x (4 x 0.58 + 2) budgets = 26 budgets, 440 s, plus
evaluation, measures and starting its 36 trials (about 7 s each, 250 s): about 690 core-seconds, 35 minutes
for six on 2 free cores.

Scales: ``cpu`` (default; study ``fmnist_equal_compute``), ``cpu-replicate`` (study
``fmnist_equal_compute_replicate``: the ``cpu`` design at ``fmnist_flatness``'s other study seed and final
seeds, so a reader sees which labels a second launch reproduces) and ``smoke`` (study
``fmnist_equal_compute_smoke``: 1,024 synthetic images, SGD and SAM at 96 passes, 2 trials, 2 final
seeds; tests).

Ours, not the papers': the pass budget (SAM's 10 epochs of ``fmnist_flatness``), and everything
``fmnist_flatness`` lists as its own choices.
"""

import dataclasses

import fmnist_flatness
from fmnist_flatness import ARMS, CPU_TRAIN_SIZE

from flatlab import Budget, Study

SCALES = ("cpu", "cpu-replicate", "smoke")
NAME = "fmnist_equal_compute"
CPU_ARMS = ("sgd", "sam", "tsam", "sgd_ire", "adamw", "adamw_ire")
STEPS_PER_EPOCH = -(-CPU_TRAIN_SIZE // 128)
CPU_PASSES = 20 * STEPS_PER_EPOCH  # SGD's 20 epochs, SAM's 10
TARGET_ACCURACY = 0.87
SMOKE_PASSES = 96  # 960 synthetic training images / 32 = 30 steps an epoch: SGD 3.2 epochs, SAM 1.6


def build(scale: str) -> Study:
    """``fmnist_flatness``'s study at the same scale, with this study's arms and pass budget."""
    base = fmnist_flatness.build(scale)
    common = dict(
        name=base.name.replace(fmnist_flatness.NAME, NAME, 1),
        description="flat-minima optimizers on Fashion-MNIST at equal passes: per-arm tuning, flatness, accuracy "
        "and time to target",
    )
    if scale == "smoke":
        return dataclasses.replace(
            base,
            arms=(ARMS["sgd"], ARMS["sam"]),
            train={"batch_size": 32, "schedule": "cosine"},
            budget=Budget(passes=SMOKE_PASSES),
            **common,
        )
    return dataclasses.replace(
        base,
        arms=tuple(ARMS[a] for a in CPU_ARMS),
        budget=Budget(passes=CPU_PASSES),
        max_epochs=20,
        grace_period=6,
        target_metric=TARGET_ACCURACY,
        **common,
    )
