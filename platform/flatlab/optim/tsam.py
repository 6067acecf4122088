"""TSAM: tilted sharpness-aware minimization ("Reweighting Local Minima with Tilted SAM").

Objective L^t(θ) = (1/t)·log E_ε[exp(t·L(θ+ε))] (t → 0: E_ε[L(θ+ε)], t → ∞: SAM's max), whose gradient
(Lemma 1) is Σ_j w_j ∇L(θ+ε_j), w = softmax(t·L_j) over s sampled ε_j. One step (Algorithms 1 + 2 as
the authors' released code runs them), for j = 1..s: δ_j random with ‖δ_j‖₂ ≤ r (global norm); the
gradient g at θ+δ_j; ε_j = δ_j + ρ·g/(‖g‖₂ + 1e-12); L_j and G_j at θ+ε_j; θ restored bit-exact. The
base optimizer then steps with Σ_j w_j G_j (weights detached).

2s forward/backward passes per step, one of them primary (BatchNorm statistics updated once; where:
``primary_pass``). The tilted gradient is accumulated online (:class:`TiltedAccumulator`), so memory
does not grow with s: θ is the one persistent copy, 2 extra copies at the peak.

Equations, the noise, ``primary_pass``, the accumulator, data parallelism, the options and the
paper's grids: ``docs/algorithms/tsam.md``.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from flatlab.hparams import HParam
from flatlab.optim._flat import NORM_EPS, add_scaled_, global_norm, persistent_buffers, split_with_grad
from flatlab.optim.basic import ADAMW_SPEC, SGD_SPEC
from flatlab.optim.protocol import as_closure, ranks_mean, step_skipped
from flatlab.optim.registry import register_optimizer
from flatlab.optim.sam import RHO
from flatlab.optim.wrapper import WrappedOptimizer, require_closure, wrapped_spec

__all__ = [
    "TSAM",
    "TiltedAccumulator",
    "sample_noise",
    "noise_scale",
    "tilt_at",
    "TSAM_HPARAMS",
    "TSAM_SPEC",
    "TSAM_ADAMW_SPEC",
]

S = HParam("s", 3, int, low=1, doc="perturbations sampled per step (2s forward/backward passes); paper: 3, 5")
T = HParam("t", 1.0, float, low=0.0, high=1e6, doc="tilt t >= 0 (0: mean over samples, large: max); paper: 0-100")
NOISE_RADIUS = HParam("noise_radius", 1.0, float, low=0.0, doc="radius r of the random part δ (global L2 norm)")
NOISE = HParam(
    "noise", "gaussian", str, choices=("gaussian", "uniform"), doc="δ: clipped Gaussian or uniform in the r-ball"
)
T_SCHEDULE = HParam(
    "t_schedule",
    "constant",
    str,
    choices=("constant", "increase", "decrease"),
    doc="t over training: linear 0→t or t→0",
)
PRIMARY_PASS = HParam(
    "primary_pass",
    "noisy",
    str,
    choices=("noisy", "center"),
    doc="'noisy': sample 1's ascent gradient at θ+δ_1 (released code); 'center': at θ, BN stats from θ",
)
TSAM_HPARAMS = (RHO, S, T, NOISE_RADIUS, NOISE, T_SCHEDULE, PRIMARY_PASS)


def tilt_at(t: float, schedule: str, fraction: float) -> float:
    """Tilt in effect when ``fraction`` ∈ [0, 1] of training is done.

    ``'constant'``: t; ``'increase'``: t·fraction; ``'decrease'``: t·(1 − fraction) (the released code's
    ``schedule_t`` 1 and 2, linear in steps).
    """
    if schedule == "increase":
        return t * fraction
    if schedule == "decrease":
        return t * (1.0 - fraction)
    return t


@torch.no_grad()
def sample_noise(params: Sequence[torch.Tensor], radius: float, kind: str) -> List[torch.Tensor]:
    """Random perturbation δ over all ``params`` with global norm ‖δ‖₂ ≤ ``radius``.

    ``'gaussian'``: δ = n·min(1, r/‖n‖₂), n ~ N(0, I) (the released code's clipping); ``'uniform'``:
    uniform in the r-ball, δ = r·U^{1/d}·n/‖n‖₂ with d the total number of coordinates.
    Draws from the global torch RNG: one ``torch.randn_like`` per tensor in order, then (uniform only)
    one ``torch.rand(())``.

    Returns:
        One tensor per parameter, same shapes, parameter units.
    """
    noise = [torch.randn_like(p) for p in params]
    torch._foreach_mul_(noise, noise_scale(noise, radius, kind))
    return noise


def noise_scale(noise: Sequence[torch.Tensor], radius: float, kind: str) -> torch.Tensor:
    """The factor (0-d tensor) that turns standard-normal draws ``noise`` into :func:`sample_noise`'s δ."""
    norm = global_norm(noise)
    if kind == "uniform":
        d = sum(n.numel() for n in noise)
        u = torch.rand((), device=norm.device)
        return radius * u.pow(1.0 / d) / (norm + NORM_EPS)
    return torch.clamp(radius / (norm + NORM_EPS), max=1.0)


class TiltedAccumulator:
    """Streaming tilted aggregate Σ_j softmax(t·L)_j G_j and log-mean-exp, in O(1) memory in s.

    Keeps the running max m of the losses, S = Σ_j exp(t(L_j − m)) and A = Σ_j exp(t(L_j − m))·G_j;
    when a larger loss arrives, A and S are rescaled by exp(t(m_old − m_new)), so no exponent is ever
    positive (no overflow for losses ~1e3 and large t). All arithmetic stays on the device (0-d
    tensors): no host sync.

    A lives in the first gradient of each tensor handed to :meth:`add`: taken over with
    ``consume=True`` (no memory of its own), cloned otherwise. A tensor whose gradient is ``None`` in
    every sample has ``None`` as its aggregate.

    Args:
        t: tilt ≥ 0 (0 gives the plain mean).
    """

    def __init__(self, t: float) -> None:
        self.t = float(t)
        self.buffers: List[Optional[torch.Tensor]] = []
        self.count = 0
        self._max: Optional[torch.Tensor] = None
        self._sum: Optional[torch.Tensor] = None  # S
        self._loss_sum: Optional[torch.Tensor] = None

    @torch.no_grad()
    def add(self, loss: torch.Tensor, grads: Sequence[Optional[torch.Tensor]], consume: bool = False) -> None:
        """Fold one sample in.

        Args:
            loss: L_j, 0-d (nats, the mean mini-batch loss at θ+ε_j).
            grads: G_j, one tensor per gradient slot, the same shapes in every sample (``None`` = zero
                for that tensor).
            consume: the caller gives ``grads`` away: they are scaled in place or kept as the
                accumulator's own storage (no allocation), so the caller must not write to them again.
        """
        loss = loss.detach().to(torch.promote_types(loss.dtype, torch.float32)).reshape(())
        if self.count == 0:
            self._max, self._sum, self._loss_sum = loss.clone(), torch.ones_like(loss), loss.clone()
            self.buffers = [None if g is None else (g if consume else g.clone()) for g in grads]
        else:
            assert self._max is not None and self._sum is not None and self._loss_sum is not None
            new_max = torch.maximum(self._max, loss)
            old_w = torch.exp(self.t * (self._max - new_max))  # rescales what is accumulated, ≤ 1
            new_w = torch.exp(self.t * (loss - new_max))  # weight of this sample, ≤ 1
            self._sum = self._sum * old_w + new_w
            self._max = new_max
            self._loss_sum = self._loss_sum + loss
            held = [b for b in self.buffers if b is not None]
            if held and (old_w.device.type != "cpu" or float(old_w) != 1.0):  # CPU: skip when the max did not move
                torch._foreach_mul_(held, old_w.to(held[0].dtype))
            present = [(b, g) for b, g in zip(self.buffers, grads) if b is not None and g is not None]
            if present:
                add_scaled_([b for b, _ in present], [g for _, g in present], new_w, src_is_scratch=consume)
            for i, (b, g) in enumerate(zip(self.buffers, grads)):
                if b is None and g is not None:  # first gradient of this tensor: A_i was 0
                    self.buffers[i] = (g if consume else g.clone()).mul_(new_w.to(g.dtype))
        self.count += 1

    @torch.no_grad()
    def gradient(self) -> List[Optional[torch.Tensor]]:
        """Normalise in place and return the buffers: A/S = Σ_j softmax(t·L)_j G_j (``None``: never given)."""
        if self.count == 0:
            raise RuntimeError("TiltedAccumulator.gradient() before any add()")
        assert self._sum is not None
        held = [b for b in self.buffers if b is not None]
        if held:
            torch._foreach_div_(held, self._sum.to(held[0].dtype))
        return self.buffers

    def tilted_loss(self) -> torch.Tensor:
        """(1/t)·log((1/s)·Σ_j exp(t·L_j)) (stabilised log-mean-exp); the mean loss when t = 0."""
        assert self._max is not None and self._sum is not None and self._loss_sum is not None
        if self.t == 0.0:
            return self._loss_sum / self.count
        return self._max + (torch.log(self._sum) - math.log(self.count)) / self.t

    def max_loss(self) -> torch.Tensor:
        assert self._max is not None
        return self._max

    def mean_loss(self) -> torch.Tensor:
        assert self._loss_sum is not None
        return self._loss_sum / self.count


class TSAM(WrappedOptimizer):
    """Tilted SAM over a base optimizer (paper Algorithms 1 + 2, tilted gradient of Lemma 1).

    Args:
        base: the optimizer that takes the step with the tilted gradient (``param_groups`` shared).
        rho: ascent length ρ ≥ 0 of the normalised gradient step (parameter units, global L2).
        s: perturbations per step, int ≥ 1 (2s forward/backward passes).
        t: tilt ≥ 0; 0 averages the s perturbed gradients, large t keeps the max-loss one.
        noise_radius: r ≥ 0, bound on the global L2 norm of the random part δ.
        noise: ``'gaussian'`` or ``'uniform'`` (see :func:`sample_noise`).
        t_schedule: ``'constant'``, ``'increase'`` (0 → t) or ``'decrease'`` (t → 0), linear in the
            step index given by ``on_progress`` (without progress the fraction done is taken as 0).
        primary_pass: ``'noisy'`` (default: the released procedure, every ascent gradient at θ+δ_j) or
            ``'center'`` (sample 1's ascent gradient and the BatchNorm-updating pass at θ).

    With ``rho = 0`` and ``noise_radius = 0`` every sample is θ itself and the step is the base step.

    Raises:
        ConfigError: a value outside its range (``s`` not an int ≥ 1, ``t`` outside [0, 1e6], ...).
    """

    _state_tag = "tsam"

    def __init__(
        self,
        base: torch.optim.Optimizer,
        rho: float = 0.05,
        s: int = 3,
        t: float = 1.0,
        noise_radius: float = 1.0,
        noise: str = "gaussian",
        t_schedule: str = "constant",
        primary_pass: str = "noisy",
    ) -> None:
        super().__init__(base)
        self.rho = RHO.validate(rho, "TSAM")
        self.s = S.validate(s, "TSAM")
        self.t = T.validate(t, "TSAM")  # the range [0, 1e6] excludes inf (0·inf would give NaN weights)
        self.noise_radius = NOISE_RADIUS.validate(noise_radius, "TSAM")
        self.noise = NOISE.validate(noise, "TSAM")
        self.t_schedule = T_SCHEDULE.validate(t_schedule, "TSAM")
        self.primary_pass = PRIMARY_PASS.validate(primary_pass, "TSAM")

    def _describe(self) -> str:
        return (
            f"rho={self.rho}, s={self.s}, t={self.t}, noise_radius={self.noise_radius}, noise={self.noise!r}, "
            f"t_schedule={self.t_schedule!r}, primary_pass={self.primary_pass!r}"
        )

    def current_t(self) -> float:
        """The tilt used by the next step (after the schedule)."""
        fraction = self._progress.fraction if self._progress is not None else 0.0
        return tilt_at(self.t, self.t_schedule, fraction)

    @torch.no_grad()
    def _place_noisy(self, params: List[torch.Tensor], theta: List[torch.Tensor]) -> None:
        # θ' ← θ + δ from the saved θ, with the same draws and values as sample_noise. The standard-normal
        # draws go straight into the parameters (``p.normal_()`` consumes the RNG exactly as
        # ``torch.randn_like(p)``), which then hold n until θ + scale·n is written over them: no noise
        # buffer (one parameter copy less at the peak, no allocation per sample). Writing from the saved
        # θ also undoes the previous sample's perturbation in the same pass.
        if self.noise_radius > 0:
            for p in params:
                p.normal_()
            scale = noise_scale(params, self.noise_radius, self.noise)
            if scale.device.type == "cpu":
                alpha = float(scale)
                for p, t in zip(params, theta):
                    torch.add(t, p, alpha=alpha, out=p)  # θ + scale·n, elementwise in place
                return
            torch._foreach_mul_(params, scale)  # accelerators: keep the scale on the device (no sync)
            torch._foreach_add_(params, theta)
        else:
            torch._foreach_copy_(params, theta)

    @torch.no_grad()
    def _ascend(self, params: List[torch.Tensor]) -> None:
        # θ' ← θ' + ρ·g/‖g‖ with g the gradient now in p.grad; p.grad is scratch here (consumed).
        ps, grads = split_with_grad(params)
        if ps and self.rho > 0:
            add_scaled_(ps, grads, self.rho / (global_norm(grads) + NORM_EPS), src_is_scratch=True)

    def step_passes(self, step: int) -> Tuple[int, int]:
        """(2s, 2s) for every step: per sample j, the ascent gradient (at θ+δ_j, or at θ for sample 1
        with ``primary_pass='center'``) and L_j, G_j at θ+ε_j (Algorithms 1 + 2;
        :func:`flatlab.optim.protocol.passes_of`)."""
        return 2 * self.s, 2 * self.s

    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None) -> torch.Tensor:  # type: ignore[override]
        """One TSAM step (2s passes, one primary), then the base step with the tilted gradient.

        Returns:
            The primary pass's loss (at θ+δ_1 with the default ``primary_pass='noisy'``, at θ with ``'center'``).
        Raises:
            ValueError: ``closure`` is None.
        """
        c = as_closure(require_closure(closure, "TSAM"))
        params = [p for p in self._params() if p.requires_grad]
        theta = persistent_buffers(self.state, params, "theta")
        acc = TiltedAccumulator(self.current_t())  # keeps each step's first G_j as its storage
        with torch.no_grad():
            torch._foreach_copy_(theta, params)
        primary_loss: Optional[torch.Tensor] = None
        for j in range(self.s):
            with torch.enable_grad():
                if j == 0 and self.primary_pass == "center":
                    primary_loss = c()  # at θ: BatchNorm statistics as in a plain step
                    self._place_noisy(params, theta)
                else:
                    self._place_noisy(params, theta)  # also undoes sample j-1's perturbation exactly
                    if j == 0:
                        primary_loss = c()  # at θ+δ_1
                    else:
                        c.extra()
                self._ascend(params)  # θ+ε_j
                # data parallel: every rank's G_j is already averaged by DDP; L_j is averaged here,
                # before the tilt weights, so that every rank weights the samples alike
                perturbed_loss = ranks_mean(c, c.extra())
            acc.add(perturbed_loss, [p.grad for p in params], consume=True)
            for p in params:  # the accumulator owns those tensors now; a closure that zeroes p.grad in
                p.grad = None  # place must not reach them
        with torch.no_grad():
            torch._foreach_copy_(params, theta)  # restore θ exactly
        if step_skipped(c):  # a pass overflowed (fp16): the earlier samples' gradients are dropped, no step
            for p in params:
                p.grad = None
            assert primary_loss is not None
            return primary_loss
        for p, g in zip(params, acc.gradient()):
            p.grad = g  # None for tensors the loss does not reach, as in a plain step
        self.base.step()
        self._metrics.add("opt/perturbed_loss", acc.mean_loss())
        self._metrics.add("opt/perturbed_loss_max", acc.max_loss())
        self._metrics.add("opt/tilted_loss", acc.tilted_loss())
        assert primary_loss is not None
        return primary_loss


def _wrap_tsam(base: torch.optim.Optimizer, **kw: object) -> TSAM:
    return TSAM(base, **kw)  # type: ignore[arg-type]


TSAM_SPEC = register_optimizer(
    wrapped_spec("tsam", SGD_SPEC, TSAM_HPARAMS, _wrap_tsam, doc="Tilted SAM over SGD (TSAM, Alg. 1 + 2, Lemma 1)")
)
TSAM_ADAMW_SPEC = register_optimizer(
    wrapped_spec(
        "tsam_adamw", ADAMW_SPEC, TSAM_HPARAMS, _wrap_tsam, doc="Tilted SAM over AdamW (TSAM, Alg. 1 + 2, Lemma 1)"
    )
)
