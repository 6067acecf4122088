"""Seeding and RNG state capture, so a trial is reproducible and resumes bit-identically on CPU."""

from __future__ import annotations

import random
from typing import Any, Dict

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) global RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> Dict[str, Any]:
    """Global RNG states (Python, NumPy, torch CPU, torch CUDA if available) as plain data.

    ``python``: :func:`random.getstate` (a tuple of ints and a float or ``None``); ``numpy``: the legacy
    MT19937 state as ``{"bit_generator", "key": [624 ints], "pos", "has_gauss", "gauss"}``; ``torch`` and
    ``cuda``: uint8 byte tensors. Nothing in it needs pickle (see :mod:`flatlab.train.checkpoint`).
    """
    name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: Dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": str(name),
            "key": [int(k) for k in key],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (its lists may have become tuples or vice versa).

    Raises:
        ValueError, TypeError: a malformed state (from NumPy, :func:`random.setstate` or torch).
    """
    version, internal, gauss_next = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss_next))
    npst = state["numpy"]
    key = np.asarray(npst["key"], dtype=np.uint32)
    np.random.set_state((npst["bit_generator"], key, int(npst["pos"]), int(npst["has_gauss"]), float(npst["gauss"])))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
