"""The contract between the trainer and every optimizer: one ``step(closure)`` protocol.

The trainer hands each optimizer a :class:`Closure` for the current mini-batch. Calling it recomputes
the mean mini-batch loss and the gradients (into ``p.grad``) at the *current* parameters, like the
closure of ``torch.optim.LBFGS``. Optimizers that need more than one pass per step (SAM: 2, TSAM: 2s,
IRE's curvature pass) use the closure's extra entry points, which never update BatchNorm running
statistics (the SAM paper's practice, davda54/sam#17). The trainer has no optimizer-specific branch.

Optional hooks an optimizer may implement, called by the trainer when present: ``on_progress(Progress)``
before every step (IRE's switch-on and κ decay, TSAM's t schedule) and ``pop_metrics() -> dict`` once
per epoch (``opt/...`` means since the last call). One more, read by the trainer's compute count
(:mod:`flatlab.train.compute`) and the budget in passes (:mod:`flatlab.study.budget`):
``step_passes(step: int) -> Tuple[int, int]``, the ``(forward, backward)`` passes over the mini-batch
that the step with 0-based index ``step`` spends (SAM: (2, 2); TSAM: (2s, 2s); IRE: its base's, plus
one backward at a curvature refresh). Absent: (1, 1), one plain gradient evaluation. Asked about a
step not yet taken, it answers from the hyperparameters (what a fresh run would spend); about the
step just taken, what that step spent. Read it through :func:`passes_of`.

Skipped steps (fp16 loss scaling, :mod:`flatlab.train.precision`): a closure may carry ``can_skip``
(:func:`step_may_be_skipped`) and ``overflowed``; once a pass of the step had a non-finite gradient,
every ``p.grad`` the closure leaves is ``None``, so a torch base optimizer steps nothing (state
included). Optimizers with state of their own check :func:`step_skipped` after their passes, leave
that state as it was and record no metrics.

Data parallelism (DDP, :mod:`flatlab.train.parallel`): a closure may also offer ``no_sync()`` (passes
inside keep the rank's own gradient) and ``reduce_mean(tensor)`` (the average over the ranks), reached
through :func:`local_pass` and :func:`ranks_mean`, which do nothing for a one-process closure.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class Closure(Protocol):
    """Recomputes loss and gradients of the current mini-batch at the current parameters."""

    def __call__(self) -> torch.Tensor:
        """Primary pass: zero grads, forward (train mode, BatchNorm statistics updated), backward.

        Returns the detached scalar mean loss (shape ``()``); gradients are left in ``p.grad``.
        """
        ...

    def extra(self) -> torch.Tensor:
        """An extra pass, as ``__call__`` but BatchNorm running statistics are NOT updated."""
        ...

    def with_sampled_grads(self, params: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, List[Optional[torch.Tensor]]]:
        """Primary pass plus the gradient of the loss on labels sampled from the model's own softmax.

        Returns ``(loss, sampled)`` where ``sampled[i]`` has the shape of ``params[i]`` (``None`` if that
        parameter does not influence the loss). ``p.grad`` holds the true-label gradient, exactly as
        after ``__call__``. The sampled gradient reuses the same forward graph (IRE's Fisher estimate,
        IRE paper), so BatchNorm statistics are updated once. The caller owns the ``sampled`` tensors
        (IRE squares them in place), so they must not be held or reused by the closure.
        """
        ...


@dataclass(frozen=True)
class Progress:
    """Where training stands when a step is about to run.

    Attributes:
        step: optimizer steps taken so far (0-based index of the step about to run).
        epoch: 0-based epoch of that step.
        total_steps: steps in the whole run (epochs x steps per epoch).
        steps_per_epoch: mini-batches per epoch.
        warmup_steps: steps of LR warm-up (0 when none).
        last_epoch_train_loss: mean training loss of the previous epoch (``None`` in the first epoch).
    """

    step: int
    epoch: int
    total_steps: int
    steps_per_epoch: int
    warmup_steps: int = 0
    last_epoch_train_loss: Optional[float] = None

    @property
    def fraction(self) -> float:
        """Fraction of training done, in [0, 1]."""
        return min(1.0, self.step / max(1, self.total_steps))


class _CallableClosure:
    """Adapts a plain ``fn() -> loss`` closure: extra passes call it again (BatchNorm not protected)."""

    def __init__(self, fn: Callable[[], torch.Tensor]) -> None:
        self._fn = fn

    def __call__(self) -> torch.Tensor:
        return self._fn()

    def extra(self) -> torch.Tensor:
        return self._fn()

    def with_sampled_grads(self, params: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, List[Optional[torch.Tensor]]]:
        raise TypeError(
            "this optimizer needs a flatlab closure with `with_sampled_grads()` (IRE's curvature pass); "
            "a plain callable cannot sample labels from the model's predictions. "
            "Use flatlab.train.closure.BatchClosure."
        )


def as_closure(closure: Callable[[], torch.Tensor]) -> Closure:
    """Return ``closure`` if it implements :class:`Closure`, else wrap a plain callable."""
    if isinstance(closure, Closure):
        return closure
    return _CallableClosure(closure)


def passes_of(optimizer: object, step: int) -> Tuple[int, int]:
    """``(forward, backward)`` passes over the mini-batch that ``optimizer``'s step number ``step``
    (0-based) spends: its ``step_passes(step)`` hook, or (1, 1) for an optimizer without one (one
    forward and one backward: a plain gradient step).

    Raises:
        ValueError: the hook returned something other than two non-negative ints with ``backward >= 1``
            or ``forward >= 1`` (every step evaluates the loss at least once).
    """
    hook = getattr(optimizer, "step_passes", None)
    if hook is None:
        return 1, 1
    forward, backward = hook(step)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in (forward, backward)):
        raise ValueError(
            f"{type(optimizer).__name__}.step_passes({step}) = ({forward!r}, {backward!r}); expected two ints >= 1 "
            "(forward, backward passes over the mini-batch)"
        )
    return forward, backward


def step_may_be_skipped(closure: object) -> bool:
    """True when ``closure`` may skip this step (its ``can_skip``: fp16 loss scaling), so an optimizer
    must keep what it needs to undo its own state changes; False for closures without the flag."""
    return bool(getattr(closure, "can_skip", False))


def step_skipped(closure: object) -> bool:
    """True when ``closure`` reports that this step must be skipped (its ``overflowed`` flag, set by a
    pass with a non-finite gradient under fp16 loss scaling); False for closures without the flag."""
    return bool(getattr(closure, "overflowed", False))


def local_pass(closure: object) -> ContextManager[None]:
    """Context in which ``closure``'s passes are not all-reduced across data-parallel ranks (DDP
    ``no_sync`` around forward and backward); a no-op for closures without ``no_sync()``."""
    fn = getattr(closure, "no_sync", None)
    return fn() if fn is not None else contextlib.nullcontext()


def ranks_mean(closure: object, value: torch.Tensor) -> torch.Tensor:
    """``value`` averaged over the data-parallel ranks of ``closure`` (``value`` itself in one process)."""
    fn = getattr(closure, "reduce_mean", None)
    return fn(value) if fn is not None else value


def _batchnorms(model: nn.Module) -> Iterator[nn.modules.batchnorm._BatchNorm]:
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            yield m


@contextlib.contextmanager
def frozen_bn_stats(model: nn.Module) -> Iterator[None]:
    """Within the block, BatchNorm layers in train mode normalise with batch statistics (as usual) but do
    not update ``running_mean``, ``running_var`` or ``num_batches_tracked``."""
    bns = list(_batchnorms(model))
    for m in bns:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m in bns:
            m.track_running_stats = True
