"""The trainer's closure for one mini-batch (implements :class:`flatlab.optim.Closure`)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn

from flatlab.batch import Inputs, draw_labels, take
from flatlab.optim.protocol import frozen_bn_stats
from flatlab.train import parallel as dp  # data parallelism (DDP): see flatlab.train.parallel
from flatlab.train.precision import Precision

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sampled_label_logit_grad(
    logits: torch.Tensor, u: Optional[torch.Tensor] = None, scale: float = 1.0
) -> torch.Tensor:
    """Gradient w.r.t. ``logits`` of the mean cross-entropy against labels sampled from their softmax.

    With p = softmax(logits) per row and ŷ ~ Categorical(p) (drawn exactly as :func:`flatlab.batch.sample_labels`
    draws, from the same RNG stream), the gradient of ``mean_rows CE(logits, ŷ)`` is
    ``(p − onehot(ŷ)) / N``: built here from the softmax the sampling needs anyway, so the curvature
    pass skips a second log-softmax forward and backward (IRE's Fisher estimator, Wang et al. 2024).

    Args:
        logits: ``(..., C)`` unnormalised class scores (N = their number of rows).
        u: ``(N, 1)`` float32 uniforms to sample with (data parallelism: the rank's rows of the global
            batch's draw); ``None``: drawn here from the global torch RNG.
        scale: multiplies the gradient (fp16 loss scaling), applied in float32 before the cast.
    Returns:
        ``(..., C)`` tensor of ``logits``' dtype (the softmax itself is taken in float32).
    """
    probs = torch.softmax(logits.detach().reshape(-1, logits.shape[-1]), dim=-1, dtype=torch.float32)
    labels = draw_labels(probs, u=u)  # its cumulative sum is freed on return: two (N, C) float32 buffers at the peak
    rows = torch.arange(probs.shape[0], device=probs.device)
    probs[rows, labels] -= 1.0
    probs.div_(probs.shape[0])
    if scale != 1.0:
        probs.mul_(scale)
    return probs.reshape(logits.shape).to(logits.dtype)


class BatchClosure:
    """Closure over one mini-batch: ``loss_fn(model(inputs), targets)``, mean over the batch.

    Args:
        model: the network (in train mode).
        loss_fn: ``loss_fn(outputs, targets) -> scalar`` mean over the examples it is given (label
            smoothing etc. inside).
        inputs, targets: the mini-batch, ``(N, ...)`` (a tensor or a dict of tensors) and ``(N, ...)``.
        clip_norm: if set, the global L2 norm of the true-label gradient is clipped to it after EVERY
            backward pass (primary and extra), so each optimizer, SAM's ascent and IRE's base step
            included, only ever sees clipped gradients. ``None``: no clipping.
        micro_batch: if set and smaller than N, every pass (primary, extra, sampled-label) runs the batch
            in chunks of this many examples and accumulates the gradients, each chunk's mean loss
            weighted by its share of N: the same gradient as one pass over N up to float rounding, with
            the activation memory of one chunk (gradient accumulation). BatchNorm then normalises each
            chunk with its own statistics, as accumulation always does.
        on_outputs: called with ``(outputs, targets)`` (detached) of every chunk of the PRIMARY pass,
            e.g. for the running training accuracy (exactly one primary pass per optimizer step).
        precision: the trial's :class:`~flatlab.train.precision.Precision` (``None``: fp32). Every pass's
            forward runs under its autocast; the loss is returned in float32. With fp16 each pass scales
            its loss by the scaler's scale, unscales its gradients (the sampled-label ones included)
            exactly once after its backward, before clipping, and checks them: a non-finite gradient
            sets :attr:`overflowed`, after which every gradient of the step is ``None`` (so a base
            optimizer steps nothing) and later passes of the step do no work (they return the primary
            loss). The optimizer's step is then skipped; :func:`flatlab.optim.protocol.step_skipped`.

        parallel, shard: data parallelism (``model`` is then the DDP wrapper): this rank's group and its
            rows of the global batch. Each rank's loss (and sampled-label seed) is weighted by its share
            of the global batch, n_r·W/N (exactly 1 when the N rows split evenly), so that the average
            over the ranks is the global batch's mean; :attr:`loss` holds that weighted value. DDP
            averages every pass's gradient over the ranks, except inside
            :meth:`no_sync`; the sampled-label gradients are always averaged (IRE needs one mask on every
            rank) and their labels are drawn as the single-process trainer draws them for the global
            batch (:func:`flatlab.train.parallel.sampled_uniforms`).

    Attributes:
        can_skip: True with fp16 loss scaling (this step may be skipped; optimizers then keep what they
            need to undo their own state changes).
        overflowed: True once a pass of this closure's step had a non-finite (unscaled) gradient (fp16).
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        inputs: Inputs,
        targets: torch.Tensor,
        clip_norm: Optional[float] = None,
        micro_batch: Optional[int] = None,
        on_outputs: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = None,
        precision: Optional[Precision] = None,
        parallel: Optional["dp.DataParallel"] = None,
        shard: Optional["dp.Shard"] = None,
    ) -> None:
        self.model = model
        self.clip_norm = clip_norm
        self.loss_fn = loss_fn
        self.inputs = inputs
        self.targets = targets
        self.micro_batch = micro_batch
        self.on_outputs = on_outputs
        self.precision = precision
        self.scaler = precision.scaler if precision is not None else None
        self.can_skip = self.scaler is not None
        self.overflowed = False
        self.outputs: Optional[torch.Tensor] = None  # outputs of the last primary pass (detached; None when chunked)
        self.loss: Optional[torch.Tensor] = None  # loss of the last primary pass, at the unperturbed point
        self.parallel = parallel if parallel is not None and parallel.world > 1 else None
        self.shard = shard
        self._share = 1.0  # n_r·W/N: this rank's weight, so that the rank average is the global mean
        if self.parallel is not None and shard is not None:
            self._share = int(targets.shape[0]) * self.parallel.world / shard.total

    def _zero_grad(self) -> None:
        for p in self.model.parameters():
            p.grad = None

    def _clip(self) -> None:
        if self.clip_norm is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)

    def _chunks(self) -> Iterator[Tuple[Inputs, torch.Tensor, Optional[float]]]:
        """``(inputs, targets, weight)`` per chunk; weight ``None`` = the whole batch in one piece."""
        n = int(self.targets.shape[0])
        if self.micro_batch is None or self.micro_batch >= n:
            yield self.inputs, self.targets, None
            return
        for start in range(0, n, self.micro_batch):
            part = slice(start, start + self.micro_batch)
            yield take(self.inputs, part), self.targets[part], (min(n, start + self.micro_batch) - start) / n

    @torch.enable_grad()
    def _pass(
        self, primary: bool, sampled_for: Optional[Sequence[torch.Tensor]] = None
    ) -> Tuple[torch.Tensor, List[Optional[torch.Tensor]]]:
        """Forward/backward over the batch (chunked if asked); returns the loss and, with ``sampled_for``,
        the sampled-label gradients of those tensors (IRE's curvature pass, from the same forward)."""
        self._zero_grad()
        params = list(sampled_for) if sampled_for is not None else []
        sampled: List[Optional[torch.Tensor]] = [None] * len(params)
        if self.overflowed:  # an earlier pass of this step overflowed: the step is skipped, nothing to compute
            assert self.loss is not None
            return self.loss, sampled
        scale = self.scaler.scale if self.scaler is not None else None
        mixed = self.precision is not None and self.precision.dtype is not None
        autocast = self.precision.autocast if self.precision is not None else contextlib.nullcontext
        total: Optional[torch.Tensor] = None
        uniforms: Optional[torch.Tensor] = None  # data parallel: this rank's rows of the global draw
        done = 0
        if sampled_for is not None and self.parallel is not None:
            n, per = (
                int(self.targets.shape[0]),
                max(1, int(self.targets[0].numel())),
            )  # per: label rows per example (LMs: T)
            shard = self.shard or dp.Shard(0, n)
            uniforms = dp.sampled_uniforms(
                n * per, dp.Shard(shard.offset * per, shard.total * per), self.targets.device, torch.float32
            )
        for x, y, weight in self._chunks():
            with autocast():
                out = self.model(x)
                loss = self.loss_fn(out, y)
            if mixed:
                loss = loss.float()  # the losses optimizers read (TSAM's tilt) are float32
            if self._share != 1.0:  # data parallel, uneven split of the global batch
                loss = loss * self._share
            if sampled_for is not None:
                # ∂/∂θ of the mean sampled-label cross-entropy, backpropagated from its logit gradient
                # through this forward's graph (kept for the true loss's backward below).
                rows = int(y.numel())  # = rows of the logits
                seed = sampled_label_logit_grad(
                    out, None if uniforms is None else uniforms[done : done + rows], 1.0 if scale is None else scale
                )
                done += rows
                if weight is not None or self._share != 1.0:
                    seed.mul_((1.0 if weight is None else weight) * self._share)
                grads = torch.autograd.grad(out, params, grad_outputs=seed, retain_graph=True, allow_unused=True)
                sampled = [g if s is None else (s if g is None else s.add_(g)) for s, g in zip(sampled, grads)]
            scaled = loss if weight is None else loss * weight
            (scaled if scale is None else scaled * scale).backward()
            part = loss.detach() if weight is None else loss.detach() * weight
            total = part if total is None else total + part
            if primary:
                if weight is None:
                    self.outputs = out.detach()
                if self.on_outputs is not None:
                    self.on_outputs(out.detach(), y)
        if sampled_for is not None:
            dp.mean_grads_(self.parallel, sampled)  # one IRE mask on every rank, also under no_sync
        assert total is not None
        if self.scaler is not None:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            if self.scaler.unscale_(grads + [g for g in sampled if g is not None]):
                self.overflowed = True
                self._zero_grad()
                return total, [None] * len(params)
        self._clip()  # the true-label gradient only: the sampled one just ranks coordinates
        return total, sampled

    def __call__(self) -> torch.Tensor:
        self.outputs = None
        self.loss, _ = self._pass(primary=True)
        return self.loss

    def extra(self) -> torch.Tensor:
        with frozen_bn_stats(self.model):
            loss, _ = self._pass(primary=False)
        return loss

    def with_sampled_grads(self, params: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, List[Optional[torch.Tensor]]]:
        self.outputs = None
        self.loss, sampled = self._pass(primary=True, sampled_for=params)
        return self.loss, sampled

    # ---- data parallelism (flatlab.train.parallel); no-ops in a single process
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Passes run inside the block keep this rank's own gradient (DDP ``no_sync`` around their
        forward AND backward): SAM's local ascent (m-sharpness with m = the per-rank batch)."""
        with dp.no_sync(self.model):
            yield

    def reduce_mean(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` (e.g. a pass's loss) averaged over the data-parallel ranks; itself in one process."""
        return value if self.parallel is None else self.parallel.mean(value)
