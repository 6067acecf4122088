"""The trainer's closure for one mini-batch (implements :class:`flatlab.optim.Closure`)."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from flatlab.optim.protocol import frozen_bn_stats

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def sample_labels(logits: torch.Tensor) -> torch.Tensor:
    """Labels drawn from the model's predictive distribution, ``ŷ ~ Categorical(softmax(logits))``.

    Args:
        logits: ``(..., C)`` unnormalised class scores.
    Returns:
        ``(...)`` int64 labels. Uses the global torch RNG (seeded by the trainer, saved in checkpoints).
    """
    flat = logits.detach().reshape(-1, logits.shape[-1]).float()
    return torch.multinomial(torch.softmax(flat, dim=-1), 1).reshape(logits.shape[:-1])


def sampled_label_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` ``(..., C)`` against sampled ``labels`` ``(...)``, no smoothing."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class BatchClosure:
    """Closure over one mini-batch: ``loss_fn(model(inputs), targets)``, mean over the batch.

    Args:
        model: the network (in train mode).
        loss_fn: ``loss_fn(outputs, targets) -> scalar`` (label smoothing etc. inside).
        inputs, targets: the mini-batch (any shapes the model / loss accept).
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.inputs = inputs
        self.targets = targets
        self.outputs: Optional[torch.Tensor] = None  # outputs of the last primary pass (detached)
        self.loss: Optional[torch.Tensor] = None  # loss of the last primary pass, at the unperturbed point

    def _zero_grad(self) -> None:
        for p in self.model.parameters():
            p.grad = None

    def _forward(self) -> Tuple[torch.Tensor, torch.Tensor]:
        self._zero_grad()
        out = self.model(self.inputs)
        return out, self.loss_fn(out, self.targets)

    @torch.enable_grad()
    def __call__(self) -> torch.Tensor:
        out, loss = self._forward()
        loss.backward()
        self.outputs, self.loss = out.detach(), loss.detach()
        return self.loss

    @torch.enable_grad()
    def extra(self) -> torch.Tensor:
        with frozen_bn_stats(self.model):
            _, loss = self._forward()
            loss.backward()
        return loss.detach()

    @torch.enable_grad()
    def with_sampled_grads(self, params: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, List[Optional[torch.Tensor]]]:
        out, loss = self._forward()
        fisher_loss = sampled_label_loss(out, sample_labels(out))
        sampled = torch.autograd.grad(fisher_loss, list(params), retain_graph=True, allow_unused=True)
        loss.backward()
        self.outputs, self.loss = out.detach(), loss.detach()
        return self.loss, list(sampled)
