"""Flatness comparison on Fashion-MNIST, each arm tuned on its own: SGD, SAM and TSAM (cpu), eight arms (paper).

The question of ``digits_flatness``, on real data: which optimizer, fairly tuned, reaches flatter minima and
generalises better? Fashion-MNIST (Xiao, Rasul & Vollgraf 2017; workload ``fashion_mnist``, Debian's IDX
files) instead of scikit-learn's 8x8 digits.

Every arm is tuned by its own Optuna TPE study with its own ASHA rungs (a trial is only compared with
trials of its own arm), on the validation accuracy, with the same number of trials per arm. Every trial
measures its model twice on fixed training examples: at the first epoch whose mean training loss is
<= the target (the trainer's ``measure_at_train_loss``; the IRE paper's claim is "flatter at the same
training loss"), logged as ``flat_at_target/<measure>`` with ``train/epochs_to_target``, and after its last
epoch (it trains on to ``max_epochs``), logged as ``flat/<measure>``. The measures: Tr(F) with labels
sampled from the model (IRE's measure, ``fisher_trace``) and the mean and variance of L(theta + eps),
eps ~ N(0, sigma^2 I) (TSAM's Fig. 2, ``neighbourhood_loss``). After the search each arm's best
configuration is re-run over fresh final seeds; ``flatlab compare <study>`` reports those: test
accuracy, both sets of flatness and epochs to the target per arm with 95 % intervals, and paired
differences against SGD (Holm-adjusted within each quantity). A seed that never reaches the target is
counted as a miss in the at-target rows and still gives its final-model values.

The answer is asked of ``CPU_TUNINGS`` independent tunings (``Study(tunings=...)``): each arm is searched
that many times, each search with its own Optuna study, seeds, ASHA rungs, best configuration and final
seeds, and ``flatlab compare`` tests each claim at the level of the tuning (a t over the S per-tuning
differences, Holm across arms; docs/comparing.md).

Scales (``--scale``; the default is the one a laptop runs, so that ``flatlab run studies/fmnist_flatness.py``
then ``flatlab compare fmnist_flatness`` is the real-data answer in well under 90 minutes on 2 cores):

* ``paper`` (study ``fmnist_flatness_paper``): DeepOBS's ``fmnist_2c2d`` problem (3,274,634
  parameters, DeepOBS's architecture and initialisation) at DeepOBS's settings where it has them: batch
  128, the 50,000 training images left after DeepOBS's 10,000-image validation hold-out, 100 epochs;
  all eight arms, ``PAPER_TRIALS`` trials per arm (ASHA grace 10), 10 final seeds (DeepOBS re-runs its
  best setting with 10), one GPU per trial, one tuning; target training loss ``PAPER_TARGET_LOSS``,
  measures on 1,024 examples.
* ``cpu`` (default; study ``fmnist_flatness``): the arms ``CPU_ARMS`` on ``small_cnn`` (20,746
  parameters), a stratified ``CPU_TRAIN_SIZE``-image training subset, ``CPU_VAL_SIZE`` validation images,
  the official 10,000 test images; ``CPU_TUNINGS`` tunings of ``CPU_TRIALS`` trials per arm, up to
  ``CPU_EPOCHS`` epochs, ASHA (grace 3, halving), two 1-core trials at a time, then ``CPU_SEEDS`` final
  seeds per tuning; target training loss ``TARGET_LOSS``, measures on 512 examples.
* ``cpu-replicate`` (study ``fmnist_flatness_replicate``): the ``cpu`` design again at another study
  seed (``REPLICATE_SEED``: other data split, trial seeds and Optuna draws) and other final seeds
  (``REPLICATE_SEEDS``), so a reader can see which labels a second launch reproduces.
* ``smoke`` (study ``fmnist_flatness_smoke``): 1,024 synthetic Fashion-MNIST-shaped images, an 8-channel
  ``small_cnn``, the arms ``SMOKE_ARMS``, 2 trials of up to 3 epochs (IRE on in the third) and 2 final
  seeds, target training loss ``SMOKE_TARGET_LOSS`` (tests; seconds of training).

The ``cpu`` design follows the nested-design arithmetic of docs/comparing.md. The variance of the
tuning-level estimate is sigma_t^2 / S + sigma_s^2 / (S m) for S tunings of m final seeds; the earlier
launch of three tunings of 4 seeds put the tuning's share of the Tr(F) differences at 46-70 % (sigma_t^2
about sigma_s^2), and a search of ``CPU_TRIALS`` ASHA trials costs about twice one final run, so the
cheapest m is sqrt(2 sigma_s^2 / sigma_t^2), about 1.4: two final seeds (two also let the heterogeneity
F-test see the seed noise within a tuning), and the compute goes into tunings, which buy power.
The arms were cut to SGD, SAM and TSAM, the claims the earlier launch made about flatness, and the
training subset to ``CPU_TRAIN_SIZE`` images, to fit two launches on 2 cores.

Sizing of ``cpu`` (from ``bench/fmnist_epoch_cost.py``: ``small_cnn`` trains at about 9 ms per step of 128
on one thread, plain SGD): one epoch of 12,000 images is 94 steps, about 0.85 s for SGD, plus about 0.1 s
to evaluate 5,000 validation images. Per step SAM costs 2 forward/backward passes and TSAM 2s = 6 (s = 3),
so one epoch of every arm is about 9 x 0.85 + 3 x 0.1 = 7.9 one-core seconds. ASHA's halving at epochs
3 and 6 runs a search trial 5.5 epochs on average, so a tuning's search is 4 x 5.5 x 7.9 = 174 s, its final
stage 2 x 10 x 7.9 = 158 s, and starting and logging its 18 trials about 4 s each, 72 s: 404 core-seconds
a tuning, 2,420 for six, about 20 minutes on 2 free cores. On cores shared with other work every step is
slower (a probe of the three arms under a load average of 4 ran an epoch in 4.1, 5.1 and 12.2 s, about
twice these figures): run it on a quiet machine.

From the papers: the arms and their optimizers (SAM, Foret et al. 2021; ASAM, Kwon et al. 2021; TSAM's
released procedure; IRE's SGD/SAM/AdamW variants with a Fisher mask refreshed every K = 10 steps), the
measures (IRE: Tr(F) with sampled labels; TSAM Fig. 2: mean and variance of the loss under Gaussian
parameter noise), TSAM's grid of t (0, 1, 5, 20) with s = 3 samples, SGD momentum 0.9 and weight decay
5e-4 (both papers' CNN recipes). From DeepOBS: the ``2c2d`` network, its data split, batch 128 and the
100 epochs of the ``paper`` scale.

Ours, not the papers': ``small_cnn`` and the 12,000-image subset (a CPU budget), every search range
(the papers tune on CIFAR and ImageNet), the cosine schedule (DeepOBS uses a constant rate), the target
loss ``TARGET_LOSS`` (SGD, SAM and AdamW at the middle of their ranges, lr 0.055 / rho 0.055 and lr 1.7e-3,
reach it at epoch 5 or 6 of 15 and end at 0.235 to 0.248, so the at-target and final measurements are
different models), sigma = ``SIGMA`` (where
L(theta + eps) rises visibly above L(theta) for these models), IRE switching on at 0-based epoch 2, the third (the paper
switches at a training loss: 0.1 for CIFAR CNNs) and the paper scale's target ``PAPER_TARGET_LOSS``,
which was not checked on a run.
"""

