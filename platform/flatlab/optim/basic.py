"""Base optimizers: SGD (momentum, Nesterov) and AdamW, as registered entries over torch's own."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.optim.registry import OptimizerSpec, common, register_optimizer

MOMENTUM = HParam("momentum", 0.9, float, low=0.0, high=1.0, high_open=True, doc="heavy-ball momentum")
NESTEROV = HParam("nesterov", False, bool, doc="Nesterov momentum (needs momentum > 0)")
SGD_HPARAMS = common(MOMENTUM, NESTEROV, lr_default=0.1)

BETA1 = HParam("beta1", 0.9, float, low=0.0, high=1.0, high_open=True, doc="Adam first-moment decay")
BETA2 = HParam("beta2", 0.999, float, low=0.0, high=1.0, high_open=True, doc="Adam second-moment decay")
EPS = HParam("eps", 1e-8, float, low=0.0, low_open=True, doc="Adam denominator epsilon")
ADAMW_HPARAMS = common(BETA1, BETA2, EPS, lr_default=1e-3)


def build_sgd(
    params: Iterable[Any], *, lr: float, weight_decay: float, momentum: float, nesterov: bool
) -> torch.optim.SGD:
    """``torch.optim.SGD``; Nesterov with zero momentum is rejected by torch with a ValueError."""
    if nesterov and momentum <= 0:
        raise ConfigError(f"sgd: nesterov=True needs momentum > 0, got momentum={momentum}")
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)


def build_adamw(
    params: Iterable[Any], *, lr: float, weight_decay: float, beta1: float, beta2: float, eps: float
) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` (decoupled weight decay, Loshchilov & Hutter 2019)."""
    return torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)


# Module-level names so that wrappers (sam.py, tsam.py, ire.py) compose these entries without a registry
# lookup at import time.
SGD_SPEC = register_optimizer(OptimizerSpec("sgd", SGD_HPARAMS, build_sgd, doc="SGD with momentum / Nesterov (torch)"))
ADAMW_SPEC = register_optimizer(
    OptimizerSpec("adamw", ADAMW_HPARAMS, build_adamw, doc="AdamW, decoupled weight decay (torch)")
)
