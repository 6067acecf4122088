"""Shared fixtures-as-functions for the optimizer tests: tiny models, batches, toy closures."""

from __future__ import annotations

import copy
import io
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from flatlab.train.closure import BatchClosure


def small_cnn(seed: int = 0, classes: int = 5) -> nn.Module:
    """Conv-BN-ReLU ×2 + linear head on 3×8×8 inputs (a few thousand parameters)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.Conv2d(6, 6, 3, padding=1, stride=2),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(6 * 4 * 4, classes),
    )


def mlp(seed: int = 0, d_in: int = 6, hidden: int = 8, classes: int = 4, bias: bool = True) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden, bias=bias), nn.ReLU(), nn.Linear(hidden, classes, bias=bias))


def image_batch(seed: int = 1, n: int = 16, classes: int = 5) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, classes, (n,), generator=g)


def vector_batch(seed: int = 1, n: int = 32, d_in: int = 6, classes: int = 4) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g), torch.randint(0, classes, (n,), generator=g)


def closure_for(model: nn.Module, batch: Tuple[torch.Tensor, torch.Tensor]) -> BatchClosure:
    return BatchClosure(model, F.cross_entropy, *batch)


def params_of(model: nn.Module) -> List[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def assert_bitwise(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y), (x - y).abs().max()


def _ordered_bits(x: torch.Tensor) -> torch.Tensor:
    # the bit patterns of finite floats as int64 integers in the numbers' order (-0.0 and 0.0 both 0)
    bits = x.contiguous().view({torch.float32: torch.int32, torch.float64: torch.int64}[x.dtype]).to(torch.int64)
    magnitude = bits & (0x7FFFFFFF if x.dtype == torch.float32 else 0x7FFFFFFFFFFFFFFF)
    return torch.where(bits < 0, -magnitude, magnitude)


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many steps between representable numbers of their dtype separate ``a`` and ``b``, elementwise
    (finite float32 or float64; 0 where equal, -0.0 equal to 0.0)."""
    return (_ordered_bits(a) - _ordered_bits(b)).abs()


def assert_within_rounding_of_step(
    a: torch.Tensor, b: torch.Tensor, step: torch.Tensor, ulps: int, steps: float
) -> None:
    """``a`` and ``b`` (parameters after an update, same shape and dtype) differ by at most ``ulps`` of
    ``b``'s spacing plus ``steps`` machine epsilons of the update ``step`` that produced ``b``: two
    computations of one update that round differently (each operation on the step rounds it by up to
    half an epsilon, relative), whose results then round to the parameter's spacing."""
    assert a.shape == b.shape == step.shape and a.dtype == b.dtype == step.dtype
    spacing = torch.nextafter(b.abs(), torch.full_like(b, float("inf"))) - b.abs()
    bound = ulps * spacing + steps * torch.finfo(b.dtype).eps * step.abs()
    excess = (a - b).abs() - bound
    assert a.numel() == 0 or float(excess.max()) <= 0, (
        f"{int((excess > 0).sum())} coordinates beyond the rounding bound"
    )


def roundtrip(obj: Dict) -> Dict:
    """What torch.save + torch.load give back (deep copy through bytes)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def twin(model: nn.Module, opt: torch.optim.Optimizer) -> Tuple[nn.Module, torch.optim.Optimizer]:
    """Deep copy of (model, optimizer) that keeps the optimizer pointing at the copied parameters."""
    return copy.deepcopy((model, opt))


class CountingClosure:
    """A Closure that delegates to ``inner`` and counts (and optionally records) each kind of pass."""

    def __init__(self, inner, on_sampled: Optional[Callable[[], None]] = None) -> None:
        self.inner = inner
        self.primary = 0
        self.extra_calls = 0
        self.sampled = 0
        self.extra_losses: List[torch.Tensor] = []
        self.on_sampled = on_sampled

    def __call__(self) -> torch.Tensor:
        self.primary += 1
        return self.inner()

    def extra(self) -> torch.Tensor:
        self.extra_calls += 1
        loss = self.inner.extra()
        self.extra_losses.append(loss)
        return loss

    def with_sampled_grads(self, params):
        self.sampled += 1
        if self.on_sampled is not None:
            self.on_sampled()
        return self.inner.with_sampled_grads(params)


class FunctionClosure:
    """Closure over an analytic loss ``fn(params) -> scalar`` (toy problems, no BatchNorm).

    ``with_sampled_grads`` cannot sample labels for a loss without a softmax; it returns the TRUE
    gradient instead (so IRE's curvature proxy becomes h = g⊙g), or ``sampled_fn(params)`` if given.
    """

    def __init__(
        self, fn: Callable[[Sequence[torch.Tensor]], torch.Tensor], params: Sequence[torch.Tensor], sampled_fn=None
    ):
        self.fn = fn
        self.params = list(params)
        self.sampled_fn = sampled_fn

    @torch.enable_grad()
    def __call__(self) -> torch.Tensor:
        for p in self.params:
            p.grad = None
        loss = self.fn(self.params)
        loss.backward()
        return loss.detach()

    def extra(self) -> torch.Tensor:
        return self()

    def with_sampled_grads(self, params):
        loss = self()
        if self.sampled_fn is not None:
            return loss, list(self.sampled_fn(params))
        return loss, [None if p.grad is None else p.grad.clone() for p in params]
