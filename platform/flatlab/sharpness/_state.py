"""Private helpers shared by the measures: parameter selection, eval mode, exact restore, noise draws."""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from flatlab.errors import ConfigError, UnknownNameError

NamedParams = List[Tuple[str, nn.Parameter]]
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def resolve_params(model: nn.Module, names: Optional[Sequence[str]]) -> NamedParams:
    """The ``(name, parameter)`` pairs to perturb, in ``model.named_parameters()`` order.

    ``names=None`` selects every floating-point parameter (trainable or not).

    Raises:
        UnknownNameError: a name that is not a parameter of ``model`` (lists some valid ones).
        ConfigError: an empty selection, or a parameter that is not floating point.
    """
    named = [(n, p) for n, p in model.named_parameters()]
    if names is None:
        chosen = [(n, p) for n, p in named if p.is_floating_point()]
        if not chosen:
            raise ConfigError(f"{type(model).__name__} has no floating-point parameters to perturb")
        return chosen
    if isinstance(names, str):
        raise ConfigError(f"params must be a sequence of parameter names, not the string {names!r}; wrap it in a list")
    wanted = list(dict.fromkeys(names))
    if not wanted:
        raise ConfigError("params selects no parameter; pass None for the whole model or a non-empty list of names")
    index = {n: i for i, (n, _) in enumerate(named)}
    unknown = [n for n in wanted if n not in index]
    if unknown:
        valid = [n for n, _ in named]
        shown = ", ".join(valid[:12]) + (f", ... ({len(valid)} in all)" if len(valid) > 12 else "")
        raise UnknownNameError(
            f"unknown parameter name {unknown[0]!r} for {type(model).__name__}; valid names: {shown}"
        )
    chosen = [named[i] for i in sorted(index[n] for n in wanted)]
    for n, p in chosen:
        if not p.is_floating_point():
            raise ConfigError(f"parameter {n!r} has dtype {p.dtype}; only floating-point parameters can be perturbed")
    return chosen


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Put every submodule in eval mode; restore each module's own ``training`` flag afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@contextlib.contextmanager
def preserved(params: NamedParams) -> Iterator[List[torch.Tensor]]:
    """Yield detached copies of ``params``; copy them back on exit (even on exception), bitwise exact."""
    saved = [p.detach().clone() for _, p in params]
    try:
        yield saved
    finally:
        with torch.no_grad():
            for (_, p), s in zip(params, saved):
                p.copy_(s)


def check_positive(name: str, value: float) -> float:
    """``float(value)``; raises :class:`ConfigError` unless it is finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0; got {value!r}")
    return float(value)


def check_count(name: str, value: int, minimum: int = 1) -> int:
    """``value``; raises :class:`ConfigError` unless it is an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return value


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (same seed -> same draws on that device)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an int; got {seed!r}")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def draw_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype noise is drawn in: float32 for fp16/bf16 (stream independent of low-precision kernels)."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def noise_buffer(like: torch.Tensor, leading: Tuple[int, ...] = ()) -> torch.Tensor:
    """An uninitialised buffer of shape ``(*leading, *like.shape)`` in :func:`draw_dtype` on ``like``'s device."""
    return torch.empty((*leading, *like.shape), dtype=draw_dtype(like.dtype), device=like.device)


def fill_standard_normal(buf: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Fill ``buf`` with ``N(0, 1)`` draws in place (same stream as ``torch.randn(buf.shape, generator=gen)``,
    without allocating: the loop reuses one buffer per tensor)."""
    return buf.normal_(generator=gen)


def standard_normal(like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``z ~ N(0, I)`` with the shape, device and dtype of ``like`` (drawn in :func:`draw_dtype`)."""
    return fill_standard_normal(noise_buffer(like), gen).to(like.dtype)


def rademacher(like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Entries +-1 with probability 1/2 each, shaped like ``like``."""
    bits = torch.randint(0, 2, like.shape, generator=gen, device=like.device)
    return bits.to(like.dtype).mul_(2).sub_(1)


def noise_scales(saved: Sequence[torch.Tensor], rho: float, adaptive: bool) -> List[Optional[torch.Tensor]]:
    """Per-tensor standard deviations ``rho * |w|`` (adaptive), or ``None`` meaning the scalar ``rho``."""
    return [s.abs().mul_(rho) if adaptive else None for s in saved]


@contextlib.contextmanager
def math_attention(enabled: bool = True) -> Iterator[None]:
    """Restrict ``F.scaled_dot_product_attention`` to the reference (math) kernel and switch off the
    ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` inference fast path (process-wide while
    inside; restored afterwards).

    Fused kernels lack forward-mode AD, double backward and vmap batching rules; the math kernel has
    all three and computes the same values (to float rounding). No-op when ``enabled`` is False.
    """
    if not enabled:
        yield
        return
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # fused MHA/encoder-layer inference kernels: same reason
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def device_of(params: NamedParams) -> torch.device:
    return params[0][1].device
