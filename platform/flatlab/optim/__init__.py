"""Optimizers: the step protocol, the registry, and the papers' optimizers (SAM, ASAM, TSAM, IRE)."""

from flatlab.optim.protocol import Closure, Progress, as_closure, frozen_bn_stats
from flatlab.optim.registry import OPTIMIZERS, OptimizerSpec, get_optimizer, register_optimizer

__all__ = [
    "Closure",
    "Progress",
    "as_closure",
    "frozen_bn_stats",
    "OPTIMIZERS",
    "OptimizerSpec",
    "get_optimizer",
    "register_optimizer",
]
