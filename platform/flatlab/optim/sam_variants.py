"""TSAM's compute-matched SAM baselines (TSAM paper §5.1, Table 1, Appendix C): PGN, RSAM and ESAM2.

Each is a :class:`~flatlab.optim.sam.SAM` whose step changes where the ascent goes or which gradient the
base optimizer gets; storing θ, climbing ρ·d/(‖d‖₂ + 1e-12) along a direction d (one global norm), the
bit-exact restore and the base step are SAM's own (:meth:`SAM._hold`, :meth:`SAM._climb`,
:meth:`SAM.second_step`). Notation: θ all trainable tensors together, g = ∇L(θ) on the mini-batch.

* **PGN** (Zhao, Zhang & Hu, ICML 2022, "Penalizing Gradient Norm for Efficiently Improving
  Generalization in Deep Learning", the gradient of L + λ‖∇L‖ by a finite difference, α = λ/r):
  (1 − α)·g + α·∇L(θ + r·g/‖g‖). α = 1 is SAM. 2 passes.
* **RSAM** (Liu et al., NeurIPS 2022, "Random Sharpness-Aware Minimization", as the authors' released
  code runs it): δ₀ random (filter-wise Gaussian, std λ times each filter's norm); g_s = ∇L(θ + δ₀);
  v = δ₀ + γ·g_s; the base steps with ∇L(θ + ρ·v/‖v‖). 2 passes.
* **ESAM2** (as the TSAM paper defines it, Appendix C; not Du et al.'s "Efficient SAM"): k step sizes
  ρ·j/k, j = 1..k, along SAM's ascent direction g/‖g‖; the one with the largest loss is kept and its
  gradient applied. 1 + k passes (k = 5 matches TSAM's 2s = 6 at s = 3).

Equations, defaults, where they come from and what is not reproduced: ``docs/algorithms/sam_variants.md``.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Tuple

import torch

from flatlab.hparams import HParam
from flatlab.optim._flat import persistent_buffers, split_with_grad
from flatlab.optim.basic import SGD_SPEC
from flatlab.optim.protocol import as_closure, ranks_mean, step_skipped
from flatlab.optim.registry import register_optimizer
from flatlab.optim.sam import RHO, SAM
from flatlab.optim.wrapper import require_closure, wrapped_spec

__all__ = ["PGN", "RSAM", "ESAM2", "rsam_noise_std", "PGN_SPEC", "RSAM_SPEC", "ESAM2_SPEC"]

PGN_RHO = HParam("rho", 0.1, float, low=0.0, doc="PGN's r: ascent length of the finite difference (released: 0.1)")
ALPHA = HParam(
    "alpha", 0.8, float, low=0.0, high=1.0, doc="PGN's α = λ/r: weight of the ascent gradient, 1 = SAM (released: 0.8)"
)
NOISE_STD = HParam(
    "noise_std", 5e-4, float, low=0.0, doc="RSAM's λ: std of δ₀ relative to each filter's norm (released: 5e-4)"
)
RSAM_GAMMA = HParam("gamma", 2.0, float, low=0.0, doc="RSAM's γ: v = δ₀ + γ·∇L(θ+δ₀) (released: 2)")
NOISE_SCHEDULE = HParam(
    "noise_schedule",
    "constant",
    str,
    choices=("constant", "cosine_increase"),
    doc="λ over training: constant, or λ·(1 + 4·(1 − cos(π·fraction))/2), λ → 5λ (the released ViT run)",
)
K = HParam("k", 5, int, low=1, doc="ESAM2: step sizes ρ·j/k tried along g/‖g‖ (1 + k passes; 5 matches TSAM s = 3)")


class PGN(SAM):
    """Gradient norm penalty (PGN) over a base optimizer: the base steps with (1 − α)·g + α·∇L(θ + r·g/‖g‖).

    Args:
        base: the optimizer that takes the step (``param_groups`` shared).
        rho: r ≥ 0, length of the normalised ascent step (parameter units, global L2).
        alpha: α ∈ [0, 1]; 0 is the base step on g, 1 is SAM with ρ = r.

    Each :meth:`step` costs 2 forward/backward passes. Extra memory: θ and g (two parameter copies,
    buffers reused across steps).

    Raises:
        ConfigError: ``rho < 0`` or ``alpha`` outside [0, 1].
    """

    _state_tag = "pgn"

    def __init__(self, base: torch.optim.Optimizer, rho: float = 0.1, alpha: float = 0.8) -> None:
        super().__init__(base, rho=PGN_RHO.validate(rho, "PGN"))
        self.alpha = ALPHA.validate(alpha, "PGN")

    def _describe(self) -> str:
        return f"rho={self.rho}, alpha={self.alpha}"

    def step_passes(self, step: int) -> Tuple[int, int]:
        """(forward, backward) passes over the mini-batch of step ``step``: (2, 2), every step."""
        return 2, 2

    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None) -> torch.Tensor:  # type: ignore[override]
        """One PGN step: g at θ (primary pass), the gradient at θ + r·g/‖g‖ (extra pass), θ restored, the
        base step with their mix. A skipped step (fp16 overflow) leaves no gradients: nothing steps.

        Returns:
            The loss at θ, a detached 0-d tensor.
        Raises:
            ValueError: ``closure`` is None.
        """
        c = as_closure(require_closure(closure, "PGN"))
        with torch.enable_grad():
            loss = c()
        params, grads = split_with_grad(self._params())
        at_theta = persistent_buffers(self.state, params, "grad_theta")
        with torch.no_grad():
            if params:
                torch._foreach_copy_(at_theta, grads)
        self.first_step(zero_grad=True)
        with torch.enable_grad():
            perturbed = c.extra()
        if not step_skipped(c):
            self._mix(params, at_theta)
            self._metrics.add("opt/perturbed_loss", perturbed)
        self.second_step()
        return loss

    @torch.no_grad()
    def _mix(self, params: List[torch.Tensor], at_theta: List[torch.Tensor]) -> None:
        # p.grad ← α·∇L(θ+ε) + (1 − α)·g; a tensor the extra pass did not reach has ∇L(θ+ε) = 0 there
        both = [(p.grad, g) for p, g in zip(params, at_theta) if p.grad is not None]
        if both:
            torch._foreach_mul_([a for a, _ in both], self.alpha)
            torch._foreach_add_([a for a, _ in both], [g for _, g in both], alpha=1.0 - self.alpha)
        for p, g in zip(params, at_theta):
            if p.grad is None:
                p.grad = g.mul(1.0 - self.alpha)


def rsam_noise_std(noise_std: float, schedule: str, fraction: float) -> float:
    """λ in effect when ``fraction`` ∈ [0, 1] of training is done: ``'constant'`` λ; ``'cosine_increase'``
    λ·(1 + 4·(1 − cos(π·fraction))/2), from λ to 5λ (the released code's cosine increase)."""
    if schedule == "cosine_increase":
        return noise_std * (1.0 + 4.0 * (1.0 - math.cos(math.pi * fraction)) / 2.0)
    return noise_std


class RSAM(SAM):
    """Random SAM over a base optimizer (Liu et al. 2022, as the authors' released code runs it).

    One step: δ₀ with δ₀[i, ...] = λ·n[i, ...]·‖θ[i, ...]‖₂, n ~ N(0, I), for every output filter i of a
    tensor with ndim ≥ 2 (dim 0), and λ·n·(‖θ‖₂ + 1e-16) for a 1-d tensor; the primary pass at θ + δ₀
    gives g_s; v = δ₀ + γ·g_s; the extra pass at θ + ρ·v/(‖v‖₂ + 1e-12) gives the gradient the base
    steps with, at θ (restored bit-exact).

    Args:
        base: the optimizer that takes the step (``param_groups`` shared).
        rho: ρ ≥ 0, length of the final perturbation (parameter units, global L2).
        noise_std: λ ≥ 0, std of δ₀ relative to each filter's norm (dimensionless).
        gamma: γ ≥ 0, weight of g_s in the ascent direction v.
        noise_schedule: ``'constant'`` or ``'cosine_increase'`` (:func:`rsam_noise_std`, by the fraction
            of training ``on_progress`` reports; 0 without it).

    Each :meth:`step` costs 2 forward/backward passes, the primary one (BatchNorm statistics updated) at
    θ + δ₀. Draws one ``torch.randn_like`` per trainable tensor, in order, from the global RNG. Extra
    memory: θ and δ₀ (two parameter copies, reused across steps).

    Raises:
        ConfigError: a value outside its range.
    """

    _state_tag = "rsam"

    def __init__(
        self,
        base: torch.optim.Optimizer,
        rho: float = 0.05,
        noise_std: float = 5e-4,
        gamma: float = 2.0,
        noise_schedule: str = "constant",
    ) -> None:
        super().__init__(base, rho=rho)
        self.noise_std = NOISE_STD.validate(noise_std, "RSAM")
        self.gamma = RSAM_GAMMA.validate(gamma, "RSAM")
        self.noise_schedule = NOISE_SCHEDULE.validate(noise_schedule, "RSAM")

    def _describe(self) -> str:
        return f"rho={self.rho}, noise_std={self.noise_std}, gamma={self.gamma}, noise_schedule={self.noise_schedule!r}"

    def step_passes(self, step: int) -> Tuple[int, int]:
        """(forward, backward) passes over the mini-batch of step ``step``: (2, 2), every step."""
        return 2, 2

    def current_noise_std(self) -> float:
        """λ used by the next step (after the schedule)."""
        fraction = self._progress.fraction if self._progress is not None else 0.0
        return rsam_noise_std(self.noise_std, self.noise_schedule, fraction)

    @torch.no_grad()
    def _draw(self, params: List[torch.Tensor], out: List[torch.Tensor]) -> None:
        # δ₀ into ``out``: standard-normal draws scaled by λ times the norm of each filter (dim 0) of θ
        std = self.current_noise_std()
        for p, d in zip(params, out):
            d.copy_(torch.randn_like(p))
            if p.ndim >= 2:
                norms = torch.linalg.vector_norm(p.reshape(p.shape[0], -1), dim=1)
                d.mul_(norms.mul_(std).reshape((-1,) + (1,) * (p.ndim - 1)))
            else:
                d.mul_(torch.linalg.vector_norm(p).add_(1e-16).mul_(std))

    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None) -> torch.Tensor:  # type: ignore[override]
        """One RSAM step (class docstring).

        Returns:
            The primary pass's loss, at θ + δ₀ (a detached 0-d tensor).
        Raises:
            ValueError: ``closure`` is None.
        """
        c = as_closure(require_closure(closure, "RSAM"))
        params = [p for p in self._params() if p.requires_grad]
        theta = self._hold(params)
        noise = persistent_buffers(self.state, params, "noise")
        self._draw(params, noise)
        with torch.no_grad():
            if params:
                torch._foreach_add_(params, noise)
        with torch.enable_grad():
            loss = c()  # at θ + δ₀
        with torch.no_grad():
            reached = [(d, p.grad) for d, p in zip(noise, params) if p.grad is not None]
            if reached:
                torch._foreach_add_([d for d, _ in reached], [g for _, g in reached], alpha=self.gamma)  # v
            if params:
                torch._foreach_copy_(params, theta)
            self._climb(params, noise, self.rho, scratch=True)
        self.zero_grad()
        with torch.enable_grad():
            perturbed = c.extra()
        self.second_step()  # a skipped step (fp16 overflow) left no gradients: the base steps nothing
        if not step_skipped(c):
            self._metrics.add("opt/perturbed_loss", perturbed)
        return loss


