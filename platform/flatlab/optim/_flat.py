"""Small tensor-list helpers shared by the SAM-family optimizers (private module; IRE's exact selection of
its flat coordinates is :mod:`flatlab.optim._select`).

Every optimizer here works on "all trainable tensors flattened together" (the papers' θ)
without ever materialising the flat vector: global norms and updates run over lists of tensors with
``torch._foreach_*`` kernels (one launch per device instead of one per tensor).
"""

from __future__ import annotations

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
