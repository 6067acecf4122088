"""Subnormal floats flushed to zero for the length of one optimizer step, and the caller's mode given back.

A trial's CPU threads flush subnormals already (:mod:`flatlab.train.cpu_threads`: on CPUs that take a
slow path for them, a saturating classifier's backward pass runs orders of magnitude slower). An
optimizer used in one's own training loop has no trial to set that mode, so IRE sets it around its own
step (the closure's passes included) with :func:`flushed_subnormals`. The mode is a per-thread CPU
register (MXCSR on x86): the calling thread's is set and restored; threads of torch's intra-op pool keep
their own (set at process start, before the pool, to have them all flush: ``cpu_threads.configure``). A
new thread takes its creator's register, so the pool is started (:func:`_start_pool`) before the first
switch: threads started inside the block would flush for the rest of the process.
:func:`ieee_subnormals` does the opposite for the few host multiplications whose definition is IEEE
arithmetic with gradual underflow (IRE's tie ceiling, :func:`flatlab.optim._select.square_tie_ceiling`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch

__all__ = ["flushing_now", "flushed_subnormals", "ieee_subnormals"]

# the bit pattern of the float32 subnormal 2^-140, built as an integer: a float fill would itself be
# flushed on a thread that flushes
_SUBNORMAL_BITS = 512


def flushing_now() -> bool:
    """Whether the calling thread flushes subnormal floats: 2^-140 · 0.5 is computed on one element and
    read back as bits (0 where the input reads as 0 or the result is written as 0). In numpy, which runs
    on the same thread under the same register (and stays out of torch's dispatch); about a microsecond."""
    x = np.array([_SUBNORMAL_BITS], dtype=np.int32).view(np.float32)
    return int((x * np.float32(0.5)).view(np.int32)[0]) == 0


@contextlib.contextmanager
def flushed_subnormals() -> Iterator[None]:
    """Within the block the calling thread flushes subnormals to zero (``torch.set_flush_denormal``);
    afterwards it is in the mode it was in before, also when the block raises. Nothing changes on a thread
    that flushes already or on a CPU without the mode."""
    if flushing_now():
        yield
        return
    _start_pool()
    if not torch.set_flush_denormal(True):
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


_POOL_STARTED = False


def _start_pool() -> None:
    """Start torch's intra-op worker threads in the caller's mode, once per process: a reduction over more
    elements than one thread's grain (32,768) runs in parallel, which starts the pool."""
    global _POOL_STARTED
    if not _POOL_STARTED and torch.get_num_threads() > 1:
        torch.ones(1 << 17).sum()
    _POOL_STARTED = True


@contextlib.contextmanager
def ieee_subnormals() -> Iterator[None]:
    """Within the block the calling thread keeps subnormal floats (IEEE gradual underflow); afterwards it
    is in the mode it was in before. Nothing changes on a thread that keeps them already."""
    if not flushing_now():
        yield
        return
    torch.set_flush_denormal(False)
    try:
        yield
    finally:
        torch.set_flush_denormal(True)
