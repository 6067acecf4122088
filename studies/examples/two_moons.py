"""A user's own workload in a module of its own, next to the study file that imports it
(``studies/examples/extensions.py``): scikit-learn's two interleaving half circles, an MLP.

A workload is a :class:`flatlab.workloads.base.Workload` subclass registered with ``@register_workload``:
its ``name``, its hyperparameters (``hparams``: checked and shown by ``flatlab workloads``), the data it
loads once per study on the driver (``load_data``: train, val and test splits, deterministic in the
seed) and the model each trial builds (``build_model``). The loss (cross-entropy) and the metrics
(``loss`` and ``accuracy`` per split) are the base class's.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from flatlab.hparams import HParam
from flatlab.workloads.base import Data, Split, TrainDefaults, Workload
from flatlab.workloads.registry import register_workload


@register_workload
class TwoMoons(Workload):
    """Two interleaving half circles in the plane (``sklearn.datasets.make_moons``), 2 classes."""

    name = "two_moons"
    doc = "scikit-learn's two interleaving half circles with Gaussian noise, 2 classes (offline)"
    hparams = (
        HParam("n", 600, int, low=30, doc="points in all, split 60/20/20 into train/val/test"),
        HParam("noise", 0.2, float, low=0.0, doc="standard deviation of the Gaussian noise added to each point"),
        HParam("width", 32, int, low=1, doc="hidden units of the two-layer MLP"),
    )
    data_hparams = ("n", "noise")
    train_defaults = TrainDefaults(batch_size=32, schedule="cosine")

    def load_data(self, seed: int) -> Data:
        from sklearn.datasets import make_moons

        x, y = make_moons(n_samples=self.params["n"], noise=self.params["noise"], random_state=seed)
        order = np.random.default_rng(seed).permutation(len(y))
        x, y = torch.tensor(x[order], dtype=torch.float32), torch.tensor(y[order], dtype=torch.int64)  # (n, 2), (n,)
        a, b = int(0.6 * len(y)), int(0.8 * len(y))
        return Data(train=Split(x[:a], y[:a]), val=Split(x[a:b], y[a:b]), test=Split(x[b:], y[b:]))

    def build_model(self) -> nn.Module:
        w = self.params["width"]
        return nn.Sequential(
            nn.Linear(2, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 2)
        )  # (N, 2) -> (N, 2)
