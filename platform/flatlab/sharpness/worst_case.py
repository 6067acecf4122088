"""Worst-case adaptive sharpness by projected gradient ascent.

Andriushchenko et al. 2023 ("A Modern Look at the Relationship between Sharpness and Generalization",
worst-case adaptive sharpness with ``c = |w|``); seed paper "In Search of the Successful Interpolation", App. A:

    S_max = max_{|| delta / c ||_p <= rho} L(w + delta) - L(w),   c = |w| (adaptive) or 1,  p in {2, inf}.

With ``delta = c * u`` the constraint is the ball ``||u||_p <= rho``. Starting from a random ``u_0`` on
the sphere of radius ``init_radius * rho`` (seeded), each of ``steps`` iterations takes the full-subset
gradient ``g_u = c * grad L(w + c * u)`` and moves

* ``l2``:   ``u <- Proj_{||u||_2 <= rho}(u + step_size * g_u / ||g_u||_2)`` (one norm over all tensors);
* ``linf``: ``u <- clip(u + step_size * sign(g_u), -rho, rho)``.

The result is the largest loss seen over the iterates (and ``delta = 0``), minus ``L(w)``: a lower bound
on the true maximum. Cost: ``steps`` forward+backward passes and ``2`` forward passes over the subset.
The model is never modified (``torch.func.functional_call``); ``.grad`` is never touched.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from flatlab.errors import ConfigError
from flatlab.sharpness import _state
from flatlab.sharpness.data import (
    DEFAULT_BATCH_SIZE,
    EvalData,
    EvalSubset,
    LossFn,
    as_subset,
    functional_forward,
    subset_loss,
    weighted_batches,
)
from flatlab.sharpness.results import WorstCaseSharpness

NORMS = ("l2", "linf")
DEFAULT_STEPS = 20


def _global_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(sum((t.double() ** 2).sum() for t in tensors))


def _project(u: List[torch.Tensor], rho: float, norm: str) -> List[torch.Tensor]:
    if norm == "linf":
        return [x.clamp(-rho, rho) for x in u]
    size = float(_global_norm(u))
    return [x * (rho / size) for x in u] if size > rho else u


def worst_case_sharpness(
    model: nn.Module,
    data: EvalData,
    *,
    rho: float,
    norm: str = "l2",
    steps: int = DEFAULT_STEPS,
    step_size: Optional[float] = None,
    init_radius: float = 0.5,
    adaptive: bool = True,
    params: Optional[Sequence[str]] = None,
    seed: int = 0,
    loss_fn: Optional[LossFn] = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> WorstCaseSharpness:
    """Worst-case adaptive sharpness (module docstring; Andriushchenko et al. 2023, worst-case
    adaptive sharpness).

    Args:
        model: evaluated in eval mode; not modified.
        data: the fixed evaluation subset (:func:`flatlab.sharpness.data.as_subset`).
        rho: radius in the rescaled coordinates ``u = delta / c`` (dimensionless when adaptive).
        norm: ``"l2"`` or ``"linf"``.
        steps: ascent steps (gradient evaluations over the whole subset), >= 1.
        step_size: ascent step length in ``u`` units; default ``2 * rho / sqrt(steps)``.
        init_radius: ``||u_0||_p / rho`` in [0, 1]; 0 starts at ``delta = 0`` (where the gradient
            vanishes at a minimum, so a random start is the default).
        adaptive, params, seed, loss_fn, batch_size: as :func:`~flatlab.sharpness.average_sharpness`.

    Returns:
        :class:`WorstCaseSharpness` with the loss of every iterate.

    Raises:
        ConfigError: unknown ``norm``, ``rho``/``step_size`` not finite and > 0, ``steps < 1``,
            ``init_radius`` outside [0, 1]. UnknownNameError: a name in ``params`` that does not exist.
    """
    if norm not in NORMS:
        raise ConfigError(f"norm={norm!r} is not allowed; expected one of {', '.join(map(repr, NORMS))}")
    rho = _state.check_positive("rho", rho)
    _state.check_count("steps", steps)
    eta = 2.0 * rho / steps**0.5 if step_size is None else _state.check_positive("step_size", step_size)
    if not isinstance(init_radius, (int, float)) or not 0.0 <= init_radius <= 1.0:
        raise ConfigError(f"init_radius must be in [0, 1]; got {init_radius!r}")
    subset = as_subset(data, batch_size)
    loss_fn = loss_fn or F.cross_entropy
    named = _state.resolve_params(model, params)
    names = [n for n, _ in named]
    device = _state.device_of(named)
    gen = _state.make_generator(device, seed)

    with _state.eval_mode(model):
        base = [p.detach() for _, p in named]
        scales = [b.abs() if adaptive else None for b in base]
        z = [_state.standard_normal(b, gen) for b in base]
        size = float(_global_norm(z)) if norm == "l2" else max(float(t.abs().max()) for t in z)
        u = [t * (init_radius * rho / max(size, 1e-30)) for t in z]

        def perturbed(us: Sequence[torch.Tensor]) -> dict:
            return {n: b + (x if s is None else s * x) for n, b, s, x in zip(names, base, scales, us)}

        clean = subset_loss(model, subset, loss_fn, device)
        losses: List[float] = []
        for _ in range(steps):
            loss, grads = loss_and_grad(model, subset, loss_fn, device, perturbed, u)
            losses.append(loss)
            with torch.no_grad():
                if norm == "l2":
                    g_norm = float(_global_norm(grads)) + 1e-12
                    u = [x + (eta / g_norm) * g for x, g in zip(u, grads)]
                else:
                    u = [x + eta * g.sign() for x, g in zip(u, grads)]
                u = _project(u, rho, norm)
        with torch.no_grad():
            losses.append(functional_loss(model, subset, loss_fn, device, perturbed(u)))
    return WorstCaseSharpness(max(clean, *losses) - clean, clean, tuple(losses), norm, rho, bool(adaptive))


def functional_loss(model: nn.Module, subset: EvalSubset, loss_fn: LossFn, device: torch.device, ps: dict) -> float:
    """Full-subset mean loss ``L`` (float64 sum of example-weighted batch losses) at the parameters ``ps``
    (``{name: tensor}``, :func:`~flatlab.sharpness.data.functional_forward`); the model is not modified."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for inputs, targets, weight in weighted_batches(subset, device):
        total += weight * loss_fn(functional_forward(model, ps, inputs), targets).double()
    return float(total)


def loss_and_grad(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, device: torch.device, perturbed, u: Sequence[torch.Tensor]
) -> Tuple[float, List[torch.Tensor]]:
    """Full-subset ``L(w + c*u)`` and its gradient with respect to ``u``, accumulated batch by batch."""
    us = [x.detach().requires_grad_(True) for x in u]
    grads = [torch.zeros_like(x) for x in us]
    total = torch.zeros((), dtype=torch.float64, device=device)
    for inputs, targets, weight in weighted_batches(subset, device):
        with torch.enable_grad():
            loss = loss_fn(functional_forward(model, perturbed(us), inputs), targets) * weight
            gs = torch.autograd.grad(loss, us, allow_unused=True)
        total += loss.detach().double()
        for acc, g in zip(grads, gs):
            if g is not None:
                acc += g
    return float(total), grads
