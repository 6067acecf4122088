"""Small tensor-list helpers shared by the SAM-family optimizers (private module).

Every optimizer here works on "all trainable tensors flattened together" (the papers' θ)
without ever materialising the flat vector: global norms and updates run over lists of tensors with
``torch._foreach_*`` kernels (one launch per device instead of one per tensor).
"""

from __future__ import annotations

import sys
from typing import Dict, Iterable, List, MutableMapping, Sequence, Tuple, Union

import torch

Number = Union[float, int]

# Added to every global norm before dividing by it (as in the SAM authors' code).
NORM_EPS = 1e-12


def group_params(param_groups: Iterable[dict]) -> List[torch.Tensor]:
    """All tensors of all groups, in group order (the order ``state_dict`` indexes them by)."""
    return [p for g in param_groups for p in g["params"]]


def split_with_grad(params: Sequence[torch.Tensor]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """``(params, grads)`` restricted to the tensors whose ``.grad`` is set."""
    ps = [p for p in params if p.grad is not None]
    return ps, [p.grad for p in ps]  # type: ignore[misc]


def global_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """L2 norm of all ``tensors`` concatenated, ``sqrt(sum_i ||t_i||^2)``.

    Returns a 0-d tensor (float32 or wider) on the device of the first tensor, without a host sync.
    An empty list gives ``0``.
    """
    if not tensors:
        return torch.zeros(())
    device = tensors[0].device
    dtype = torch.promote_types(tensors[0].dtype, torch.float32)  # bf16/fp16 grads: sum squares in fp32
    norms = torch._foreach_norm(list(tensors))
    return torch.linalg.vector_norm(torch.stack([n.to(device=device, dtype=dtype) for n in norms]))


def add_scaled_(
    dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor], scale: torch.Tensor, *, src_is_scratch: bool = False
) -> None:
    """``dst[i] += scale * src[i]`` for every i; ``scale`` is a 0-d tensor.

    On CPU the scale is read to the host (no real sync there) and the update is ONE fused pass
    (``alpha=``). On accelerators it stays on the device (no host sync): ``src`` is scaled in place when
    the caller says it is scratch, else through a temporary.
    """
    if not dst:
        return
    if scale.device.type == "cpu":
        torch._foreach_add_(list(dst), list(src), alpha=float(scale))
    elif src_is_scratch:
        torch._foreach_mul_(list(src), scale)
        torch._foreach_add_(list(dst), list(src))
    else:
        torch._foreach_add_(list(dst), torch._foreach_mul(list(src), scale))


def persistent_buffers(
    state: MutableMapping[torch.Tensor, dict], params: Sequence[torch.Tensor], key: str
) -> List[torch.Tensor]:
    """One scratch tensor shaped like each parameter, kept in ``state[p][key]`` and reused every step.

    Reusing the buffers avoids an allocation per step; their contents are garbage until written.
    """
    out = []
    for p in params:
        buf = state[p].get(key)
        if buf is None or buf.shape != p.shape or buf.device != p.device or buf.dtype != p.dtype:
            buf = torch.empty_like(p, memory_format=torch.preserve_format)
            state[p][key] = buf
        out.append(buf)
    return out


