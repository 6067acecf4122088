"""Numeric precision of a trial: running-sum dtypes, autocast (bf16/fp16) and fp16 loss scaling.

The trainer parameter ``precision`` picks one of :data:`PRECISIONS`:

* ``fp32``: no autocast, no loss scaling; every pass in the parameters' own dtype.
* ``bf16``: every forward pass of a step (primary, SAM/TSAM extra passes, IRE's curvature pass) runs under
  ``torch.autocast(dtype=torch.bfloat16)``; parameters, gradients and optimizer state stay float32, the
  loss is taken in float32. bf16 has float32's exponent range, so no loss scaling is needed.
* ``fp16``: the same with float16, plus dynamic loss scaling (:class:`LossScaler`) done right for
  multi-pass optimizers: every pass scales its own loss, unscales its own gradient exactly once, and
  checks it; a non-finite gradient in ANY pass of a step skips the whole step (parameters and optimizer
  state untouched) and backs the scale off. One ``torch.amp.GradScaler`` cannot do this: it allows one
  ``unscale_`` per optimizer step (the "unscale twice" failure of SAM ports, davda54/sam#79).

What the optimizers compute from the gradients (SAM's ε, TSAM's tilt weights and losses, IRE's curvature
h and its threshold) stays float32, because the gradients themselves are float32 (autocast never changes
a parameter's dtype) and the closure hands back float32 losses.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, Mapping, Optional, Sequence

import torch

from flatlab.errors import ConfigError

PRECISIONS = ("fp32", "bf16", "fp16")
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def accumulation_dtype(device: torch.device | str) -> torch.dtype:
    """float64 for running sums kept on ``device`` (epoch loss sums, loss curves); float32 on Apple's MPS
    backend, which has no float64."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


class LossScaler:
    """Dynamic loss scale for fp16 training with optimizers that take several passes per step.

    The same rule as ``torch.amp.GradScaler`` (Micikevicius et al. 2018, "Mixed Precision Training",
    Sec. 3.2): the loss is multiplied by ``scale`` before each backward pass; the gradients are divided by
    it after the pass; a step with a non-finite gradient is skipped and the scale multiplied by
    ``backoff_factor``; after ``growth_interval`` consecutive finite steps it is multiplied by
    ``growth_factor``. Unlike GradScaler, unscaling is per PASS (:meth:`unscale_`, called by the closure
    once after each forward/backward), and the skip decision is per STEP (:meth:`update`, called by the
    trainer once after ``optimizer.step``).

    Args:
        init_scale: the first scale (a power of two, so unscaling is exact). Default 2^16 as GradScaler.
        growth_factor, backoff_factor: > 1 and in (0, 1).
        growth_interval: finite steps between growths, ≥ 1.

    Raises:
        ConfigError: a value outside those ranges.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        if not init_scale > 0 or not growth_factor > 1 or not 0 < backoff_factor < 1 or growth_interval < 1:
            raise ConfigError(
                "LossScaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1; got "
                f"init_scale={init_scale}, growth_factor={growth_factor}, backoff_factor={backoff_factor}, "
                f"growth_interval={growth_interval}"
            )
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.growth_tracker = 0  # consecutive finite steps since the last change of scale
        self.skipped = 0  # steps skipped since the last pop_skipped()

    @torch.no_grad()
    def unscale_(self, grads: Sequence[torch.Tensor]) -> bool:
        """Divide ``grads`` (one pass's gradients, in place) by the scale; True if any entry is non-finite.

        Uses torch's fused ``_amp_foreach_non_finite_check_and_unscale_`` per device and dtype; the answer is
        read to the host once (one device sync per pass: fp16 only; bf16 and fp32 never sync here).
        """
        by_key: Dict[Any, list] = {}
        for g in grads:
            by_key.setdefault((g.device, g.dtype), []).append(g)
        found = False
        for (device, _), gs in by_key.items():
            flag = torch.zeros(1, dtype=torch.float32, device=device)
            inv = torch.full((1,), 1.0 / self.scale, dtype=torch.float32, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(gs, flag, inv)
            found = found or bool(flag.item())
        return found

    def update(self, overflowed: bool) -> None:
        """After a step: back off (and count a skipped step) if it overflowed, else maybe grow."""
        if overflowed:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
            self.skipped += 1
            return
        self.growth_tracker += 1
        if self.growth_tracker >= self.growth_interval:
            self.scale *= self.growth_factor
            self.growth_tracker = 0

    def pop_skipped(self) -> int:
        """Steps skipped since the previous call (reported per epoch as ``train/skipped_steps``)."""
        n, self.skipped = self.skipped, 0
        return n

    def state_dict(self) -> Dict[str, Any]:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])


class Precision:
    """The numeric policy of one trial's passes (see the module docstring).

    Args:
        kind: ``'fp32'``, ``'bf16'`` or ``'fp16'``.
        device: where the model runs (autocast is per device type).

    Attributes:
        kind, dtype (``None`` for fp32), scaler (a :class:`LossScaler` for fp16, else ``None``).

    Raises:
        ConfigError: an unknown ``kind``; ``bf16`` on a CUDA device without bf16 support (pre-Ampere:
            use fp16 there).
    """

    def __init__(
        self, kind: str = "fp32", device: torch.device | str = "cpu", scaler: Optional[LossScaler] = None
    ) -> None:
        if kind not in PRECISIONS:
            raise ConfigError(f"precision={kind!r} is not allowed; expected one of {', '.join(PRECISIONS)}")
        self.kind = kind
        self.device_type = torch.device(device).type
        if (
            kind == "bf16"
            and self.device_type == "cuda"
            and not torch.cuda.is_bf16_supported(including_emulation=False)
        ):
            raise ConfigError("precision='bf16': this CUDA device has no native bfloat16; use precision='fp16'")
        self.dtype: Optional[torch.dtype] = _AUTOCAST_DTYPES.get(kind)
        self.scaler: Optional[LossScaler] = (scaler or LossScaler()) if kind == "fp16" else None

    def autocast(self) -> ContextManager[Any]:
        """``torch.autocast`` for this device and dtype; a null context for fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def __repr__(self) -> str:
        return f"Precision({self.kind!r}, device_type={self.device_type!r})"
