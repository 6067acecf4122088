"""IRE: Implicit Regularization Enhancement over any base optimizer (Wang et al., NeurIPS 2024).

The practical IRE as the authors' code runs it: the base optimizer steps, Δ = θ_new − θ_old, then

    θ ← θ_old + (1 + κ·n) ⊙ Δ

with n a 0/1 mask of "flat" coordinates: the ⌊γ·p⌋ of all p ranked coordinates (all parameter groups
together) with the smallest curvature h = g_ŷ ⊙ g_ŷ, g_ŷ the gradient of the loss on labels sampled
from the model's softmax (``closure.with_sampled_grads``, the step's primary pass), refreshed every
K = ``mask_interval`` active steps. The mask acts on the base's whole step; its state is never
amplified. Before switch-on (``switch_*``) the optimizer is exactly its base.

Equations, the exact threshold select and ranking |g| without squaring, switch-on criteria, metrics,
data parallelism, the amplified AdamW step, memory and cost, the options and where they follow the
authors' code: ``docs/algorithms/ire.md``.

Over torch's CPU AdamW the update is computed inside AdamW's own passes
(:mod:`flatlab.optim._amplified_adamw`); over any other base, θ_old is kept and blended after its step.

This module is one algorithm kept whole (over 500 lines): the hyperparameters, the mask's refresh,
switch-on, the step and its metrics are the one IRE update (``docs/algorithms/ire.md``), read together;
the exact select of the threshold is :mod:`flatlab.optim._select`.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction
from typing import Any, Callable, ContextManager, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from flatlab.hparams import HParam
from flatlab.optim import _amplified_adamw
from flatlab.optim._flat import persistent_buffers
from flatlab.optim._select import SELECT_CHUNK, at_most, kth_smallest_nonnegative, square_tie_ceiling
from flatlab.optim._subnormal import flushed_subnormals
from flatlab.optim.basic import ADAMW_SPEC, SGD_SPEC
from flatlab.optim.protocol import (
    Closure,
    as_closure,
    local_pass,
    passes_of,
    ranks_mean,
    step_may_be_skipped,
    step_skipped,
)
from flatlab.optim.registry import register_optimizer
from flatlab.optim.sam import SAM_ADAMW_SPEC, SAM_SPEC
from flatlab.optim.wrapper import WrappedOptimizer, require_closure, wrapped_spec

__all__ = ["IRE", "IRE_HPARAMS", "flat_count", "SGD_IRE_SPEC", "ADAMW_IRE_SPEC", "SAM_IRE_SPEC", "SAM_ADAMW_IRE_SPEC"]

KAPPA = HParam(
    "kappa", 2.0, float, low=0.0, doc="κ: flat coordinates move (1+κ)× the base step; paper: 1-2 CNN, 20-50 ViT"
)
GAMMA = HParam(
    "gamma",
    0.8,
    float,
    low=0.0,
    high=1.0,
    low_open=True,
    high_open=True,
    doc="γ: fraction of coordinates taken as flat, ⌊γ·p⌋ of p (the authors' earlier top-k code: p − ⌊(1−γ)·p⌋ + 1)",
)
MASK_INTERVAL = HParam("mask_interval", 10, int, low=1, doc="K: active steps between curvature refreshes (paper: 10)")
CURVATURE_BETA = HParam("curvature_beta", 0.0, float, low=0.0, high=1.0, high_open=True, doc="EMA β of h (authors: 0)")
SWITCH_EPOCH = HParam("switch_epoch", None, int, low=0, nullable=True, doc="switch on from this 0-based epoch")
SWITCH_STEP = HParam("switch_step", None, int, low=0, nullable=True, doc="switch on from this 0-based step")
SWITCH_AT_WARMUP_END = HParam("switch_at_warmup_end", False, bool, doc="switch on when LR warm-up ends (LLMs)")
SWITCH_LOSS = HParam(
    "switch_loss",
    None,
    float,
    low=0.0,
    low_open=True,
    nullable=True,
    doc="switch on once last epoch's train loss < this",
)
KAPPA_DECAY = HParam("kappa_decay", False, bool, doc="κ_t = κ·lr_t/lr_max (decays with the LR schedule)")
LOG_FLAT_FRACTION = HParam(
    "log_flat_fraction", False, bool, doc="also report opt/flat_fraction/<parameter name> (per tensor, active steps)"
)
IRE_HPARAMS = (
    KAPPA,
    GAMMA,
    MASK_INTERVAL,
    CURVATURE_BETA,
    SWITCH_EPOCH,
    SWITCH_STEP,
    SWITCH_AT_WARMUP_END,
    SWITCH_LOSS,
    KAPPA_DECAY,
    LOG_FLAT_FRACTION,
)


def flat_count(gamma: float, numel: int) -> int:
    """⌊γ·numel⌋ with γ read as the decimal it prints as (0.29·100 gives 29, not 28): the count of the
    authors' later ``ire_new.py``; their earlier top-k code marks n − ⌊(1−γ)·n⌋ + 1 (``docs/algorithms/ire.md``)."""
    return math.floor(Fraction(repr(float(gamma))) * numel)


