"""The dtype of on-device running sums (one job: pick it per device)."""

from __future__ import annotations

import torch


def accumulation_dtype(device: torch.device | str) -> torch.dtype:
    """float64 for running sums kept on ``device`` (epoch loss sums, loss curves), except on Apple's
    MPS backend, which has no float64: float32 there.

    Args:
        device: a ``torch.device`` or its name (``"cpu"``, ``"cuda:0"``, ``"mps"``).
    Returns:
        ``torch.float64`` or ``torch.float32``.
    """
    return torch.float32 if torch.device(device).type == "mps" else torch.float64
