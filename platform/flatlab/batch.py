"""The tensors of a mini-batch, below every layer that handles one (workloads, training, measures):
:data:`Inputs` and :func:`take` of its rows, and labels drawn from a model's predictive distribution
(:func:`sample_labels`)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

import torch

Inputs = Union[torch.Tensor, Dict[str, torch.Tensor]]


def take(inputs: Inputs, idx: Any) -> Inputs:
    """Rows ``idx`` of ``inputs`` (a tensor, or a dict of tensors sharing their first dimension)."""
    if isinstance(inputs, dict):
        return {k: v[idx] for k, v in inputs.items()}
    return inputs[idx]


def draw_labels(
    probs: torch.Tensor, generator: Optional[torch.Generator] = None, u: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """One label per row of ``probs`` ``(N, C)`` by inverse-CDF sampling: ``(N,)`` int64 (``u``: the
    ``(N, 1)`` uniforms to use instead of drawing them)."""
    cdf = probs.cumsum(dim=-1)
    if u is None:
        u = torch.rand(probs.shape[0], 1, device=probs.device, dtype=probs.dtype, generator=generator)
    u = u * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[-1] - 1).reshape(-1)


def sample_labels(logits: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Labels drawn from the model's predictive distribution, ``ŷ ~ Categorical(softmax(logits))``.

    Inverse-CDF sampling (one uniform per row, ``searchsorted`` in the cumulative softmax): the same
    distribution as ``torch.multinomial`` at a fraction of its cost on wide outputs (LM vocabularies).
    The sampler of IRE's curvature pass and of the sampled-label Fisher trace (Wang et al. 2024).

    Args:
        logits: ``(..., C)`` unnormalised class scores.
        generator: the RNG to draw from (on ``logits``' device); ``None``: the global torch RNG
            (seeded by the trainer, saved in checkpoints).
    Returns:
        ``(...)`` int64 labels.
    """
    probs = torch.softmax(logits.detach().reshape(-1, logits.shape[-1]), dim=-1, dtype=torch.float32)
    return draw_labels(probs, generator).reshape(logits.shape[:-1])