class _CurvatureClosure:
    """The closure handed to the base on refresh steps: its first primary call is the curvature pass."""

    def __init__(
        self, inner: Closure, params: Sequence[torch.Tensor], on_sampled: Callable[[List[Optional[torch.Tensor]]], None]
    ):
        self.inner = inner
        self.params = list(params)
        self.on_sampled = on_sampled
        self.called = False

    def __call__(self) -> torch.Tensor:
        if self.called:
            return self.inner()
        self.called = True
        loss, sampled = self.inner.with_sampled_grads(self.params)
        if not step_skipped(self.inner):  # an overflowed pass (fp16) gives no curvature to rank
            self.on_sampled(sampled)
        return loss

    @property
    def overflowed(self) -> bool:
        return step_skipped(self.inner)

    def extra(self) -> torch.Tensor:
        return self.inner.extra()

    def with_sampled_grads(self, params: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, List[Optional[torch.Tensor]]]:
        return self.inner.with_sampled_grads(params)

    def no_sync(self) -> ContextManager[None]:  # data parallelism: forwarded to the trainer's closure
        return local_pass(self.inner)

    def reduce_mean(self, value: torch.Tensor) -> torch.Tensor:
        return ranks_mean(self.inner, value)


class IRE(WrappedOptimizer):
    """IRE over ``base`` (SGD → SGD-IRE, AdamW → AdmIRE, SAM → SAM-IRE; Wang et al. 2024, practical IRE).

    Args:
        base: any ``torch.optim.Optimizer`` (wrappers included) whose ``step(closure)`` calls the
            closure; ``param_groups`` are shared. Compose with IRE outermost (``IRE(SAM(SGD))``).
        kappa: κ ≥ 0, extra multiple of the base step given to flat coordinates (dimensionless).
        gamma: γ ∈ (0, 1), fraction of coordinates taken as flat.
        mask_interval: K ≥ 1, active steps between curvature refreshes.
        curvature_beta: β ∈ [0, 1), EMA factor of h.
        switch_epoch, switch_step, switch_at_warmup_end, switch_loss: switch-on criteria.
        kappa_decay: scale κ by lr_t/lr_max per group.
        log_flat_fraction: report ``opt/flat_fraction/<name>`` per parameter tensor.

    Memory: 2.25 parameter copies between steps (θ_old, the mask, the lerp weights), 1.25 over CPU
    AdamW; cost: one extra backward every K active steps plus two elementwise passes per step
    (``docs/algorithms/ire.md``).

    Raises:
        ConfigError: a value outside its range (message names the field and the allowed values).
    """

    _state_tag = "ire"
    _persistent_state = ("mask", "curvature")

    def __init__(
        self,
        base: torch.optim.Optimizer,
        kappa: float = 2.0,
        gamma: float = 0.8,
        mask_interval: int = 10,
        curvature_beta: float = 0.0,
        switch_epoch: Optional[int] = None,
        switch_step: Optional[int] = None,
        switch_at_warmup_end: bool = False,
        switch_loss: Optional[float] = None,
        kappa_decay: bool = False,
        log_flat_fraction: bool = False,
    ) -> None:
        super().__init__(base)
        where = "IRE"
        self.kappa = KAPPA.validate(kappa, where)
        self.gamma = GAMMA.validate(gamma, where)
        self.mask_interval = MASK_INTERVAL.validate(mask_interval, where)
        self.curvature_beta = CURVATURE_BETA.validate(curvature_beta, where)
        self.switch_epoch = SWITCH_EPOCH.validate(switch_epoch, where)
        self.switch_step = SWITCH_STEP.validate(switch_step, where)
        self.switch_at_warmup_end = SWITCH_AT_WARMUP_END.validate(switch_at_warmup_end, where)
        self.switch_loss = SWITCH_LOSS.validate(switch_loss, where)
        self.kappa_decay = KAPPA_DECAY.validate(kappa_decay, where)
        self.log_flat_fraction = LOG_FLAT_FRACTION.validate(log_flat_fraction, where)
        criteria = (self.switch_epoch, self.switch_step, self.switch_loss)
        self._needs_switch = any(c is not None for c in criteria) or self.switch_at_warmup_end
        self._active = not self._needs_switch
        self._steps = 0  # step() calls so far
        self._since_refresh: Optional[int] = None  # active steps since the mask was computed (None: no mask)
        self._lr_max = [float(g["lr"]) for g in self.param_groups]
        self._flat_fraction: Any = 0.0  # fraction of ranked coordinates marked flat by the last refresh
        self._warned = False
        self._mask_version = 0  # bumped when masks change; keys the buffers built from them (_from_masks)
        # (buffer key, group index) -> (mask version, κ_t, tensors) the buffer was built from
        self._built: Dict[Tuple[str, int], Tuple[int, float, int]] = {}
        self._layer_fractions: Dict[str, float] = {}  # log_flat_fraction: per-tensor flat fractions of the mask
        self._last_step: Optional[Tuple[int, bool]] = None  # (index, refreshed) of the step just taken

    def _describe(self) -> str:
        return f"kappa={self.kappa}, gamma={self.gamma}, mask_interval={self.mask_interval}"

    # ------------------------------------------------------------------ switch-on and kappa
    @property
    def active(self) -> bool:
        """Whether IRE has switched on (latched)."""
        return self._active

    def switch_on(self) -> None:
        """Switch IRE on now (latches), whatever the criteria."""
        self._active = True

    def _maybe_switch(self) -> None:
        if self._active:
            return
        p = self._progress
        step = p.step if p is not None else self._steps
        due = self.switch_step is not None and step >= self.switch_step
        if p is None:
            if (
                not due
                and not self._warned
                and (self.switch_epoch is not None or self.switch_loss is not None or self.switch_at_warmup_end)
            ):
                warnings.warn(
                    "IRE: switch criteria need on_progress(Progress); only switch_step is evaluated without it",
                    stacklevel=3,
                )
                self._warned = True
        else:
            due = due or (self.switch_epoch is not None and p.epoch >= self.switch_epoch)
            due = due or (self.switch_at_warmup_end and p.step >= p.warmup_steps)
            due = due or (
                self.switch_loss is not None
                and p.last_epoch_train_loss is not None
                and p.last_epoch_train_loss < self.switch_loss
            )
        self._active = due

    def kappa_at(self, group_index: int) -> float:
        """κ_t for parameter group ``group_index`` (before the switch-on test)."""
        if not self.kappa_decay:
            return self.kappa
        group = self.param_groups[group_index]
        lr = float(group["lr"])
        while len(self._lr_max) <= group_index:  # groups added after construction
            self._lr_max.append(float(self.param_groups[len(self._lr_max)]["lr"]))
        lr_max = float(group.get("initial_lr", self._lr_max[group_index]))
        return self.kappa * lr / lr_max if lr_max > 0 else 0.0

    # ------------------------------------------------------------------ mask
    @torch.no_grad()
    def _refresh_mask(self, params: Sequence[torch.Tensor], sampled: Sequence[Optional[torch.Tensor]]) -> None:
        self._compute_mask(params, sampled)
        if self.log_flat_fraction:
            self._layer_fractions = self._fractions_by_tensor(params)

    def _tensor_names(self) -> Dict[torch.Tensor, str]:
        """Parameter -> metric suffix: its name (groups built from named parameters), else ``param<i>``."""
        out: Dict[torch.Tensor, str] = {}
        i = 0
        for g in self.param_groups:
            names = g.get("param_names")
            for j, p in enumerate(g["params"]):
                out[p] = names[j] if names is not None else f"param{i}"
                i += 1
        return out

    @torch.no_grad()
    def _fractions_by_tensor(self, params: Sequence[torch.Tensor]) -> Dict[str, float]:
        # one count per tensor, read to the host together (one sync per refresh)
        names = self._tensor_names()
        masks = [self.state[p]["mask"] for p in params]
        if not masks:
            return {}
        counts = torch.stack([torch.count_nonzero(m).to(masks[0].device) for m in masks]).tolist()
        return {names[p]: c / max(1, p.numel()) for p, c in zip(params, counts)}

    @torch.no_grad()
    def _compute_mask(self, params: Sequence[torch.Tensor], sampled: Sequence[Optional[torch.Tensor]]) -> None:
        # The ranking keys for every ranked coordinate, in float32, and ONE threshold over all of them. The
        # keys are |g| (β = 0: h = fl(g²) is never formed, docs/algorithms/ire.md) or the curvature EMA (β > 0).
        # Up to SELECT_CHUNK coordinates in all, they are one concatenated vector (at most 2 MB; one
        # kernel per pass instead of one per tensor). Above that the tensors are ranked where they are:
        # float32 sampled gradients, which are scratch (the closure hands them over), are made |g| in
        # place, so no copy is ever made.
        ranked = [(p, g.detach()) for p, g in zip(params, sampled) if g is not None]
        for p, g in zip(params, sampled):
            if g is None:  # the loss does not reach p: not ranked, never amplified
                self.state[p]["mask"] = torch.zeros_like(p, dtype=torch.bool)
        self._mask_version += 1
        if not ranked:
            self._flat_fraction = 0.0
            return
        device = ranked[0][1].device
        by_magnitude = self.curvature_beta == 0
        if not by_magnitude:
            hs = []
            for p, g in ranked:
                ema = self.state[p].get("curvature")
                if ema is None:
                    ema = torch.zeros_like(g, dtype=torch.float32)
                g32 = g.float()
                # a new tensor, not an in-place update: a skipped step (fp16 overflow) puts the old one back
                new = torch.mul(ema, self.curvature_beta).addcmul_(g32, g32, value=1.0 - self.curvature_beta)
                self.state[p]["curvature"] = new
                hs.append(new)
        else:
            hs = [g for _, g in ranked]
        total = sum(h.numel() for h in hs)
        flat: Optional[torch.Tensor] = None
        if total <= SELECT_CHUNK:
            flat = torch.cat([h.reshape(-1).to(device=device, dtype=torch.float32) for h in hs])
            keys: List[torch.Tensor] = [flat]
        else:
            if by_magnitude:
                hs = [g if g.dtype == torch.float32 else g.float() for g in hs]
            keys = hs
        if by_magnitude:
            # |g| in place, as a bit operation (a NaN stays NaN, now positive); from here on the keys are
            # these bit patterns (int32), which the select takes without clearing the sign bit again
            keys = [key.view(torch.int32).bitwise_and_(0x7FFFFFFF) for key in keys]
        # the select runs on one device (a model split over devices: copies of the other tensors' keys)
        parts = [key if key.device == device else key.to(device) for key in keys]
        k = flat_count(self.gamma, total)
        if k == 0:
            for p, _ in ranked:
                self.state[p]["mask"] = torch.zeros_like(p, dtype=torch.bool)
            self._flat_fraction = 0.0
            return
        # threshold = torch.kthvalue(all keys, k); key ≤ threshold is flat (ties included)
        value = kth_smallest_nonnegative(parts, k)
        if by_magnitude:
            # h_i ≤ kthvalue(h) with h = fl(g²) ⟺ |g_i| ≤ G, G the largest float32 whose square rounds to at
            # most fl(a²), a = kthvalue(|g|): non-negative float32 numbers compare like their bit patterns
            bound: Union[int, float] = -1 if math.isnan(float(value)) else square_tie_ceiling(value)  # h ≤ NaN: nowhere
        else:
            bound = float(value)  # NaN (a diverged step) marks nothing
        # the masks, and how many are set (the metric), in one pass over the keys
        masks = [torch.empty(key.shape, dtype=torch.bool, device=key.device) for key in keys]
        count = sum(at_most(key, bound, m) for key, m in zip(keys, masks))
        if flat is not None:
            masks = list(masks[0].split([p.numel() for p, _ in ranked]))
        for (p, _), m in zip(ranked, masks):
            self.state[p]["mask"] = m.view(p.shape).to(p.device)
        self._flat_fraction = count / total

    @torch.no_grad()
    def _from_masks(
        self, params: Sequence[torch.Tensor], kappas: Sequence[float], key: str, offset: float, slope: float
    ) -> Dict[torch.Tensor, torch.Tensor]:
        # offset + slope·κ_t·n for each parameter of ``params`` that has a mask, in its dtype, in the scratch
        # buffer state[p][key]; rebuilt when the masks or its group's κ_t change. Groups with κ_t = 0 have none.
        chosen, out = set(params), {}
        for i, (group, kappa) in enumerate(zip(self.param_groups, kappas)):
            ps = [p for p in group["params"] if p in chosen and "mask" in self.state[p]]
            if not ps or kappa == 0:
                continue
            before = [self.state[p].get(key) for p in ps]
            bufs = persistent_buffers(self.state, ps, key)
            fresh = any(b is not old for b, old in zip(bufs, before))  # (re)allocated: contents are garbage
            if fresh or self._built.get((key, i)) != (self._mask_version, kappa, len(ps)):
                # from the masks' bytes (a bool -> float copy is several times slower on the CPU), then
                # scaled and shifted in the buffer's dtype
                masks = [self.state[p]["mask"] for p in ps]
                torch._foreach_copy_(bufs, [m.view(torch.uint8) if m.dtype == torch.bool else m for m in masks])
                torch._foreach_mul_(bufs, slope * kappa)
                if offset:
                    torch._foreach_add_(bufs, offset)
                self._built[(key, i)] = (self._mask_version, kappa, len(ps))
            out.update(zip(ps, bufs))
        return out

    @torch.no_grad()
    def _amplify(self, params: Sequence[torch.Tensor], kappas: Sequence[float]) -> None:
        # θ ← θ_new + κ·n⊙(θ_new − θ_old) = lerp(θ_new, θ_old, w) with w = −κ·n: ONE fused pass per
        # tensor (lerp computes θ_new + w·(θ_old − θ_new)); where n = 0, w = 0 and θ_new is kept exactly.
        weights = self._from_masks(params, kappas, "weight", 0.0, -1.0)
        if weights:
            ps = list(weights)
            torch._foreach_lerp_(ps, [self.state[p]["theta"] for p in ps], [weights[p] for p in ps])

    def _drop(self, params: Sequence[torch.Tensor], *keys: str) -> None:
        # free these scratch buffers (the other way of stepping needs its own); rebuilt when next needed
        for p in params:
            for key in keys:
                self.state[p].pop(key, None)
        self._built = {k: v for k, v in self._built.items() if k[0] not in keys}

    def _keep_theta(self, params: Sequence[torch.Tensor]) -> None:
        theta = persistent_buffers(self.state, params, "theta")
        with torch.no_grad():
            torch._foreach_copy_(theta, params)

    def _adamw_step(
        self, closure: Optional[Callable[[], torch.Tensor]], params: Sequence[torch.Tensor], kappas: Sequence[float]
    ) -> Tuple[Optional[torch.Tensor], bool]:
        # AdamW's step is its closure, then its update: run the closure here (masks refresh inside it), then
        # either the amplified update in AdamW's own passes (no θ_old: flatlab.optim._amplified_adamw) or,
        # where that does not apply, θ_old kept, torch's step, and the blend. Returns (loss, blend needed).
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if _amplified_adamw.applies(self.base):
            self._drop(params, "theta", "weight")  # the blend's buffers, from steps that took the other way
            # s = 1 + κ_t·n: each coordinate's multiple of AdamW's step
            _amplified_adamw.amplified_adamw_step(self.base, self._from_masks(params, kappas, "scale", 1.0, 1.0))
            return loss, False
        self._drop(params, "scale")
        self._keep_theta(params)
        self.base.step()
        return loss, True

    # ------------------------------------------------------------------ step
    def step(self, closure: Optional[Callable[[], torch.Tensor]] = None) -> Optional[torch.Tensor]:  # type: ignore[override]
        """The base step, then the flat coordinates' part of it amplified by κ (once switched on).

        The whole step, the closure's passes included, runs with subnormal floats flushed to zero on the
        calling thread, as in a trial; the caller's mode is given back after it
        (:func:`flatlab.optim._subnormal.flushed_subnormals`).

        Args:
            closure: a :class:`flatlab.optim.Closure`; needed on refresh steps (``with_sampled_grads``).
                May be ``None`` on other steps if the gradients are already in ``p.grad`` and the base
                accepts that.
        Returns:
            Whatever the base's step returns (the primary pass's loss for closure-driven bases).
        Raises:
            ValueError: a curvature refresh is due and ``closure`` is None.
            RuntimeError: the base did not call the closure on a refresh step.
        """
        with flushed_subnormals():
            return self._step(closure)

    def _step(self, closure: Optional[Callable[[], torch.Tensor]]) -> Optional[torch.Tensor]:
        self._maybe_switch()
        index = self._progress.step if self._progress is not None else self._steps  # for step_passes
        self._steps += 1
        kappas = [self.kappa_at(i) for i in range(len(self.param_groups))]
        if not self._active or not any(k > 0 for k in kappas):
            loss = self.base.step(closure)  # exactly the base: no curvature pass, no copy
            self._last_step = (index, False)
            if step_skipped(closure):
                self._steps -= 1
                return loss
            self._metrics.add("opt/ire_active", float(self._active))
            self._metrics.add("opt/flat_fraction", 0.0)
            self._metrics.add("opt/kappa", kappas[0] if self._active else 0.0)
            return loss

        params = [p for p in self._params() if p.requires_grad]
        refresh = self._since_refresh is None or self._since_refresh >= self.mask_interval
        self._last_step = (index, refresh)  # a skipped step (fp16) spent its passes too
        run_closure: Optional[Callable[[], torch.Tensor]] = closure
        wrapped = None
        if refresh:
            c = as_closure(require_closure(closure, "IRE (curvature refresh)"))
            wrapped = _CurvatureClosure(c, params, lambda sampled: self._refresh_mask(params, sampled))
            run_closure = wrapped
        # what a refresh replaces (references, no copies), put back if the step is skipped; held only when
        # a skip is possible (fp16), as the old masks then stay alive until the step ends (+1/4 copy)
        kept = (
            [(p, self.state[p].get("mask"), self.state[p].get("curvature")) for p in params]
            if refresh and step_may_be_skipped(closure)
            else []
        )
        kept_fraction = self._flat_fraction
        if type(self.base) is torch.optim.AdamW:
            loss, blend = self._adamw_step(run_closure, params, kappas)
        else:
            self._keep_theta(params)
            loss, blend = self.base.step(run_closure), True
        if step_skipped(closure):  # a pass overflowed (fp16): the base stepped nothing; undo our own state
            self._undo(kept, kept_fraction if refresh else None)
            return loss
        if wrapped is not None:
            if not wrapped.called:
                raise RuntimeError(
                    f"IRE: the base optimizer {type(self.base).__name__} did not call the closure, so the "
                    "curvature pass could not run; use a base whose step(closure) calls it"
                )
            self._since_refresh = 0
        assert self._since_refresh is not None
        self._since_refresh += 1
        if blend:
            self._amplify(params, kappas)
        self._metrics.add("opt/ire_active", 1.0)
        self._metrics.add("opt/flat_fraction", self._flat_fraction)
        self._metrics.add("opt/kappa", kappas[0])
        for name, fraction in self._layer_fractions.items():
            self._metrics.add(f"opt/flat_fraction/{name}", fraction)
        return loss

    # ------------------------------------------------------------------ cost
    def step_passes(self, step: int) -> Tuple[int, int]:
        """The base's passes for step ``step`` (0-based), plus one backward when it refreshes the mask:
        the sampled-label gradient reuses the primary pass's forward graph (``with_sampled_grads``), so
        a refresh adds a backward, not a forward (:func:`flatlab.optim.protocol.passes_of`).

        The step just taken answers what it did. Any other step is predicted for a run from step 0:
        refreshes every K = ``mask_interval`` steps from switch-on, none with κ = 0. Switch-on is at
        step 0 without criteria, else at the earliest of ``switch_step``, ``switch_epoch`` epochs and
        the warm-up's end (both known once ``on_progress`` has been called); a loss criterion, or one
        whose steps are unknown, is taken as met at step 0 (an upper bound on the cost). κ decayed to
        0 by the schedule, and fp16-skipped steps, can make the actual refreshes fewer.
        """
        forward, backward = passes_of(self.base, step)
        if self._last_step is not None and self._last_step[0] == step:
            return forward, backward + int(self._last_step[1])
        start = self._predicted_switch()
        refresh = self.kappa > 0 and step >= start and (step - start) % self.mask_interval == 0
        return forward, backward + int(refresh)

    def _predicted_switch(self) -> int:
        # the step from which IRE runs, as step_passes predicts it (see there)
        if not self._needs_switch or self.switch_loss is not None:
            return 0
        p = self._progress
        known = [self.switch_step] if self.switch_step is not None else []
        if self.switch_epoch is not None:
            known.append(self.switch_epoch * p.steps_per_epoch if p is not None else 0)
        if self.switch_at_warmup_end:
            known.append(p.warmup_steps if p is not None else 0)
        return min(known)

    def _undo(self, kept: Sequence[Tuple[torch.Tensor, Any, Any]], kept_fraction: Optional[Any]) -> None:
        # a skipped step: the step counter, and the masks and curvature a refresh replaced, as they were
        self._steps -= 1
        for p, mask, curvature in kept:
            for key, value in (("mask", mask), ("curvature", curvature)):
                if value is None:
                    self.state[p].pop(key, None)
                else:
                    self.state[p][key] = value
        if kept_fraction is not None:  # the step refreshed the mask
            self._flat_fraction = kept_fraction
            self._mask_version += 1  # the lerp weights are rebuilt from the restored masks

    # ------------------------------------------------------------------ checkpoints
    def _extra_state(self) -> Dict[str, Any]:
        ff = self._flat_fraction
        return {
            "steps": self._steps,
            "active": self._active,
            "since_refresh": self._since_refresh,
            "lr_max": list(self._lr_max),
            "flat_fraction": float(ff),
            "layer_fractions": dict(self._layer_fractions),
        }

    def _load_extra_state(self, extra: Mapping[str, Any]) -> None:
        self._steps = int(extra.get("steps", 0))
        self._active = bool(extra.get("active", not self._needs_switch))
        since = extra.get("since_refresh")
        self._since_refresh = None if since is None else int(since)
        self._lr_max = [float(x) for x in extra.get("lr_max", self._lr_max)]
        self._flat_fraction = float(extra.get("flat_fraction", 0.0))
        self._layer_fractions = {str(k): float(v) for k, v in extra.get("layer_fractions", {}).items()}
        self._mask_version += 1  # masks were replaced: rebuild the lerp weights


