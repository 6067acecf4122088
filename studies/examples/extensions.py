"""Bring your own optimizer, flatness measure and workload: Lion against SGD on two moons, with the
parameter norm measured on each final model.

The optimizer and the measure are defined here, in the study file; the workload in a module next to it
(``two_moons.py``), imported as any module is. ``flatlab run studies/examples/extensions.py`` runs them
on the trials' processes too, on this machine or on a cluster (``--address``, ``flatlab submit``).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

import torch
from torch import nn
from two_moons import TwoMoons  # noqa: F401  (the module next to this file registers workload "two_moons")

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.hparams import HParam
from flatlab.optim.registry import common, register_optimizer
from flatlab.sharpness.measures import register_measure


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2): per step,
    ``c = beta1 * m + (1 - beta1) * g``, ``theta -= lr * (sign(c) + weight_decay * theta)``,
    ``m = beta2 * m + (1 - beta2) * g`` (``m``: the gradient's moving average, zero at first)."""

    def __init__(self, params: Any, lr: float, weight_decay: float, beta1: float, beta2: float) -> None:
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, beta1=beta1, beta2=beta2))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                c = m.mul(group["beta1"]).add_(p.grad, alpha=1 - group["beta1"])
                p.add_(c.sign_().add_(p, alpha=group["weight_decay"]), alpha=-group["lr"])
                m.mul_(group["beta2"]).add_(p.grad, alpha=1 - group["beta2"])
        return loss


@register_optimizer(
    name="lion",
    doc="Lion: the sign of an interpolated momentum (Chen et al. 2023, Algorithm 2)",
    hparams=common(
        HParam("beta1", 0.9, float, low=0.0, high=1.0, doc="interpolation of the update"),
        HParam("beta2", 0.99, float, low=0.0, high=1.0, doc="decay of the moving average"),
        lr_default=1e-4,
    ),
)
def build_lion(params: Any, *, lr: float, weight_decay: float, beta1: float, beta2: float) -> Lion:
    return Lion(params, lr=lr, weight_decay=weight_decay, beta1=beta1, beta2=beta2)


@register_measure(
    name="param_norm",
    doc="Euclidean norm of all the model's parameters (parameter units)",
    source="the parameter norm of Jiang et al. 2020, Fantastic Generalization Measures and Where to Find Them",
    metrics=("flat/param_norm",),
)
def param_norm(model: nn.Module, subset: Any, loss_fn: Any, params: Mapping[str, Any], seed: int) -> Dict[str, float]:
    return {"flat/param_norm": float(torch.sqrt(sum((p.detach().double() ** 2).sum() for p in model.parameters())))}


STUDY = Study(
    name="extensions_demo",
    workload="two_moons",
    workload_params={"n": 400, "width": 16},
    arms=(
        Arm("sgd", space={"lr": sp.loguniform(0.01, 0.3)}),
        Arm("lion", space={"lr": sp.loguniform(1e-4, 3e-3), "weight_decay": 0.01}),
    ),
    num_trials=2,
    max_epochs=4,
    scheduler="fifo",
    measures={"param_norm": {}},
)
