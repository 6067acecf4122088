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
    """Global RNG states (Python, NumPy, torch CPU, torch CUDA if available)."""
    state: Dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from ``parts`` (e.g. study seed, trial seed), independent of PYTHONHASHSEED."""
    import hashlib

    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
