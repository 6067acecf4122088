"""The TSAM paper's three image settings, shared by the TSAM study files (Table 1, Table 3, Fig. 4).

Not a study file (``flatlab studies`` skips names that start with ``_``). Each :class:`Setting` gives the
workload and its parameters at paper scale and at smoke scale, the epochs (ours: 200 for CIFAR-100 from
scratch, 30 for DTD fine-tuning) and the paper's best t there (20 on CIFAR-100 / ResNet-18, 5 on DTD /
ViT, 1 on CIFAR-100 with 20 % label noise) and its training rows per epoch at each scale (the compute-matched
baselines' pass budgets follow from them). Data parameters (``label_noise``) are study-level: the data
are loaded once per study, so they never go in an arm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

SMALL = {"data_path": "synthetic", "synthetic_size": 32, "width_mult": 1 / 16}


@dataclass(frozen=True)
class Setting:
    """One of the paper's image settings: ``name`` (the study-name suffix), ``workload``, its parameters at
    paper scale (``paper``) and smoke scale (``smoke``), ``epochs`` at paper scale, the paper's best ``t``, and
    ``rows``: training examples per epoch at (paper, smoke) scale, the training split less the workload's
    ``val_size`` hold-out (CIFAR-100: 50,000 - 5,000; DTD: the hub's 3,760 training images - 376; smoke: the
    synthetic training images)."""

    name: str
    workload: str
    paper: Dict[str, Any]
    smoke: Dict[str, Any]
    epochs: int
    best_t: float
    rows: Tuple[int, int]


SETTINGS = (
    Setting("cifar100", "cifar100", {"model": "resnet18"}, {"model": "resnet18", **SMALL}, 200, 20.0, (45_000, 32)),
    Setting(
        "dtd",
        "dtd",
        {"model": "vit_small_patch16_224.augreg_in21k_ft_in1k", "pretrained": True},
        {
            "model": "vit_tiny_patch16_224",
            "pretrained": False,
            "image_size": 32,
            "data_path": "synthetic",
            "synthetic_size": 47,
        },
        30,
        5.0,
        (3_384, 47),
    ),
    Setting(
        "cifar100_noisy",
        "cifar100",
        {"model": "resnet18", "label_noise": 0.2},
        {"model": "resnet18", "label_noise": 0.2, **SMALL},
        200,
        1.0,
        (45_000, 32),
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}
