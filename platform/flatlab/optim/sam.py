"""SAM (Foret et al., ICLR 2021) and ASAM (Kwon et al., ICML 2021) as one wrapper optimizer.

One step (SAM Algorithm 1 with ε̂ of its Eq. 2, p = 2; ASAM Algorithm 1, p = 2, T_w = |w| + η): the
primary pass at θ gives g; θ + ε with ε = ρ·g/(‖g‖₂ + 1e-12), or ASAM's ρ·T²⊙g/(‖T⊙g‖₂ + 1e-12), one
global norm over every parameter; the extra pass at θ+ε (BatchNorm statistics not updated); θ restored
bit-exact; the base optimizer steps with ∇L(θ+ε).

Weight decay, momentum and the learning rate belong to the base optimizer, whose ``param_groups`` this
wrapper shares; registry entries ``sam`` / ``asam`` wrap SGD and ``sam_adamw`` wraps AdamW. ASAM's
scaled tensors (``asam_scope``), the data-parallel ascent (``ascent``), defaults and memory:
``docs/algorithms/sam.md``.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable, List, Optional, Tuple

import torch

from flatlab.hparams import HParam
from flatlab.optim._flat import NORM_EPS, add_scaled_, global_norm, persistent_buffers, split_with_grad
from flatlab.optim.basic import ADAMW_SPEC, SGD_SPEC
from flatlab.optim.protocol import as_closure, local_pass, step_skipped
from flatlab.optim.registry import register_optimizer
from flatlab.optim.wrapper import WrappedOptimizer, require_closure, wrapped_spec

__all__ = [
    "SAM",
    "RHO",
    "ASCENT",
    "ASAM_RHO",
    "ETA",
    "ASAM_SCOPE",
    "SAM_HPARAMS",
    "ASAM_HPARAMS",
    "asam_scaled",
    "SAM_SPEC",
    "ASAM_SPEC",
    "SAM_ADAMW_SPEC",
]

RHO = HParam("rho", 0.05, float, low=0.0, doc="SAM neighbourhood radius (L2, global); 0.05 CIFAR-10, 0.1 CIFAR-100")
ASAM_RHO = HParam(
    "rho", 0.5, float, low=0.0, doc="ASAM neighbourhood radius in the T_w-scaled norm; 0.5 CIFAR-10, 1.0 CIFAR-100"
)
ETA = HParam("eta", 0.01, float, low=0.0, doc="ASAM offset in T_w = |w| + eta (Kwon et al. 2021, ASAM Alg. 1)")
ASAM_SCOPE = HParam(
    "asam_scope",
    "weight_names",
    str,
    choices=("weight_names", "weights", "all"),
    doc="tensors scaled by T_w: 'weight_names' = name contains 'weight' (official; unnamed params: ndim >= 2), "
    "'weights' = ndim >= 2, 'all'",
)
ASCENT = HParam(
    "ascent",
    "global",
    str,
    choices=("global", "local"),
    doc="data parallel: ε from the rank-averaged gradient ('global' = SAM on the global batch) or from each "
    "rank's own ('local': m-sharpness, m = per-device batch; that pass skips the all-reduce)",
)
SAM_HPARAMS = (RHO, ASCENT)
ASAM_HPARAMS = (ASAM_RHO, ETA, ASAM_SCOPE, ASCENT)
ADAPTIVE = HParam("adaptive", False, bool, doc="ASAM instead of SAM")


def asam_scaled(p: torch.Tensor, name: Optional[str], scope: str) -> bool:
    """Whether ASAM scales tensor ``p`` by T_w = |w| + η (others get T = 1), by ``scope``: ``'weight_names'``
    the official rule (``'weight' in name``, normalisation gains included; without a name the
    ``'weights'`` rule), ``'weights'`` ``p.ndim >= 2``, ``'all'`` every tensor (``docs/algorithms/sam.md``)."""
    if scope == "all":
        return True
    if scope == "weights" or name is None:
        return p.ndim >= 2
    return "weight" in name


_warned_unnamed = False


def _named(param_groups: List[dict]) -> bool:
    # torch keeps the names of an optimizer built from named parameters in every group (all or none)
    return all("param_names" in g for g in param_groups)


def _warn_unnamed_once() -> None:
    global _warned_unnamed
    if _warned_unnamed:
        return
    _warned_unnamed = True
    warnings.warn(
        "ASAM: asam_scope='weight_names' (the official rule) needs parameter names, but the optimizer was "
        "built from model.parameters(); tensors with ndim >= 2 are scaled instead (asam_scope='weights'), "
        "so normalisation gains get T = 1. Build it from model.named_parameters() for the official rule.",
        stacklevel=4,
    )


class SAM(WrappedOptimizer):
    """Sharpness-aware minimization over a base optimizer; ``adaptive=True`` gives ASAM.

    Args:
        base: the optimizer that takes the actual step (its ``param_groups`` are shared).
        rho: neighbourhood radius ρ ≥ 0 (parameter units; ASAM: in the T_w-rescaled norm).
        adaptive: ASAM's elementwise scaling T_w = |w| + η (Kwon et al. 2021, Algorithm 1, p = 2).
        eta: η ≥ 0 of T_w (ASAM only).
        asam_scope: which tensors get T_w (see :func:`asam_scaled`): ``'weight_names'`` (default, the
            official rule; needs an optimizer built from ``named_parameters()``, otherwise it falls back
            to ``'weights'`` and warns once, at its first step), ``'weights'`` or ``'all'``.
        ascent: under data parallelism (DDP), where ε comes from: ``'global'`` (default) the gradient
            averaged over the ranks, so the step equals single-process SAM on the global batch;
            ``'local'`` each rank's own gradient (the SAM paper's m-sharpness, Foret et al. 2021 §4.1,
            with m = the per-device batch): the primary pass then runs under DDP ``no_sync`` (forward
            and backward), skipping that all-reduce; the gradient at θ+ε is averaged either way. No
            effect in one process.

    Each :meth:`step` costs 2 forward/backward passes. Extra memory: one copy of the parameters (θ is
    stored during the step, in a buffer reused across steps).

    Warns:
        UserWarning: ``adaptive=True`` with ``asam_scope='weight_names'`` over parameter groups without
            ``param_names`` (built from ``model.parameters()``): the ndim >= 2 rule is used instead. Once
            per process, at the first ascent step (building an optimizer only to validate its
            hyperparameters does not warn).

    Raises:
        ConfigError: ``rho < 0``, ``eta < 0``, or an unknown ``asam_scope``.
    """

    _state_tag = "sam"

    def __init__(
        self,
        base: torch.optim.Optimizer,
        rho: float = 0.05,
        adaptive: bool = False,
        eta: float = 0.01,
        asam_scope: str = "weight_names",
        ascent: str = "global",
    ) -> None:
        super().__init__(base)
        self.rho = RHO.validate(rho, "SAM")
        self.adaptive = ADAPTIVE.validate(adaptive, "SAM")
        self.eta = ETA.validate(eta, "SAM")
        self.asam_scope = ASAM_SCOPE.validate(asam_scope, "SAM")
        self.ascent = ASCENT.validate(ascent, "SAM")
        self._perturbed: Optional[List[torch.Tensor]] = None

    def _describe(self) -> str:
        local = ", ascent='local'" if self.ascent == "local" else ""
        if self.adaptive:
            return f"rho={self.rho}, adaptive=True, eta={self.eta}, asam_scope={self.asam_scope!r}{local}"
        return f"rho={self.rho}{local}"

    def _scales(self, params: List[torch.Tensor]) -> List[bool]:
        if self.asam_scope == "weight_names" and not _named(self.param_groups):
            _warn_unnamed_once()  # at the first ascent, so that building an optimizer to validate stays quiet
        names = {}
        for g in self.param_groups:
            for p, n in zip(g["params"], g.get("param_names", [None] * len(g["params"]))):
                names[p] = n
        return [asam_scaled(p, names.get(p), self.asam_scope) for p in params]

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        """Climb to θ+ε using the gradients now in ``p.grad`` (the gradient at θ).

        Stores θ (so :meth:`second_step` restores it exactly) and adds ε = ρ·g/(‖g‖₂+1e-12), or ASAM's
        ε = ρ·T²⊙g/(‖T⊙g‖₂+1e-12), to every parameter that has a gradient. ``p.grad`` is left as is,
        unless ``zero_grad=True``: then it is used as scratch and cleared.
        """
        params, grads = split_with_grad(self._params())
        self._hold(params)
        if params:
            if self.adaptive:
                self._asam_ascent(params, grads)
            else:
                self._climb(params, grads, self.rho, scratch=zero_grad)  # zero_grad: grads are scratch
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def _hold(self, params: List[torch.Tensor]) -> List[torch.Tensor]:
        """Store θ of ``params`` (returned: buffers reused across steps) for :meth:`second_step` to restore."""
        saved = persistent_buffers(self.state, params, "theta")
        if params:
            torch._foreach_copy_(saved, params)
        self._perturbed = params
        return saved

    @torch.no_grad()
    def _climb(self, params: List[torch.Tensor], direction: List[torch.Tensor], radius: float, scratch: bool) -> None:
        """``params += radius·d/(‖d‖₂ + 1e-12)``, one global norm over ``direction`` (shaped like ``params``);
        ``scratch``: ``direction`` may be overwritten (accelerators scale it in place)."""
        if params:
            add_scaled_(params, direction, radius / (global_norm(direction) + NORM_EPS), src_is_scratch=scratch)

    def _asam_ascent(self, params: List[torch.Tensor], grads: List[torch.Tensor]) -> None:
        # T_w ⊙ g for the scaled tensors; computed tensor by tensor to keep the peak at one extra copy.
        scaled = self._scales(params)
        tg_norms = []
        for p, g, s in zip(params, grads, scaled):
            tg_norms.append((g * (p.abs() + self.eta)).norm() if s else g.norm())
        norm = torch.linalg.vector_norm(torch.stack([n.to(params[0].device) for n in tg_norms]))
        scale = self.rho / (norm + NORM_EPS)
        for p, g, s in zip(params, grads, scaled):
            if s:
                t = p.abs().add_(self.eta)
                p.add_(t.mul_(t).mul_(g).mul_(scale))  # ε = ρ·T²⊙g/‖T⊙g‖
            else:
                p.add_(g * scale)

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        """Return to the stored θ (bit-exact) and take the base step with the gradients at θ+ε.

        Raises:
            RuntimeError: called without a preceding :meth:`first_step`.
        """
        if self._perturbed is None:
            raise RuntimeError("SAM.second_step() called without first_step()")
        params, self._perturbed = self._perturbed, None
        if params:
            torch._foreach_copy_(params, [self.state[p]["theta"] for p in params])
        self.base.step()
        if zero_grad:
            self.zero_grad()

    def step_passes(self, step: int) -> Tuple[int, int]:
        """(2, 2): every step is the primary pass at θ and the extra one at θ+ε (SAM Alg. 1; ASAM Alg. 1),
        whatever its index (:func:`flatlab.optim.protocol.passes_of`)."""
        return 2, 2

    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None) -> torch.Tensor:  # type: ignore[override]
        """One SAM/ASAM step: ``closure()`` at θ, ``closure.extra()`` at θ+ε, restore θ, base step.

        Args:
            closure: a :class:`flatlab.optim.Closure` (or a plain ``fn() -> loss`` that calls backward;
                then the extra pass cannot protect BatchNorm statistics).
        Returns:
            The loss at θ (primary pass), a detached 0-d tensor.
        Raises:
            ValueError: ``closure`` is None.
        """
        c = as_closure(require_closure(closure, "SAM"))
        with torch.enable_grad(), local_pass(c) if self.ascent == "local" else contextlib.nullcontext():
            loss = c()  # 'local' ascent: this rank's gradient at θ, not all-reduced
        self.first_step(zero_grad=True)
        with torch.enable_grad():
            perturbed = c.extra()
        self.second_step()  # a skipped step (fp16 overflow) left no gradients: the base steps nothing
        if not step_skipped(c):
            self._metrics.add("opt/perturbed_loss", perturbed)
        return loss


def _wrap_sam(base: torch.optim.Optimizer, *, rho: float, ascent: str) -> SAM:
    return SAM(base, rho=rho, ascent=ascent)


def _wrap_asam(base: torch.optim.Optimizer, *, rho: float, eta: float, asam_scope: str, ascent: str) -> SAM:
    return SAM(base, rho=rho, adaptive=True, eta=eta, asam_scope=asam_scope, ascent=ascent)


SAM_SPEC = register_optimizer(
    wrapped_spec("sam", SGD_SPEC, SAM_HPARAMS, _wrap_sam, doc="SAM over SGD (Foret et al. 2021, Alg. 1, Eq. 2)")
)
ASAM_SPEC = register_optimizer(
    wrapped_spec("asam", SGD_SPEC, ASAM_HPARAMS, _wrap_asam, doc="ASAM over SGD (Kwon et al. 2021, ASAM Alg. 1)")
)
SAM_ADAMW_SPEC = register_optimizer(
    wrapped_spec(
        "sam_adamw",
        ADAMW_SPEC,
        SAM_HPARAMS,
        _wrap_sam,
        doc="SAM over AdamW (Foret et al. 2021; IRE paper Table 3 ViT arms)",
    )
)