class ESAM2(SAM):
    """ESAM2 as the TSAM paper defines it (Appendix C): the largest loss over k step sizes along SAM's
    ascent direction, and the gradient taken there.

    One step: g at θ (primary pass); for j = 1..k the loss L_j and gradient G_j at θ + (ρ·j/k)·g/‖g‖
    (extra passes, BatchNorm statistics not updated); θ restored bit-exact; the base steps with G_j* of
    j* = argmax_j L_j (the smallest j on ties). Under data parallelism L_j is averaged over the ranks
    before the choice, so every rank keeps the same j. Each L_j is read to the host (one sync per pass).

    Args:
        base: the optimizer that takes the step (``param_groups`` shared).
        rho: ρ ≥ 0, the largest step size (parameter units, global L2); SAM's ε at j = k.
        k: step sizes tried, int ≥ 1; k = 1 is SAM.

    Each :meth:`step` costs 1 + k forward/backward passes. Extra memory: θ, g and the kept gradient
    (three parameter copies at the peak).

    Raises:
        ConfigError: ``rho < 0`` or ``k`` not an int ≥ 1.
    """

    _state_tag = "esam2"

    def __init__(self, base: torch.optim.Optimizer, rho: float = 0.05, k: int = 5) -> None:
        super().__init__(base, rho=rho)
        self.k = K.validate(k, "ESAM2")

    def _describe(self) -> str:
        return f"rho={self.rho}, k={self.k}"

    def step_passes(self, step: int) -> Tuple[int, int]:
        """(forward, backward) passes over the mini-batch of step ``step``: (1 + k, 1 + k), every step."""
        return 1 + self.k, 1 + self.k

    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None) -> torch.Tensor:  # type: ignore[override]
        """One ESAM2 step (class docstring).

        Returns:
            The loss at θ, a detached 0-d tensor.
        Raises:
            ValueError: ``closure`` is None.
        """
        c = as_closure(require_closure(closure, "ESAM2"))
        with torch.enable_grad():
            loss = c()
        params, grads = split_with_grad(self._params())
        theta = self._hold(params)
        ascent = persistent_buffers(self.state, params, "ascent")
        with torch.no_grad():
            if params:
                torch._foreach_copy_(ascent, grads)
        best, best_loss, best_j = self._search(c, params, theta, ascent)
        if step_skipped(c):  # a pass overflowed (fp16): no gradients are left, the base steps nothing
            self.second_step()
            return loss
        self._step_with(params, best)
        self._metrics.add("opt/perturbed_loss", best_loss)
        self._metrics.add("opt/ascent_fraction", best_j / self.k)
        return loss

    def _search(
        self, c, params: List[torch.Tensor], theta: List[torch.Tensor], ascent: List[torch.Tensor]
    ) -> Tuple[List[Optional[torch.Tensor]], float, int]:
        # the k candidates; returns the gradients at the largest loss (taken over from p.grad), that loss, j
        best: List[Optional[torch.Tensor]] = [None] * len(params)
        best_loss, best_j = -math.inf, 0
        for j in range(1, self.k + 1):
            with torch.no_grad():
                if params:
                    torch._foreach_copy_(params, theta)
                self._climb(params, ascent, self.rho * j / self.k, scratch=False)
            self.zero_grad()
            with torch.enable_grad():
                value = float(ranks_mean(c, c.extra()))
            if step_skipped(c):
                break
            if best_j == 0 or value > best_loss:
                best, best_loss, best_j = [p.grad for p in params], value, j
                for p in params:
                    p.grad = None  # kept: the next pass writes fresh tensors
        return best, best_loss, best_j

    def _step_with(self, params: List[torch.Tensor], best: List[Optional[torch.Tensor]]) -> None:
        self.zero_grad()
        for p, g in zip(params, best):
            p.grad = g
        self.second_step()


