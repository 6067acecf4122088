"""The fixed evaluation subset every sharpness measure runs on, and the loss over it.

Seed paper ("In Search of the Successful Interpolation", App. A) and Andriushchenko et al. 2023
estimate sharpness over a FIXED subset of ``m`` examples, in eval mode, so that values for different
models (or interpolation coefficients alpha) are comparable. :class:`EvalSubset` holds that subset as a
tuple of ``(inputs, targets)`` batches; the loss over it is the example-weighted mean of the batch losses:

    L(w) = (1/m) * sum_b n_b * loss_fn(model(inputs_b), targets_b)

so a loss function that returns the *mean* over its batch (the PyTorch default) gives the mean over all
``m`` examples, whatever the batch sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, Mapping, Sequence, Tuple, Union

import torch
from torch.func import functional_call
from torch.utils.data import TensorDataset

from flatlab.errors import ConfigError

Batch = Tuple[Any, torch.Tensor]
"""``(inputs, targets)``. ``inputs`` is a tensor ``(B, ...)`` passed as ``model(inputs)``, a tuple/list
passed as ``model(*inputs)``, or a dict passed as ``model(**inputs)``; ``targets`` has ``B`` rows."""

LossFn = Callable[[Any, torch.Tensor], torch.Tensor]
"""``loss_fn(outputs, targets) -> scalar`` mean loss over the batch (e.g. ``F.cross_entropy``)."""

DEFAULT_BATCH_SIZE = 256


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every prediction: logits ``(B, C)`` with targets ``(B,)``, or token logits
    ``(B, T, V)`` with targets ``(B, T)`` (the mean over the ``B*T`` tokens, nats per token; a language
    model's loss). The default loss of the curvature measures."""
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@dataclass(frozen=True)
class EvalSubset:
    """A fixed, ordered evaluation subset of ``m`` examples split into batches.

    Attributes:
        batches: ``((inputs, targets), ...)``; the order is kept, so repeated passes are identical.
    """

    batches: Tuple[Batch, ...]

    def __post_init__(self) -> None:
        if not self.batches:
            raise ConfigError("an evaluation subset needs at least one batch; got none")
        for i, batch in enumerate(self.batches):
            if not isinstance(batch, (tuple, list)) or len(batch) != 2:
                raise ConfigError(
                    f"batch {i} must be an (inputs, targets) pair; got {type(batch).__name__}"
                    + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
                )
            if not isinstance(batch[1], torch.Tensor) or batch[1].ndim == 0 or len(batch[1]) == 0:
                raise ConfigError(f"batch {i}: targets must be a non-empty tensor with a batch dimension")

    @property
    def m(self) -> int:
        """Number of examples (sum of the batch sizes)."""
        return sum(len(targets) for _, targets in self.batches)

    def to(self, device: Union[str, torch.device]) -> "EvalSubset":
        """A copy with every tensor moved to ``device`` (call once to avoid a host->device copy per pass)."""
        return EvalSubset(tuple((_to_device(x, device), _to_device(y, device)) for x, y in self.batches))


EvalData = Union[EvalSubset, Sequence[Batch], TensorDataset, Iterable[Batch]]


def as_subset(data: EvalData, batch_size: int = DEFAULT_BATCH_SIZE) -> EvalSubset:
    """Normalise ``data`` into an :class:`EvalSubset`.

    Accepted: an :class:`EvalSubset` (returned as is); a ``TensorDataset`` whose last tensor holds the
    targets and the others the inputs (split into consecutive batches of ``batch_size``, no shuffling);
    a list/tuple of ``(inputs, targets)`` batches; any other iterable of batches (e.g. a non-shuffling
    ``DataLoader``), read once and kept.

    Raises:
        ConfigError: no batches, a batch that is not an ``(inputs, targets)`` pair, or ``batch_size < 1``.
    """
    if isinstance(data, EvalSubset):
        return data
    if isinstance(data, TensorDataset):
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1; got {batch_size}")
        tensors = data.tensors
        if len(tensors) < 2:
            raise ConfigError(f"a TensorDataset needs inputs and targets (>= 2 tensors); got {len(tensors)}")
        n = len(tensors[-1])
        batches = []
        for start in range(0, n, batch_size):
            sl = slice(start, start + batch_size)
            inputs = tensors[0][sl] if len(tensors) == 2 else tuple(t[sl] for t in tensors[:-1])
            batches.append((inputs, tensors[-1][sl]))
        return EvalSubset(tuple(batches))
    return EvalSubset(tuple(tuple(b) if isinstance(b, list) else b for b in data))


def _to_device(obj: Any, device: Union[str, torch.device]) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def split_inputs(inputs: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """``(args, kwargs)`` for a batch's inputs: a tuple/list is spread, a dict passed by keyword."""
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    if isinstance(inputs, dict):
        return (), dict(inputs)
    return (inputs,), {}


def call_model(model: Callable[..., Any], inputs: Any) -> Any:
    """``model(inputs)``, ``model(*inputs)`` for a tuple/list, ``model(**inputs)`` for a dict."""
    args, kwargs = split_inputs(inputs)
    return model(*args, **kwargs)


def functional_forward(model: torch.nn.Module, params: Mapping[str, torch.Tensor], inputs: Any) -> Any:
    """``model`` called on ``inputs`` with the tensors in ``params`` substituted for its own
    (``torch.func.functional_call``; the others are the module's); the module is not modified."""
    args, kwargs = split_inputs(inputs)
    return functional_call(model, dict(params), args, kwargs)


def weighted_batches(subset: EvalSubset, device: torch.device) -> Iterator[Tuple[Any, torch.Tensor, float]]:
    """Yield ``(inputs, targets, n_b / m)`` with the tensors on ``device``."""
    m = subset.m
    for inputs, targets in subset.batches:
        yield _to_device(inputs, device), _to_device(targets, device), len(targets) / m


def subset_loss(model: torch.nn.Module, subset: EvalSubset, loss_fn: LossFn, device: torch.device) -> float:
    """Mean loss over the subset (module docstring), accumulated in float64; no autograd graph.

    The caller sets eval mode; this function only runs forward passes.
    """
    total = torch.zeros((), dtype=torch.float64, device=device)
    with torch.no_grad():
        for inputs, targets, weight in weighted_batches(subset, device):
            total += weight * loss_fn(call_model(model, inputs), targets).detach().double()
    return float(total)  # one device sync per pass
