"""The trainer's closure for one mini-batch (implements :class:`flatlab.optim.Closure`)."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from flatlab.optim.protocol import frozen_bn_stats

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _draw(probs: torch.Tensor) -> torch.Tensor:
    """One label per row of ``probs`` ``(N, C)`` by inverse-CDF sampling: ``(N,)`` int64."""
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(probs.shape[0], 1, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[-1] - 1).reshape(-1)


def sample_labels(logits: torch.Tensor) -> torch.Tensor:
    """Labels drawn from the model's predictive distribution, ``ŷ ~ Categorical(softmax(logits))``.

    Inverse-CDF sampling (one uniform per row, ``searchsorted`` in the cumulative softmax): the same
    distribution as ``torch.multinomial`` at a fraction of its cost on wide outputs (LM vocabularies).

    Args:
        logits: ``(..., C)`` unnormalised class scores.
    Returns:
        ``(...)`` int64 labels. Uses the global torch RNG (seeded by the trainer, saved in checkpoints).
    """
    probs = torch.softmax(logits.detach().reshape(-1, logits.shape[-1]), dim=-1, dtype=torch.float32)
    return _draw(probs).reshape(logits.shape[:-1])


def sampled_label_logit_grad(logits: torch.Tensor) -> torch.Tensor:
    """Gradient w.r.t. ``logits`` of the mean cross-entropy against labels sampled from their softmax.

    With p = softmax(logits) per row and ŷ ~ Categorical(p) (drawn exactly as :func:`sample_labels`
    draws, from the same RNG stream), the gradient of ``mean_rows CE(logits, ŷ)`` is
    ``(p − onehot(ŷ)) / N``: built here from the softmax the sampling needs anyway, so the curvature
    pass skips a second log-softmax forward and backward (IRE's Fisher estimator, Wang et al. 2024).

    Args:
        logits: ``(..., C)`` unnormalised class scores (N = their number of rows).
    Returns:
        ``(..., C)`` tensor of ``logits``' dtype (the softmax itself is taken in float32).
    """
    probs = torch.softmax(logits.detach().reshape(-1, logits.shape[-1]), dim=-1, dtype=torch.float32)
    labels = _draw(probs)  # its cumulative sum is freed on return: two (N, C) float32 buffers at the peak
    rows = torch.arange(probs.shape[0], device=probs.device)
    probs[rows, labels] -= 1.0
    return probs.div_(probs.shape[0]).reshape(logits.shape).to(logits.dtype)


class BatchClosure:
    """Closure over one mini-batch: ``loss_fn(model(inputs), targets)``, mean over the batch.

    Args:
        model: the network (in train mode).
        loss_fn: ``loss_fn(outputs, targets) -> scalar`` (label smoothing etc. inside).
        inputs, targets: the mini-batch (any shapes the model / loss accept).
        clip_norm: if set, the global L2 norm of the true-label gradient is clipped to it after EVERY
            backward pass (primary and extra), so each optimizer, SAM's ascent and IRE's base step
            included, only ever sees clipped gradients. ``None``: no clipping.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        clip_norm: Optional[float] = None,
    ) -> None:
        self.model = model
        self.clip_norm = clip_norm
        self.loss_fn = loss_fn
        self.inputs = inputs
        self.targets = targets
        self.outputs: Optional[torch.Tensor] = None  # outputs of the last primary pass (detached)
        self.loss: Optional[torch.Tensor] = None  # loss of the last primary pass, at the unperturbed point

    def _zero_grad(self) -> None:
        for p in self.model.parameters():
            p.grad = None

    def _clip(self) -> None:
        if self.clip_norm is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)

    def _forward(self) -> Tuple[torch.Tensor, torch.Tensor]:
        self._zero_grad()
        out = self.model(self.inputs)
        return out, self.loss_fn(out, self.targets)

    @torch.enable_grad()
    def __call__(self) -> torch.Tensor:
        out, loss = self._forward()
        loss.backward()
        self._clip()
        self.outputs, self.loss = out.detach(), loss.detach()
        return self.loss

    @torch.enable_grad()
    def extra(self) -> torch.Tensor:
        with frozen_bn_stats(self.model):
            _, loss = self._forward()
            loss.backward()
        self._clip()
        return loss.detach()

    @torch.enable_grad()
    def with_sampled_grads(self, params: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, List[Optional[torch.Tensor]]]:
        out, loss = self._forward()
        # ∂/∂θ of the mean sampled-label cross-entropy, backpropagated from its logit gradient through the
        # primary pass's graph (no second forward; the graph is kept for the true loss's backward).
        sampled = torch.autograd.grad(out, list(params), grad_outputs=sampled_label_logit_grad(out), retain_graph=True, allow_unused=True)
        loss.backward()
        self._clip()  # the true-label gradient only: the sampled one just ranks coordinates
        self.outputs, self.loss = out.detach(), loss.detach()
        return self.loss, list(sampled)
