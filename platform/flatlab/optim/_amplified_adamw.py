"""AdmIRE's amplified step computed inside AdamW's own update, with no copy of θ (CPU AdamW).

IRE's update over a base optimizer is θ ← θ_old + (1 + κ·n) ⊙ Δ, Δ = θ_new − θ_old the base's step
(Wang et al., NeurIPS 2024, practical IRE; :mod:`flatlab.optim.ire`). Over any base, IRE keeps a copy of
θ_old and blends after the base's step. For AdamW (Loshchilov & Hutter 2019, Alg. 2, decoupled weight
decay) Δ is known in closed form,

    Δ = −lr·wd·θ_old − (lr / bc1) · m / (√v / √bc2 + ε),   bc1 = 1 − β1^t, bc2 = 1 − β2^t,

so (1 + κ·n)⊙Δ is AdamW's own update with the decay factor and the denominator scaled on the flat
coordinates:

    θ ← θ_old · (1 − lr·wd) · (1 + n·(c_κ − 1)),     c_κ = (1 − lr·wd·(1+κ)) / (1 − lr·wd)
    θ ← θ − (lr / bc1) · m / (d · (1 − n·κ/(1+κ))),   d = √v / √bc2 + ε

This module runs exactly the operations of torch's single-tensor AdamW (``torch.optim.adam``,
``_single_tensor_adam``: the same kernels in the same order, the same temporaries) plus two
``addcmul_`` passes reading n as a 0/1 float tensor. Where n = 0 these add an exact zero, so those
coordinates, and the moments m and v everywhere, are bit for bit torch's AdamW; flat coordinates equal
θ_old + (1+κ)·Δ to rounding (a few ulp, as the copy-and-blend differs from exact arithmetic too).

It is used only where torch's AdamW itself would run its single-tensor loop (CPU tensors, or
``foreach=False``) with the plain options; everywhere else (CUDA's multi-tensor and fused kernels,
amsgrad, maximize, capturable, differentiable, tensor hyperparameters, step hooks, complex or sparse
tensors, state other than torch's) IRE copies θ and blends as over any base. A parameter's first step
initialises AdamW's state here as torch's ``Adam._init_group`` does for these options.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch.optim import optimizer as _torch_optimizer

__all__ = ["applies", "amplified_adamw_step"]

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
    initialises it as torch does) or exactly torch's (``step``, ``exp_avg``, ``exp_avg_sq``), and
    lr·wd ≠ 1. Checked on the gradients present, so call it after the closure has run.
    """
    if type(base) is not torch.optim.AdamW or _hooks_registered(base):
        return False
    for group in base.param_groups:
        if any(group.get(flag) for flag in _PLAIN_FLAGS) or not group.get("decoupled_weight_decay", True):
            return False
        if any(isinstance(v, torch.Tensor) for v in (group["lr"], group["weight_decay"], group["eps"], *group["betas"])):
            return False
        if group["lr"] * group["weight_decay"] == 1:  # the plain decay zeroes θ; the flat part cannot be scaled from 0
            return False
        params = [p for p in group["params"] if p.grad is not None]
        if group.get("foreach") is True or (group.get("foreach") is None and any(p.device.type != "cpu" for p in params)):
            return False
        for p in params:
            if p.is_complex() or p.grad.is_sparse:
                return False
            state = base.state.get(p)
            if state and (set(state) != _STATE_KEYS or not isinstance(state["step"], torch.Tensor)):
                return False
    return True


@torch.no_grad()
def amplified_adamw_step(base: torch.optim.Optimizer, flat: Mapping[torch.Tensor, torch.Tensor], kappas: Sequence[float]) -> None:
    """One AdamW step of ``base`` with the flat coordinates' step amplified (1 + κ)× (module doc).

    Args:
        base: a ``torch.optim.AdamW`` for which :func:`applies` is True; its gradients are in ``p.grad``.
        flat: parameter -> n, 0/1 in the parameter's dtype and shape (1 = flat). A parameter missing
            here takes the plain AdamW step.
        kappas: κ_t ≥ 0 per parameter group (dimensionless); 0 gives the plain AdamW step.
    Updates the parameters and ``base.state`` (``step``, ``exp_avg``, ``exp_avg_sq``) in place, as
    ``base.step()`` would; parameters without a gradient are left alone, as torch does.
    Raises:
        ValueError: ``len(kappas)`` differs from the number of parameter groups.
    """
    if len(kappas) != len(base.param_groups):
        raise ValueError(f"amplified_adamw_step: {len(kappas)} kappas for {len(base.param_groups)} parameter groups")
    for group, kappa in zip(base.param_groups, kappas):
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        decay = 1 - lr * wd
        amplify = kappa > 0
        # the flat coordinates' decay as a multiple of the plain one's result (decay ≠ 0: see applies)
        extra_decay = (1 - lr * wd * (1 + kappa)) / decay - 1 if wd != 0 and amplify else 0.0
        shrink = -kappa / (1 + kappa)
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
            n = flat.get(p) if amplify else None
            step_t += 1
            if wd != 0:
                p.mul_(decay)
                if n is not None:
                    p.addcmul_(p, n, value=extra_decay)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = step_t.item()
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            step_size = lr / bias_correction1
            denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
            if n is not None:
                denom.addcmul_(denom, n, value=shrink)
            p.addcdiv_(exp_avg, denom, value=-step_size)
