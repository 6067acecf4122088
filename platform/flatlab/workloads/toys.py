"""The papers' toy losses as workloads: a trial optimises a closed-form loss of one or two parameters.

* ``toy/ire_fig1`` (IRE paper, Fig. 1): L(u, v) = (1 + u^2) v^2 / 2. Its minima are the line v = 0;
  the Hessian there is diag(0, 1 + u^2), so Tr(H) = 1 + u^2 (the paper's flatness measure) falls with
  |u|: IRE, which enlarges the step along the flat coordinate, should end at smaller |u|.
* ``toy/tsam_wave`` (TSAM paper, Fig. 1): L(theta) = 2 sin(4 pi theta) / (2 theta) + 0.005 (theta - 1)^2
  on (0.2, 2.5). Its local minima sit near 0.358, 0.868, 1.370, 1.872, 2.373 with L'' about 431, 181,
  115, 84, 67: the further right, the flatter.
* ``toy/tsam_kink``: L(theta) = |theta - 1| - 0.01 for theta <= 2, (theta - 3)^2 otherwise: a sharp
  global minimum at 1 (a kink, L = -0.01) and a flat one at 3 (L'' = 2, L = 0).

How a toy runs through the trainer: the "data" are ``steps_per_epoch`` dummy rows and the batch size is
1 (each epoch takes ``steps_per_epoch`` optimizer steps on the same loss); the model holds the
parameters (float64) and outputs the two logits (L, -L) per row; the training loss is the first. With
those logits, the sampled-label gradient of IRE's curvature pass is a non-zero multiple of grad L
(c = -2 p_1 or 2 p_0 with p = softmax(L, -L)), so IRE ranks coordinates by (grad L)^2, the proxy a
closed-form loss offers (there are no labels to sample), as tests/optim/test_ire.py does by hand.

Every epoch reports the iterate (the trial's trajectory, one point per ``steps_per_epoch`` steps, as
MLflow metric histories) and its flatness; a toy study asks for its figure (end point and flatness
against kappa or t, logged on its launch run) with ``reports={"toy_figure": {...}}``
(:func:`flatlab.reports.declared.toy_figure`).
"""

from __future__ import annotations

import math
from typing import Callable, ClassVar, Dict, List, Tuple, Union

import torch
from torch import nn

from flatlab.hparams import HParam
from flatlab.workloads.base import Data, Split, TrainDefaults, Workload
from flatlab.workloads.registry import register_workload

BASIN_RADIUS = 0.1  # r of the TSAM toys' basin_sharpness, (L(m + r) + L(m - r)) / 2 - L(m)

LossFn = Callable[[torch.Tensor], torch.Tensor]


def ire_valley(p: torch.Tensor) -> torch.Tensor:
    """IRE Fig. 1: ``(1 + u^2) v^2 / 2`` of ``p = (u, v)``, shape ``(2,)`` -> scalar."""
    return 0.5 * (1 + p[0] ** 2) * p[1] ** 2


def tsam_wave(p: torch.Tensor) -> torch.Tensor:
    """TSAM Fig. 1: ``2 sin(4 pi theta) / (2 theta) + 0.005 (theta - 1)^2`` of ``p = (theta,)``."""
    th = p[0]
    return torch.sin(4 * math.pi * th) / th + 0.005 * (th - 1) ** 2


def tsam_kink(p: torch.Tensor) -> torch.Tensor:
    """TSAM's second toy: ``|theta - 1| - 0.01`` for ``theta <= 2``, ``(theta - 3)^2`` otherwise."""
    th = p[0]
    return torch.where(th <= 2, (th - 1).abs() - 0.01, (th - 3) ** 2)


class ToyModel(nn.Module):
    """The toy's parameters ``theta`` ``(d,)`` float64; ``forward(x)`` -> ``(N, 2)`` logits (L, -L), one
    row per input row (the rows' content is ignored)."""

    def __init__(self, start: Tuple[float, ...], loss_fn: LossFn) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(start, dtype=torch.float64))
        self.loss_fn = loss_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value = self.loss_fn(self.theta)
        return torch.stack([value, -value]).expand(x.shape[0], 2)


def _dummy(n: int) -> Split:
    return Split(torch.zeros(n, 1, dtype=torch.float64), torch.zeros(n, dtype=torch.long))


class _Toy(Workload):
    """Shared mechanics of the toys (module docstring). Subclasses set ``loss_fn`` and ``start()``."""

    data_hparams = ("steps_per_epoch",)
    train_defaults = TrainDefaults(batch_size=1, schedule="constant", warmup_epochs=0.0, label_smoothing=0.0)
    loss_fn: ClassVar[LossFn]
    loss_support = None  # tsam_wave and tsam_kink go below zero
    smoke_params: ClassVar[Dict[str, object]] = {}

    def start(self) -> Tuple[float, ...]:
        raise NotImplementedError

    def load_data(self, seed: int) -> Data:
        """``steps_per_epoch`` dummy training rows (one optimizer step each at batch size 1), one val row."""
        return Data(train=_dummy(int(self.params["steps_per_epoch"])), val=_dummy(1))

    def build_model(self) -> nn.Module:
        return ToyModel(self.start(), type(self).loss_fn)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        """The toy loss L(theta): the first logit of any row (all rows are equal)."""
        return outputs[..., 0].mean()

    def batch_stats(self, outputs: torch.Tensor, targets: torch.Tensor) -> Tuple[Union[int, torch.Tensor], int]:
        return 0, 0  # no accuracy

    def point(self, model: nn.Module) -> torch.Tensor:
        return model.theta.detach().clone()  # type: ignore[union-attr]


