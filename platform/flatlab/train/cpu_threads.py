"""How a trial process computes on its CPU: torch's thread count and subnormal ("denormal") floats.

Subnormal float32 numbers (non-zero, below 2^-126 ≈ 1.18e-38) take a microcode slow path on many x86
CPUs: a matrix product whose input is subnormal can run two orders of magnitude slower than the same
product on normal numbers (bench/README.md, "Subnormals in the model's own passes"). They arise in training
as soon as a classifier is confident enough: the logit gradient softmax(z) − onehot(y) holds entries like
e^(−90), and the whole backward pass inherits them. Which arm gets there first is a matter of how well
it fits, so on a CPU the better-fitting arm is charged a slow path that a GPU never charges (CUDA kernels
handle subnormals at full speed). A time-to-target comparison would then measure the CPU, not the
optimizer.

A trial therefore runs its CPU threads in flush-to-zero / denormals-are-zero mode by default
(:func:`torch.set_flush_denormal`; ``Resources(flush_denormal=False)`` keeps IEEE subnormals):
subnormal inputs read as 0 and subnormal results are written as 0. Only numbers below 2^-126 change;
nothing a GPU computes changes. IRE's flat mask is unchanged by it (``docs/algorithms/ire.md``).

The mode is a per-thread CPU register (MXCSR on x86), and a new thread inherits its creator's. So it
must be set before torch starts its intra-op thread pool; :func:`configure` sets it, then the thread
count, then checks with one small multiplication spread over every thread whether each of them follows
it. The answer (:data:`MODES`) is recorded on the trial's MLflow run as the tag ``flatlab.cpu_denormals``.
"""

from __future__ import annotations

import torch

#: What :func:`configure` finds: every CPU thread flushes subnormals / every thread keeps them / the
#: threads disagree (the pool started before the mode was set) / this CPU has no such mode.
MODES = ("flush", "keep", "partial", "unsupported")

# the bit pattern of the float32 subnormal 2^-140 (= 512 · 2^-149). The probes build their subnormals
# from it as integers: a float fill or conversion would itself be flushed to 0 on a thread that flushes.
_SUBNORMAL_BITS = 512
# elements per thread of the probe: above ATen's grain size (32768), so every thread gets a share
_PER_THREAD = 1 << 16
# the BLAS probe's sizes: large enough that the BLAS spreads the product over all its threads
_GEMM, _GEMM_INNER = 1024, 64


def _subnormals(n: int) -> torch.Tensor:
    return torch.full((n,), _SUBNORMAL_BITS, dtype=torch.int32).view(torch.float32)


def denormal_mode() -> str:
    """Which of :data:`MODES` this process's torch CPU threads are in.

    Two probes, as torch's CPU work runs on two sets of threads: ATen's own parallel loops (elementwise
    ops; oneDNN's convolutions share their OpenMP threads), probed by halving a float32 subnormal over
    ``torch.get_num_threads() · 65536`` elements, and the BLAS's threads (matrix products), probed by a
    1024×64 by 64×1024 product (the first of them transposed) whose one non-zero term per entry is
    2^100 · 2^-140 = 2^-40 (0 where the subnormal input reads as 0). Each thread takes part of each; the
    results that are 0 (counted as integers: a float comparison would read subnormals as 0 itself) tell
    the mode.
    """
    threads = max(1, torch.get_num_threads())
    halves = _subnormals(_PER_THREAD * threads).mul_(0.5)
    a = torch.zeros(_GEMM_INNER, _GEMM, dtype=torch.float32)
    a[0, :] = 2.0**100
    b = torch.zeros(_GEMM_INNER, _GEMM, dtype=torch.float32)
    b[0, :] = _subnormals(_GEMM)
    results = (halves, a.t() @ b)  # a transposed operand, as in a backward pass's weight gradient
    n = sum(r.numel() for r in results)
    zeros = n - sum(int(torch.count_nonzero(r.view(torch.int32))) for r in results)
    return "flush" if zeros == n else "keep" if zeros == 0 else "partial"


def configure(threads: int, flush_denormal: bool = True) -> str:
    """Set this process's torch CPU arithmetic for a trial: subnormal mode first, then ``threads``
    intra-op threads (the pool they start inherits the mode), then check it.

    Args:
        threads: ``torch.set_num_threads`` (Ray sets OMP_NUM_THREADS=1; a trial follows its ``Resources.cpu``).
        flush_denormal: flush subnormal float32/float64 numbers to zero on the CPU (module docstring).
    Returns:
        One of :data:`MODES`: ``"unsupported"`` when the CPU has no flush mode and ``flush_denormal`` was
        asked for; ``"partial"`` when the thread pool had already started under the other mode (a
        process that computed before its trial began), so that only some threads follow it.
    """
    supported = torch.set_flush_denormal(bool(flush_denormal))
    torch.set_num_threads(max(1, int(threads)))
    if flush_denormal and not supported:
        return "unsupported"
    return denormal_mode()
