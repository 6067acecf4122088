"""The three training objectives of the TSAM paper, evaluated on a fixed subset (TSAM paper, §5.2, Table 2).

"Reweighting Local Minima with Tilted SAM" takes the models trained by ERM, SAM and TSAM and evaluates
each of them on each objective, on the training and on the test set:

* ERM: ``L(theta)``, the mean loss over the subset (:func:`~flatlab.sharpness.data.subset_loss`).
* SAM: ``max_{||eps||_2 <= rho} L(theta + eps)`` (one global L2 norm over every parameter), estimated by
  SAM's ascent (Foret et al. 2021): ``eps = rho * g / (||g||_2 + 1e-12)`` with ``g`` the full-subset
  gradient at ``theta``, i.e. :func:`~flatlab.sharpness.worst_case.worst_case_sharpness` with ``c = 1``,
  a start at ``delta = 0`` and one step of length ``rho``; ``steps > 1`` runs projected ascent within the
  same ball (a tighter lower bound on the maximum). At a stationary point (``g = 0``: an exact minimum,
  or a kink where autograd takes the subgradient 0) that ascent cannot leave ``theta``; ``init_radius > 0``
  starts instead from a random point at ``init_radius * rho`` (seeded by ``seed``). The value is the
  largest loss seen (``delta = 0`` included), so ``>= L(theta)``.
* TSAM: ``L^t(theta) = (1/t) log E_eps[exp(t L(theta + eps))]``, estimated as the optimizer does it
  (ALGORITHMS.md §2, the released procedure): for ``j = 1..s``, ``delta_j`` from the optimizer's own
  :func:`~flatlab.optim.tsam.sample_noise` (radius ``noise_radius``, ``gaussian`` or ``uniform``, global
  norm), the full-subset gradient ``g_j`` at ``theta + delta_j``, ``eps_j = delta_j + rho * g_j / (||g_j||_2
  + 1e-12)``, ``L_j = L(theta + eps_j)``; then the stabilised log-mean-exp
  ``m + (1/t) log((1/s) sum_j exp(t (L_j - m)))``, ``m = max_j L_j`` (``t = 0``: the mean of the ``L_j``).

Both run in eval mode on the full subset (no mini-batch noise), never modify the model
(``torch.func.functional_call``) and are reproducible: the draws of ``delta_j`` come from the global torch
RNG seeded with ``seed`` inside :func:`torch.random.fork_rng` (the caller's RNG state is restored). Cost:
SAM ``steps`` forward+backward passes and 2 forward passes; TSAM ``s`` forward+backward and ``s + 1``
forward passes. Units: the loss's (nats for cross-entropy).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.optim.tsam import sample_noise
from flatlab.ranges import LOSS
from flatlab.sharpness import _state
from flatlab.sharpness.data import DEFAULT_BATCH_SIZE, EvalData, EvalSubset, LossFn, as_subset, subset_loss
from flatlab.sharpness.registry import FloatList, register_measure, sweep_key
from flatlab.sharpness.results import ObjectiveValue
from flatlab.sharpness.worst_case import functional_loss, loss_and_grad, worst_case_sharpness

NOISES = ("gaussian", "uniform")


def erm_objective(
    model: nn.Module, data: EvalData, *, loss_fn: Optional[LossFn] = None, batch_size: int = DEFAULT_BATCH_SIZE
) -> ObjectiveValue:
    """``L(theta)``: the mean loss over ``data`` in eval mode (TSAM paper, Table 2's ERM objective)."""
    subset = as_subset(data, batch_size)
    named = _state.resolve_params(model, None)
    with _state.eval_mode(model):
        clean = subset_loss(model, subset, loss_fn or F.cross_entropy, _state.device_of(named))
    return ObjectiveValue(clean, clean, (clean,))


def sam_objective(
    model: nn.Module,
    data: EvalData,
    *,
    rho: float,
    steps: int = 1,
    init_radius: float = 0.0,
    seed: int = 0,
    loss_fn: Optional[LossFn] = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> ObjectiveValue:
    """SAM's objective ``max_{||eps||_2 <= rho} L(theta + eps)`` (module docstring; Foret et al. 2021).

    Args:
        rho: radius of the L2 ball, parameter units (> 0).
        steps: ascent steps; 1 (default) is SAM's ascent ``eps = rho * g/||g||`` from ``theta``; more run
            projected ascent with step ``2 rho / sqrt(steps)``.
        init_radius: ``||delta_0|| / rho`` in [0, 1]: 0 (default) starts at ``theta`` (SAM's ascent); more
            starts at a random point of that norm (stationary points, module docstring).
        seed: the random start's seed (unused when ``init_radius = 0``).

    Returns:
        :class:`ObjectiveValue`: ``value`` the largest loss found, ``clean_loss`` ``L(theta)``, ``losses``
        the loss of every iterate.

    Raises:
        ConfigError: ``rho`` not finite and > 0, ``steps < 1``, ``init_radius`` outside [0, 1].
    """
    _state.check_count("steps", steps)
    found = worst_case_sharpness(
        model,
        data,
        rho=rho,
        norm="l2",
        steps=steps,
        step_size=rho if steps == 1 else None,
        init_radius=init_radius,
        adaptive=False,
        seed=seed,
        loss_fn=loss_fn,
        batch_size=batch_size,
    )
    return ObjectiveValue(found.clean_loss + found.value, found.clean_loss, found.losses)


def log_mean_exp(losses: Sequence[float], t: float) -> float:
    """``(1/t) log((1/s) sum_j exp(t L_j))``, stabilised by the largest ``L_j``; the mean when ``t = 0``."""
    if t == 0:
        return math.fsum(losses) / len(losses)
    top = max(losses)
    return top + math.log(math.fsum(math.exp(t * (x - top)) for x in losses) / len(losses)) / t


def tilted_objective(
    model: nn.Module,
    data: EvalData,
    *,
    t: float,
    s: int = 3,
    rho: float = 0.05,
    noise_radius: float = 1.0,
    noise: str = "gaussian",
    seed: int = 0,
    loss_fn: Optional[LossFn] = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> ObjectiveValue:
    """TSAM's tilted objective ``L^t(theta)`` by the optimizer's estimator (module docstring; TSAM paper,
    Eq. 1 and Algorithms 1-2).

    Args:
        t: tilt >= 0 (0: the mean of the ``L_j``; large: their max).
        s: perturbations sampled (>= 1).
        rho: length of the normalised ascent step added to each ``delta_j`` (>= 0; 0: no ascent).
        noise_radius: radius ``r`` of ``delta_j`` (global L2 norm, >= 0; 0: no noise).
        noise: ``gaussian`` (``N(0, I)`` clipped to norm ``r``, the released code) or ``uniform`` (in the ball).
        seed: seed of the draws of ``delta_j``.

    Returns:
        :class:`ObjectiveValue`: ``value`` the log-mean-exp, ``clean_loss`` ``L(theta)``, ``losses`` the
        ``L_j`` in draw order.

    Raises:
        ConfigError: ``t``, ``rho`` or ``noise_radius`` negative or not finite, ``s < 1``, unknown ``noise``,
            a non-int ``seed``.
    """
    for name, value in (("t", t), ("rho", rho), ("noise_radius", noise_radius)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite number >= 0; got {value!r}")
    _state.check_count("s", s)
    if noise not in NOISES:
        raise ConfigError(f"noise={noise!r} is not allowed; expected one of {', '.join(map(repr, NOISES))}")
    subset = as_subset(data, batch_size)
    loss_fn = loss_fn or F.cross_entropy
    named = _state.resolve_params(model, None)
    names = [n for n, _ in named]
    device = _state.device_of(named)
    _state.make_generator(device, seed)  # validates the seed
    losses: List[float] = []
    with _state.eval_mode(model), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        base = [p.detach() for _, p in named]
        clean = subset_loss(model, subset, loss_fn, device)

        def at(us: Sequence[torch.Tensor]) -> dict:
            return {n: b + x for n, b, x in zip(names, base, us)}

        for _ in range(s):
            delta = sample_noise(base, noise_radius, noise)
            _, g = loss_and_grad(model, subset, loss_fn, device, at, delta)
            with torch.no_grad():
                g_norm = float(torch.sqrt(sum((x.double() ** 2).sum() for x in g))) + 1e-12
                eps = [d + (rho / g_norm) * x for d, x in zip(delta, g)]
                losses.append(functional_loss(model, subset, loss_fn, device, at(eps)))
    return ObjectiveValue(log_mean_exp(losses, float(t)), clean, tuple(losses))


# ---- the registered measures (flatlab.sharpness.measures runs them) ----------------------------------

TSAM_TABLE2 = "TSAM paper (Reweighting Local Minima with Tilted SAM), section 5.2, Table 2"


@register_measure(
    name="erm_objective",
    doc="L(theta), the mean loss over the subset: the ERM objective (loss units)",
    source=TSAM_TABLE2,
    hparams=(),
    metrics=("flat/erm_objective",),
    support={"flat/erm_objective": LOSS},
)
def _erm_objective_measure(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    return {"flat/erm_objective": erm_objective(model, subset, loss_fn=loss_fn).value}


@register_measure(
    name="sam_objective",
    doc="max over ||eps||_2 <= rho of L(theta + eps), by SAM's ascent (steps=1) or projected ascent (loss units)",
    source=f"{TSAM_TABLE2}; Foret et al. 2021",
    hparams=(
        HParam("rho", 0.05, float, low=0.0, low_open=True, doc="L2 radius, global (TSAM paper grid: 0.05-0.2)"),
        HParam("steps", 1, int, low=1, doc="ascent steps: 1 = SAM's ascent rho*g/||g||; more = projected ascent"),
        HParam(
            "init_radius",
            0.0,
            float,
            low=0.0,
            high=1.0,
            doc="start: 0 = theta (SAM's ascent); more = a random point at init_radius * rho (stationary points)",
        ),
        FloatList(
            "rhos",
            None,
            float,
            low=0.0,
            low_open=True,
            doc="optional further radii (a sweep, TSAM Figs. 5-6): per radius r, flat/sam_objective/rho_<r>",
        ),
    ),
    metrics=("flat/sam_objective", "flat/sam_objective_clean", sweep_key("sam_objective", "rho", "<s>")),
    support={
        "flat/sam_objective": LOSS,
        "flat/sam_objective_clean": LOSS,
        sweep_key("sam_objective", "rho", "<s>"): LOSS,
    },
)
def _sam_objective_measure(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    def at(rho: float) -> ObjectiveValue:
        return sam_objective(
            model, subset, rho=rho, steps=p["steps"], init_radius=p["init_radius"], seed=seed, loss_fn=loss_fn
        )

    got = at(p["rho"])
    out = {"flat/sam_objective": got.value, "flat/sam_objective_clean": got.clean_loss}
    for rho in p["rhos"] or ():  # the same seed: the same random start direction at every rho
        out[sweep_key("sam_objective", "rho", rho)] = at(rho).value
    return out


@register_measure(
    name="tilted_objective",
    doc="(1/t) log mean_j exp(t L(theta + eps_j)), eps_j = delta_j + rho g_j/||g_j|| as TSAM samples them (loss units)",
    source=f"{TSAM_TABLE2}; Eq. 1, Algorithms 1-2",
    hparams=(
        HParam("t", 1.0, float, low=0.0, high=1e6, doc="tilt (0: mean over samples; paper's best 1, 5 or 20)"),
        HParam("s", 3, int, low=1, doc="perturbations sampled (paper: 3, 5)"),
        HParam("rho", 0.05, float, low=0.0, doc="ascent step added to each delta_j (0: none)"),
        HParam("noise_radius", 1.0, float, low=0.0, doc="radius r of delta_j, global L2 norm (TSAM's default)"),
        HParam("noise", "gaussian", str, choices=NOISES, doc="delta_j: clipped Gaussian or uniform in the r-ball"),
        FloatList(
            "ts",
            None,
            float,
            low=0.0,
            high=1e6,
            doc="optional further tilts (a sweep, TSAM Figs. 5-6), from the same L_j: per tilt v, "
            "flat/tilted_objective/t_<v>",
        ),
    ),
    metrics=("flat/tilted_objective", "flat/tilted_objective_clean", sweep_key("tilted_objective", "t", "<s>")),
    support={
        "flat/tilted_objective": LOSS,
        "flat/tilted_objective_clean": LOSS,
        sweep_key("tilted_objective", "t", "<s>"): LOSS,
    },
)
def _tilted_objective_measure(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    got = tilted_objective(model, subset, seed=seed, loss_fn=loss_fn, **{k: v for k, v in p.items() if k != "ts"})
    out = {"flat/tilted_objective": got.value, "flat/tilted_objective_clean": got.clean_loss}
    for t in p["ts"] or ():  # the same perturbed losses L_j at every t: the curve against t is paired
        out[sweep_key("tilted_objective", "t", t)] = log_mean_exp(got.losses, t)
    return out


__all__ = ["NOISES", "erm_objective", "log_mean_exp", "sam_objective", "tilted_objective"]