@register_workload
class IREValley(_Toy):
    """IRE paper, Fig. 1: L(u, v) = (1 + u^2) v^2 / 2 from ``(u0, v0)`` (module docstring)."""

    name = "toy/ire_fig1"
    doc = "IRE Fig. 1 toy: L(u, v) = (1+u^2) v^2/2, minima v = 0 with Tr(H) = 1 + u^2"
    loss_fn = staticmethod(ire_valley)
    hparams = (
        HParam("u0", 0.95, float, doc="start u (flat coordinate)"),
        HParam("v0", 0.3, float, doc="start v (sharp coordinate); GD with lr 1 is stable while 1 + u^2 < 2"),
        HParam("steps_per_epoch", 10, int, low=1, high=100_000, doc="optimizer steps per reported epoch"),
    )
    metrics = (
        "train/loss",
        "val/loss",
        "val/u",
        "val/v",
        "val/abs_u",
        "val/trace_hessian",
        "lr",
        "epoch",
        "time/epoch_s",
    )

    def start(self) -> Tuple[float, ...]:
        return (self.params["u0"], self.params["v0"])

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: Split, batch_size: int = 512) -> Dict[str, float]:
        """``loss`` L(u, v), the iterate ``u``, ``v``, ``abs_u`` and ``trace_hessian`` = Tr(grad^2 L) =
        1 + u^2 + v^2 (the IRE paper's flatness measure, exact here)."""
        u, v = (float(x) for x in self.point(model))
        return {"loss": 0.5 * (1 + u * u) * v * v, "u": u, "v": v, "abs_u": abs(u), "trace_hessian": 1 + u * u + v * v}


class _TSAMToy(_Toy):
    """A 1-D TSAM toy: each epoch reports ``theta``, its running tail mean and the basin it lies in."""

    metrics = (
        "train/loss",
        "val/loss",
        "val/theta",
        "val/theta_tail",
        "val/basin",
        "val/basin_loss",
        "val/basin_curvature",
        "val/basin_sharpness",
        "lr",
        "epoch",
        "time/epoch_s",
    )
    common = (
        HParam("steps_per_epoch", 4, int, low=1, high=100_000, doc="optimizer steps per reported epoch"),
        HParam("tail", 25, int, low=1, high=100_000, doc="epochs whose end points the tail mean averages"),
    )

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        self._ends: List[float] = []  # this trial's epoch-end iterates (evaluate is called once per epoch)

    def start(self) -> Tuple[float, ...]:
        return (self.params["theta0"],)

    def basin(self, theta: float) -> float:
        """The local minimum that gradient descent with a small step reaches from ``theta``."""
        raise NotImplementedError

    def _loss_at(self, theta: float) -> float:
        return float(type(self).loss_fn(torch.tensor([theta], dtype=torch.float64)))

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: Split, batch_size: int = 512) -> Dict[str, float]:
        """``loss`` and ``theta`` at the iterate; ``theta_tail``: the mean of the last ``tail`` epoch-end
        iterates (the iterate keeps bouncing when rho is a large share of the distance between minima);
        ``basin``: the minimum gradient descent reaches from ``theta_tail``, its ``basin_loss``,
        ``basin_curvature`` (central difference, h = 1e-4; 2/h at a kink) and ``basin_sharpness`` =
        (L(m + r) + L(m - r)) / 2 - L(m), r = ``BASIN_RADIUS`` = 0.1."""
        theta = float(self.point(model)[0])
        self._ends.append(theta)
        tail = sum(self._ends[-self.params["tail"] :]) / len(self._ends[-self.params["tail"] :])
        m = self.basin(tail)
        h, r = 1e-4, BASIN_RADIUS
        lm = self._loss_at(m)
        return {
            "loss": self._loss_at(theta),
            "theta": theta,
            "theta_tail": tail,
            "basin": m,
            "basin_loss": lm,
            "basin_curvature": (self._loss_at(m + h) - 2 * lm + self._loss_at(m - h)) / h**2,
            "basin_sharpness": 0.5 * (self._loss_at(m + r) + self._loss_at(m - r)) - lm,
        }


@register_workload
class TSAMWave(_TSAMToy):
    """TSAM paper, Fig. 1: L(theta) = 2 sin(4 pi theta) / (2 theta) + 0.005 (theta - 1)^2 (module docstring)."""

    name = "toy/tsam_wave"
    doc = "TSAM Fig. 1 toy: 2 sin(4 pi theta)/(2 theta) + 0.005 (theta-1)^2; minima flatter to the right"
    loss_fn = staticmethod(tsam_wave)
    hparams = (HParam("theta0", 0.5, float, low=0.2, high=2.5, doc="start (paper: 0.5)"),) + _TSAMToy.common

    def basin(self, theta: float) -> float:
        th = theta
        for _ in range(4000):  # step 2e-4: stable for L'' < 1e4, converged for the minima's L'' >= 67
            a = 4 * math.pi * th
            th -= 2e-4 * ((a * math.cos(a) - math.sin(a)) / th**2 + 0.01 * (th - 1))  # L'(theta)
        return th


@register_workload
class TSAMKink(_TSAMToy):
    """TSAM's second toy: a sharp minimum at 1 (a kink) and a flat one at 3 (module docstring)."""

    name = "toy/tsam_kink"
    doc = "TSAM toy: |theta-1| - 0.01 for theta <= 2, (theta-3)^2 otherwise; sharp minimum 1, flat minimum 3"
    loss_fn = staticmethod(tsam_kink)
    hparams = (HParam("theta0", 2.2, float, doc="start"),) + _TSAMToy.common

    def basin(self, theta: float) -> float:
        return 1.0 if theta <= 2 else 3.0  # each piece has one minimum