def kth_smallest_nonnegative(values: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k``-th smallest entry (1-based) of a 1-D float32 tensor of NON-NEGATIVE values.

    Exactly ``torch.kthvalue(values, k).values`` (same value, ties and zeros included); see
    :func:`kth_smallest_with_count`, which also returns how many entries are ≤ it.
    """
    return kth_smallest_with_count(values, k)[0]


def kth_smallest_with_count(values: torch.Tensor, k: int) -> Tuple[torch.Tensor, int]:
    """``(v, c)``: the ``k``-th smallest entry ``v`` (1-based) of a 1-D float32 tensor of NON-NEGATIVE
    values, and the number ``c ≥ k`` of entries ≤ ``v`` (ties with ``v`` included).

    ``v`` is exactly ``torch.kthvalue(values, k).values`` and ``c`` equals ``(values <= v).sum()``
    whenever ``v`` is not NaN. Two-pass radix select: non-negative IEEE-754 float32 numbers order like
    their bit patterns read as integers, so one histogram of the upper 16 bits finds the bucket holding
    the k-th value and a second histogram of the lower 16 bits inside that bucket finds the value
    itself; the two cumulative histograms also give ``c`` for free (no pass over a comparison mask).
    About 3x faster than ``kthvalue``'s partial sort on CPU (measured on 0.3 M and 11 M values). On
    CUDA it avoids ``kthvalue``'s per-slice kernel on one huge slice (IRE ranks every parameter at
    once); its speed there is not measured yet.

    Args:
        values: ``(n,)`` float32, every entry ≥ 0 (squares, or EMAs of squares). Signs are ignored
            (``-0.0`` counts as 0; NaN, of either sign, ranks above +inf), so a diverging step never
            makes the selection itself fail.
        k: rank, ``1 ≤ k ≤ n``.
    Returns:
        0-d float32 tensor on ``values``' device, and the count as a Python int (one host read, as
        the select already needs).
    Raises:
        ValueError: ``values`` is not a 1-D float32 tensor, or ``k`` is outside ``[1, n]``.
    """
    if values.dim() != 1 or values.dtype != torch.float32:
        raise ValueError(f"kth_smallest_nonnegative: values must be a 1-D float32 tensor, got {tuple(values.shape)} {values.dtype}")
    if not 1 <= k <= values.numel():
        raise ValueError(f"kth_smallest_nonnegative: k must be in [1, {values.numel()}], got {k}")
    values = values.contiguous()
    bits = values.view(torch.int32)
    if sys.byteorder == "little":  # the upper halves as a strided int16 view: one pass, half the bytes
        high = values.view(torch.int16)[1::2] & 0x7FFF
    else:
        high = (bits >> 16) & 0x7FFF
    # high: 0 .. 0x7F80 for finite values ≥ 0 and +inf (the mask drops sign bits); NaNs above
    cum = torch.bincount(high, minlength=1 << 15).cumsum_(0)
    rank = torch.tensor([k], dtype=cum.dtype, device=cum.device)
    bucket = int(torch.searchsorted(cum, rank))  # first bucket whose cumulative count reaches k
    below = int(cum[bucket - 1]) if bucket > 0 else 0
    low = bits[high == bucket] & 0xFFFF
    cum_low = torch.bincount(low, minlength=1 << 16).cumsum_(0)
    offset = int(torch.searchsorted(cum_low, rank - below))
    count = below + int(cum_low[offset])
    value = torch.tensor((bucket << 16) | offset, dtype=torch.int32, device=values.device).view(torch.float32)
    return value, count


class MetricMeans:
    """Means of scalar metrics since the last :meth:`pop` (the optimizers' ``pop_metrics`` hook).

    Values may be Python numbers or 0-d tensors; tensors are summed on their device, so recording a
    metric never forces a host-device sync. The sync happens once, in :meth:`pop`.
    """

    def __init__(self) -> None:
        self._sums: Dict[str, Union[torch.Tensor, float]] = {}
        self._counts: Dict[str, int] = {}

    def add(self, name: str, value: Union[torch.Tensor, Number]) -> None:
        """Record one observation of ``name``."""
        v = value.detach().float() if isinstance(value, torch.Tensor) else float(value)
        prev = self._sums.get(name)
        self._sums[name] = v if prev is None else prev + v
        self._counts[name] = self._counts.get(name, 0) + 1

    def pop(self) -> Dict[str, float]:
        """``{name: mean}`` over the observations since the previous call; then forget them."""
        out = {k: float(s) / self._counts[k] for k, s in self._sums.items()}
        self._sums.clear()
        self._counts.clear()
        return out
