"""``digits``: scikit-learn's bundled handwritten digits (UCI), 1,797 8x8 grey images, 10 classes.

Real data shipped inside scikit-learn, so it needs no download: the default workload for laptops,
CI and demos. Split: stratified train/val/test (60/20/20 by default), fixed by the study seed. Pixels
are scaled from [0, 16] to [0, 1]. Models: an MLP and a small CNN with BatchNorm.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch
from torch import nn

from flatlab.hparams import HParam
from flatlab.lazy import lazy
from flatlab.workloads.base import Data, Split, TrainDefaults, Workload
from flatlab.workloads.registry import register_workload

sklearn_datasets = lazy("sklearn.datasets")  # scikit-learn loads in about a second


def stratified_split(
    targets: np.ndarray, fractions: Tuple[float, float], seed: int
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of a stratified (train, val, test) split; ``fractions`` = (val, test) shares of each class.

    Deterministic in ``seed``; every class is split in the same proportions.
    """
    rng = np.random.default_rng(seed)
    tr, va, te = [], [], []
    for c in np.unique(targets):
        idx = rng.permutation(np.flatnonzero(targets == c))
        n_val = int(round(fractions[0] * len(idx)))
        n_test = int(round(fractions[1] * len(idx)))
        va.append(idx[:n_val])
        te.append(idx[n_val : n_val + n_test])
        tr.append(idx[n_val + n_test :])
    return tuple(np.sort(np.concatenate(parts)) for parts in (tr, va, te))  # type: ignore[return-value]


class DigitsMLP(nn.Module):
    """MLP on flattened 8x8 images: ``(N, 1, 8, 8)`` -> ``(N, 10)`` logits."""

    def __init__(self, width: int = 128, depth: int = 2) -> None:
        super().__init__()
        layers = [nn.Flatten()]
        d_in = 64
        for _ in range(depth):
            layers += [nn.Linear(d_in, width), nn.ReLU()]
            d_in = width
        layers.append(nn.Linear(d_in, 10))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class DigitsCNN(nn.Module):
    """Small CNN with BatchNorm: ``(N, 1, 8, 8)`` -> ``(N, 10)`` logits; ``width`` channels."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),  # (N, w, 8, 8)
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),  # (N, 2w, 4, 4)
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@register_workload
class Digits(Workload):
    """scikit-learn digits classification (10 classes); metric ``val/accuracy`` (max)."""

    name = "digits"
    doc = "scikit-learn's bundled handwritten digits, 1,797 8x8 images, 10 classes (offline, real data)"
    hparams = (
        HParam("model", "mlp", str, choices=("mlp", "cnn"), doc="network: MLP or small CNN with BatchNorm"),
        HParam("width", 128, int, low=1, doc="hidden units (MLP) or base channels (CNN)"),
        HParam("depth", 2, int, low=1, doc="hidden layers of the MLP"),
        HParam(
            "val_fraction",
            0.2,
            float,
            low=0.0,
            high=0.5,
            low_open=True,
            doc="share of each class held out for validation",
        ),
        HParam(
            "test_fraction", 0.2, float, low=0.0, high=0.5, low_open=True, doc="share of each class held out for test"
        ),
    )
    train_defaults = TrainDefaults(batch_size=64, schedule="cosine")
    data_hparams = ("val_fraction", "test_fraction")

    def load_data(self, seed: int) -> Data:
        bunch = sklearn_datasets.load_digits()
        x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]  # (1797, 1, 8, 8) in [0, 1]
        y = bunch.target.astype(np.int64)
        tr, va, te = stratified_split(y, (self.params["val_fraction"], self.params["test_fraction"]), seed)

        def split(idx: np.ndarray) -> Split:
            return Split(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))

        return Data(train=split(tr), val=split(va), test=split(te), meta={"split_seed": seed, "n": len(y)})

    def build_model(self) -> nn.Module:
        if self.params["model"] == "cnn":
            return DigitsCNN(self.params["width"])
        return DigitsMLP(self.params["width"], self.params["depth"])