def _wrap_pgn(base: torch.optim.Optimizer, *, rho: float, alpha: float) -> PGN:
    return PGN(base, rho=rho, alpha=alpha)


def _wrap_rsam(base: torch.optim.Optimizer, **kw: object) -> RSAM:
    return RSAM(base, **kw)  # type: ignore[arg-type]


def _wrap_esam2(base: torch.optim.Optimizer, *, rho: float, k: int) -> ESAM2:
    return ESAM2(base, rho=rho, k=k)


PGN_SPEC = register_optimizer(
    wrapped_spec(
        "pgn", SGD_SPEC, (PGN_RHO, ALPHA), _wrap_pgn, doc="PGN over SGD: gradient norm penalty (Zhao et al. 2022)"
    )
)
RSAM_SPEC = register_optimizer(
    wrapped_spec(
        "rsam",
        SGD_SPEC,
        (RHO, NOISE_STD, RSAM_GAMMA, NOISE_SCHEDULE),
        _wrap_rsam,
        doc="Random SAM over SGD (Liu et al. 2022, the released procedure)",
    )
)
ESAM2_SPEC = register_optimizer(
    wrapped_spec(
        "esam2",
        SGD_SPEC,
        (RHO, K),
        _wrap_esam2,
        doc="ESAM2 over SGD: largest loss over k step sizes along SAM's ascent (TSAM paper, App. C)",
    )
)