from _flatness_arms import flatness_arms

from flatlab import Resources, Study
from flatlab import space as sp

SCALES = ("cpu", "cpu-replicate", "paper", "smoke")
NAME = "fmnist_flatness"
TARGET_LOSS = 0.35
PAPER_TARGET_LOSS = 0.1
SMOKE_TARGET_LOSS = 2.2  # synthetic data starts at ln 10 = 2.30; most of the range reaches 2.2 by epoch 2 or 3
SIGMA = 0.05
CPU_TRAIN_SIZE, CPU_VAL_SIZE = 12000, 5000
CPU_TRIALS, CPU_EPOCHS, CPU_SEEDS, CPU_TUNINGS = 4, 10, (1, 2), 6
CPU_ARMS = ("sgd", "sam", "tsam")
REPLICATE_SEED, REPLICATE_SEEDS = 7, (21, 22)
PAPER_TRIALS = 32

LR_SGD = sp.loguniform(0.01, 0.3)
LR_ADAMW = sp.loguniform(3e-4, 1e-2)
ARMS = flatness_arms(LR_SGD, LR_ADAMW)  # the eight arms, as in digits_flatness.py
SMOKE_ARMS = ("sgd", "sam_ire")


def measures(draws: int) -> dict:
    """The two flatness measures, with ``draws`` noise draws for the neighbourhood loss."""
    return {"fisher_trace": {}, "neighbourhood_loss": {"sigma": SIGMA, "draws": draws}}


def build(scale: str) -> Study:
    common = dict(
        description="flat-minima optimizers on Fashion-MNIST: per-arm tuning, flatness at a matched training loss "
        "and at the end, final seeds",
        workload="fashion_mnist",
        metric="val/accuracy",
        mode="max",
        scheduler="asha",
        reduction_factor=2,
    )
    if scale == "paper":
        return Study(
            name=f"{NAME}_paper",
            workload_params={"model": "2c2d"},
            train={"batch_size": 128, "schedule": "cosine", "measure_at_train_loss": PAPER_TARGET_LOSS},
            arms=tuple(ARMS.values()),
            num_trials=PAPER_TRIALS,
            max_epochs=100,
            grace_period=10,
            resources=Resources(cpu=4, gpu=1),
            measures=measures(20),
            measure_examples=1024,
            final_seeds=tuple(range(1, 11)),
            **common,
        )
    if scale == "smoke":
        return Study(
            name=f"{NAME}_smoke",
            workload_params={
                "model": "small_cnn",
                "width": 8,
                "data_path": "synthetic",
                "synthetic_size": 1024,
                "val_size": 64,
            },
            train={"batch_size": 32, "schedule": "cosine", "measure_at_train_loss": SMOKE_TARGET_LOSS},
            arms=tuple(ARMS[a] for a in SMOKE_ARMS),
            num_trials=2,
            max_epochs=3,
            grace_period=1,
            resources=Resources(cpu=1),
            max_concurrent=2,
            measures=measures(4),
            measure_examples=32,
            final_seeds=(1, 2),
            **common,
        )
    replicate = scale == "cpu-replicate"
    return Study(
        name=f"{NAME}_replicate" if replicate else NAME,
        workload_params={"model": "small_cnn", "train_size": CPU_TRAIN_SIZE, "val_size": CPU_VAL_SIZE},
        train={"batch_size": 128, "schedule": "cosine", "measure_at_train_loss": TARGET_LOSS},
        arms=tuple(ARMS[a] for a in CPU_ARMS),
        num_trials=CPU_TRIALS,
        max_epochs=CPU_EPOCHS,
        grace_period=3,
        resources=Resources(cpu=1),
        max_concurrent=2,
        measures=measures(20),
        measure_examples=512,
        final_seeds=REPLICATE_SEEDS if replicate else CPU_SEEDS,
        seed=REPLICATE_SEED if replicate else 0,
        tunings=CPU_TUNINGS,
        **common,
    )
