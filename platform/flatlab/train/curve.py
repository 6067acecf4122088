"""The smoothed training-loss curve of a run, for "optimizer steps to reach a target loss".

IRE paper, Fig. 4 compares optimizers by the number of optimizer steps each needs to reach the final
training loss of AdamW ("2x speed-up"). :class:`LossCurve` keeps that curve cheaply during training
(on the training device, no host sync per step);
:func:`flatlab.analysis.curve_points.first_step_at_or_below` reads a target off it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

import torch

from flatlab.analysis.curve_points import Point
from flatlab.train.precision import accumulation_dtype


class LossCurve:
    """Bias-corrected exponential moving average of the training loss, sampled every ``stride`` steps.

    After optimizer step t (1-based) with mini-batch loss x_t (the mean training loss, e.g. nats per
    token for language models), the EMA is ``e_t = s * e_{t-1} + (1 - s) * x_t`` with ``e_0 = 0`` and
    the curve's value is the bias-corrected ``e_t / (1 - s**t)`` (``s = smoothing``; ``s = 0``: the raw
    loss). Values at steps ``stride, 2*stride, ...`` are kept as 0-d tensors on the loss's device;
    when more than ``max_points`` are held, every other one is dropped and ``stride`` doubles, so at
    most ``max_points`` evenly spaced points are held (the resolution is ``stride`` steps).

    Args:
        smoothing: EMA factor ``s`` in [0, 1).
        max_points: most points held (>= 2).
        device: where the EMA lives (the training device); losses on another device are moved there.
        start_step: optimizer steps already taken before the first :meth:`update` (a run resumed from a
            checkpoint that holds no curve); the bias correction counts updates, not steps.

    Raises:
        ValueError: ``smoothing`` outside [0, 1) or ``max_points`` not an int >= 2.
    """

    def __init__(
        self, smoothing: float = 0.9, max_points: int = 1024, device: Any = "cpu", start_step: int = 0
    ) -> None:
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing < 1.0:
            raise ValueError(f"LossCurve: smoothing={smoothing!r}; expected a float in [0, 1)")
        if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 2:
            raise ValueError(f"LossCurve: max_points={max_points!r}; expected an int >= 2")
        self.smoothing = float(smoothing)
        self.max_points = max_points
        self.device = torch.device(device)
        # float64 for an exact checkpoint round trip through Python floats (MPS has no float64)
        self.dtype = accumulation_dtype(self.device)
        self.step = int(start_step)  # optimizer steps seen (the step of the latest update)
        self.count = 0  # updates folded into the EMA (the bias-correction exponent)
        self.stride = 1
        self._ema = torch.zeros((), dtype=self.dtype, device=self.device)
        self._steps: List[int] = []
        self._values: List[torch.Tensor] = []  # 0-d tensors on ``device``, bias-corrected

    def update(self, loss: torch.Tensor) -> None:
        """Fold one optimizer step's mean training loss (a 0-d tensor, detached here) into the curve.

        A few tiny tensor ops on ``loss``'s device; never reads the value back to the host.
        """
        x = loss.detach().to(device=self.device, dtype=self.dtype)
        self._ema.mul_(self.smoothing).add_(x, alpha=1.0 - self.smoothing)
        self.step += 1
        self.count += 1
        if self.step % self.stride == 0:
            self._steps.append(self.step)
            self._values.append(self._corrected())
            if len(self._values) > self.max_points:
                self._steps = self._steps[1::2]  # the multiples of 2 * stride: still evenly spaced
                self._values = self._values[1::2]
                self.stride *= 2

    def _corrected(self) -> torch.Tensor:
        """The bias-corrected EMA now, a new 0-d tensor (the correction factor is computed on the host)."""
        return self._ema / (1.0 - self.smoothing**self.count)

    def __len__(self) -> int:
        """Points held (at most ``max_points``; :meth:`points` may add the latest step)."""
        return len(self._values)

    def points(self) -> List[Point]:
        """``[(step, smoothed loss), ...]`` in increasing step order, as Python numbers (one host sync).

        The recorded points, then the latest step with the current value if it is not on the stride
        grid, so the last point is always ``(self.step, current EMA)``. Empty before the first update.
        """
        if self.count == 0:
            return []
        steps, values = list(self._steps), list(self._values)
        if not steps or steps[-1] != self.step:
            steps.append(self.step)
            values.append(self._corrected())
        return list(zip(steps, torch.stack(values).tolist()))

    def state_dict(self) -> Dict[str, Any]:
        """Plain Python numbers and lists: a resumed run continues the same curve bit-identically."""
        return {
            "smoothing": self.smoothing,
            "max_points": self.max_points,
            "step": self.step,
            "count": self.count,
            "stride": self.stride,
            "ema": float(self._ema),
            "steps": list(self._steps),
            "values": torch.stack(self._values).tolist() if self._values else [],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (onto this curve's device).

        Raises:
            ValueError: the state's ``smoothing`` or ``max_points`` differ from this curve's.
        """
        if float(state["smoothing"]) != self.smoothing or int(state["max_points"]) != self.max_points:
            raise ValueError(
                f"LossCurve: checkpoint has smoothing={state['smoothing']}, max_points={state['max_points']}; "
                f"this curve has smoothing={self.smoothing}, max_points={self.max_points}"
            )
        self.step, self.count, self.stride = int(state["step"]), int(state["count"]), int(state["stride"])
        self._ema = torch.tensor(float(state["ema"]), dtype=self.dtype, device=self.device)
        self._steps = [int(s) for s in state["steps"]]
        self._values = [torch.tensor(float(v), dtype=self.dtype, device=self.device) for v in state["values"]]
