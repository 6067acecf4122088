"""AdmIRE's amplified step computed inside AdamW's own update, with no copy of θ (CPU AdamW).

IRE's update θ ← θ_old + (1 + κ·n) ⊙ Δ (:mod:`flatlab.optim.ire`) over AdamW (Loshchilov & Hutter 2019,
Alg. 2) is AdamW's own update with, per coordinate, the decay and the denominator scaled by
s = 1 + κ·n, the denominator taken in Kingma & Ba's efficient order (Adam, ICLR 2015, §2):

    θ ← θ_old − c · s ⊙ θ_old,          c = 1 − fl(1 − lr·wd), the decay torch's AdamW applies
    θ ← θ − α_t · m / ((√v + ε̂) / s),   α_t = lr·√bc2 / bc1,   ε̂ = ε·√bc2

as many passes over a parameter as torch's single-tensor AdamW (eight), one temporary where it holds
two, and one buffer (s). The moments are AdamW's bit for bit; coordinates off the mask are within two
ulps of torch's AdamW plus a few machine epsilons of their step; κ = 0 is torch's step bit for bit.
Used only where torch's AdamW would run its single-tensor loop with the plain options
(:func:`applies`); elsewhere IRE copies θ and blends. Derivation, pass count and fidelity:
``docs/algorithms/ire.md`` (AdmIRE over CPU AdamW).
"""

from __future__ import annotations

import struct
from typing import Mapping

import torch
from torch.optim import optimizer as _torch_optimizer

__all__ = ["applies", "applied_decay", "amplified_adamw_step"]

_PLAIN_FLAGS = ("amsgrad", "maximize", "capturable", "differentiable", "fused")
_STATE_KEYS = {"step", "exp_avg", "exp_avg_sq"}


def _hooks_registered(base: torch.optim.Optimizer) -> bool:
    for name in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"):
        if getattr(base, name, None):
            return True
    for name in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
        if getattr(_torch_optimizer, name, None):
            return True
    return False


def applies(base: torch.optim.Optimizer) -> bool:
    """Whether :func:`amplified_adamw_step` may replace ``base.step()`` for the step about to run.

    True when ``base`` is exactly ``torch.optim.AdamW`` with no step hooks, every group has float
    hyperparameters and none of amsgrad / maximize / capturable / differentiable / fused, torch would
    run its single-tensor loop (``foreach=False``, or ``foreach=None`` with every parameter on the CPU),
    every parameter that has a gradient is a real dense tensor whose AdamW state is empty (the step
    initialises it as torch does) or exactly torch's (``step``, ``exp_avg``, ``exp_avg_sq``). Checked on
    the gradients present, so call it after the closure has run.
    """
    if type(base) is not torch.optim.AdamW or _hooks_registered(base):
        return False
    for group in base.param_groups:
        if any(group.get(flag) for flag in _PLAIN_FLAGS) or not group.get("decoupled_weight_decay", True):
            return False
        if any(
            isinstance(v, torch.Tensor) for v in (group["lr"], group["weight_decay"], group["eps"], *group["betas"])
        ):
            return False
        params = [p for p in group["params"] if p.grad is not None]
        if group.get("foreach") is True or (
            group.get("foreach") is None and any(p.device.type != "cpu" for p in params)
        ):
            return False
        for p in params:
            if p.is_complex() or p.grad.is_sparse:
                return False
            state = base.state.get(p)
            if state and (set(state) != _STATE_KEYS or not isinstance(state["step"], torch.Tensor)):
                return False
    return True


def applied_decay(lr: float, weight_decay: float, dtype: torch.dtype) -> float:
    """c = 1 − fl(1 − lr·wd): the decay torch's single-tensor AdamW applies to a parameter of ``dtype``
    (it multiplies θ by the Python float 1 − lr·wd, which the CPU kernel rounds to its arithmetic type:
    float64 for float64 tensors, float32 otherwise). Exact in that type (Sterbenz) and as a Python float."""
    factor = 1 - lr * weight_decay
    if dtype != torch.float64:
        factor = struct.unpack("f", struct.pack("f", factor))[0]  # round to nearest float32
    return 1 - factor


@torch.no_grad()
def amplified_adamw_step(base: torch.optim.Optimizer, scales: Mapping[torch.Tensor, torch.Tensor]) -> None:
    """One AdamW step of ``base`` with each coordinate's step multiplied by ``s`` (module docstring).

    Args:
        base: a ``torch.optim.AdamW`` for which :func:`applies` is True; its gradients are in ``p.grad``.
        scales: parameter -> s = 1 + κ·n, in the parameter's dtype and shape (1: the coordinate's plain
            AdamW step; 1 + κ: a flat coordinate's, amplified). A parameter missing here takes the plain
            AdamW step, computed as torch computes it.
    Updates the parameters and ``base.state`` (``step``, ``exp_avg``, ``exp_avg_sq``) in place, as
    ``base.step()`` would; parameters without a gradient are left alone, as torch does.
    Raises:
        ValueError: a scale whose shape or dtype differs from its parameter's.
    """
    for group in base.param_groups:
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            state = base.state[p]
            if not state:  # AdamW's lazy initialisation, as torch writes it for these options
                scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
                state["step"] = torch.tensor(0.0, dtype=scalar, device="cpu")
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
            s = scales.get(p)
            if s is not None and (s.shape != p.shape or s.dtype != p.dtype):
                raise ValueError(
                    f"amplified_adamw_step: scale {tuple(s.shape)} {s.dtype} for a parameter "
                    f"{tuple(p.shape)} {p.dtype}; expected the parameter's shape and dtype"
                )
            step_t += 1
            if wd != 0:
                if s is None:
                    p.mul_(1 - lr * wd)
                else:  # θ − c·s⊙θ: AdamW's decay c, times s
                    p.addcmul_(p, s, value=-applied_decay(lr, wd, p.dtype))
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = step_t.item()
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            if s is None:  # torch's arithmetic
                denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
                p.addcdiv_(exp_avg, denom, value=-(lr / bias_correction1))
            else:  # Adam's efficient order (module docstring): ÷s takes the pass of ÷√bc2
                root = bias_correction2**0.5
                denom = exp_avg_sq.sqrt().add_(eps * root).div_(s)
                p.addcdiv_(exp_avg, denom, value=-(lr * root / bias_correction1))