def _wrap_ire(base: torch.optim.Optimizer, **kw: Any) -> IRE:
    return IRE(base, **kw)


SGD_IRE_SPEC = register_optimizer(
    wrapped_spec("sgd_ire", SGD_SPEC, IRE_HPARAMS, _wrap_ire, doc="SGD-IRE (Wang et al., NeurIPS 2024)")
)
# AdmIRE: the paper's betas (0.9, 0.95) and weight decay 0.1 as defaults; its eps 1e-16 (LLM runs) is not
# a sensible general default and is left at AdamW's 1e-8; gradient clipping (1.0) is the trainer's.
ADAMW_IRE_SPEC = register_optimizer(
    wrapped_spec(
        "adamw_ire",
        ADAMW_SPEC,
        IRE_HPARAMS,
        _wrap_ire,
        doc="AdmIRE: AdamW + IRE (Wang et al. 2024; betas (0.9, 0.95), wd 0.1 as in the paper)",
        base_defaults={"beta2": 0.95, "weight_decay": 0.1},
    )
)
SAM_IRE_SPEC = register_optimizer(
    wrapped_spec(
        "sam_ire", SAM_SPEC, IRE_HPARAMS, _wrap_ire, doc="SAM-IRE: mask from the gradient at θ (Wang et al. 2024)"
    )
)
SAM_ADAMW_IRE_SPEC = register_optimizer(
    wrapped_spec(
        "sam_adamw_ire",
        SAM_ADAMW_SPEC,
        IRE_HPARAMS,
        _wrap_ire,
        doc="SAM-IRE over AdamW: IRE(SAM(AdamW)), mask from the gradient at θ (Wang et al. 2024, Table 3 ViT arms)",
    )
)
