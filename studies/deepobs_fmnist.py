"""DeepOBS's fmnist_2c2d baselines re-run: SGD, Momentum and Adam at DeepOBS's tuned settings, beside the
published curves.

Does flatlab reproduce somebody else's curve? DeepOBS (Schneider, Balles & Hennig, ICLR 2019) publishes
per-epoch test accuracy and loss of its tuned optimizers on test problem ``fmnist_2c2d`` (a 3.27M-parameter
CNN on Fashion-MNIST), one JSON file per seed. ``published/deepobs_fmnist_2c2d.json`` holds them (read
from ``fsschneider/DeepOBS``, ``deepobs/baselines/fmnist_2c2d/``, each run with its path and commit).
This study runs the same three settings as fixed configurations (grid of one point per arm) over
seeds, with the test metrics logged after every epoch, and declares that file as its reference, so
``flatlab curves <study>`` prints flatlab's per-epoch mean and 95 % interval beside DeepOBS's runs
(mean, min-max) and says at which epochs flatlab falls outside the published range.

DeepOBS's settings (from the baseline files): batch 128, constant learning rate, no weight decay,
100 epochs, on all 60,000 training images (DeepOBS 1.1 had no validation split: here ``val_size = 0``,
so ``val/*`` is the test split too and nothing is selected on it):

* ``sgd``: SGD, lr 0.15848931925 (10^-0.8), no momentum;
* ``momentum``: heavy ball, lr 0.0025118864315 (10^-2.6), momentum 0.99, not Nesterov (TensorFlow's
  MomentumOptimizer, the update of torch's SGD with momentum);
* ``adam``: Adam, lr 0.00025118864315 (10^-3.6), betas (0.9, 0.999), eps 1e-8 (``adamw`` with
  ``weight_decay = 0`` is Adam).

Differences that remain (see the reference file's notes): flatlab keeps the last incomplete batch
(469 steps per epoch, DeepOBS 468), evaluates all 10,000 test images (DeepOBS 9,984), initialises from
torch's RNG (the same distribution as DeepOBS, another stream: flatlab's seed 45 is not DeepOBS's seed 45,
only its label), and places Adam's epsilon before the bias correction (TensorFlow after).

Scales (``--scale``):

* ``paper`` (default; study ``deepobs_fmnist_2c2d``): 100 epochs, seeds 45, 47 and 50 (every seed the
  reference file holds: SGD 45 and 47, Momentum 45 and 50, Adam 45 and 47), on a GPU.
* ``cpu`` (study ``deepobs_fmnist_2c2d_cpu``): the first ``CPU_EPOCHS`` epochs of all three settings with
  seeds 45 and 47, two 1-core trials at a time: 12 trial-epochs of 469 steps, each about 105 CPU-seconds
  of training on one core, so about 15 minutes on 2 free cores and about 35 on 2 cores shared with
  other work. With a constant learning rate the published curves are comparable at every epoch, so this
  checks the start of each curve: test accuracy and loss after epochs 1 and 2 (DeepOBS: SGD 0.834 / 0.862
  after epoch 1 for seeds 45 / 47), not the end of training (0.92-0.93 after 100 epochs). Two seeds on
  each side: the published range is narrow and flatlab's 95 % interval wide (t with 1 degree of
  freedom), so read the per-seed values and the interval overlap, not only inside/outside.

Then: ``flatlab curves deepobs_fmnist_2c2d_cpu`` (``--format markdown`` for a report).
"""

from flatlab import Arm, Published, Resources, Study

SCALES = ("paper", "cpu")
CPU_EPOCHS = 2

ARMS = (
    Arm("sgd", name="sgd", space={"lr": 0.15848931925, "momentum": 0.0, "weight_decay": 0.0}),
    Arm(
        "sgd", name="momentum", space={"lr": 0.0025118864315, "momentum": 0.99, "nesterov": False, "weight_decay": 0.0}
    ),
    Arm(
        "adamw",
        name="adam",
        space={"lr": 0.00025118864315, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0},
    ),
)
REFERENCE = Published(
    "published/deepobs_fmnist_2c2d.json",
    arms={"sgd": "fmnist_2c2d/sgd", "momentum": "fmnist_2c2d/momentum", "adam": "fmnist_2c2d/adam"},
)


def build(scale: str) -> Study:
    paper = scale == "paper"
    return Study(
        name="deepobs_fmnist_2c2d" if paper else "deepobs_fmnist_2c2d_cpu",
        description="DeepOBS fmnist_2c2d baselines (SGD, Momentum, Adam at their tuned settings) "
        "beside the published curves",
        workload="fashion_mnist",
        workload_params={"model": "2c2d", "val_size": 0},
        train={"batch_size": 128, "schedule": "constant", "test_every_epoch": True},
        arms=ARMS,
        metric="val/accuracy",
        mode="max",
        searcher="grid",
        scheduler="fifo",
        max_epochs=100 if paper else CPU_EPOCHS,
        seeds=(45, 47, 50) if paper else (45, 47),
        resources=Resources(cpu=4, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 2,
        published=REFERENCE,
    )
