"""Data parallelism for one trial: DDP over ``torch.distributed`` (gloo on CPU, NCCL on GPUs).

Every rank holds the whole model and the same optimizer; each takes its slice of every GLOBAL
mini-batch (:meth:`DataParallel.shard`: rank r of W gets rows ``[r·B/W, (r+1)·B/W)`` of the batch the
single-process trainer would draw), so W slices of B/W rows together are exactly the batch of B rows.
Losses are means over a rank's rows, weighted by the rank's share n_r·W/N of the global batch (1 when
N splits evenly; the trainer's closure does it), so that averaging them over the ranks
(:meth:`DataParallel.mean`) gives the mean over the global batch, and so does DDP's gradient average
in ``backward`` (unless the pass runs under ``no_sync``: :func:`flatlab.optim.protocol.local_pass`).

What stays identical on every rank, so that every rank applies the same update:

* the global torch RNG (seeded identically, consumed identically): TSAM's noise draws, IRE's
  sampled labels (each rank draws the uniforms of the whole global batch and keeps its rows, so the
  labels equal the single-process ones), dropout masks (the same mask pattern on each rank's rows);
* the shuffling generator (every rank computes the same permutation);
* augmentation draws are NOT shared: each rank augments its own rows with a generator seeded from
  (seed, epoch, rank) at the start of every epoch (checkpoints are taken at epoch ends, so a resumed
  trial repeats them exactly).

With micro-batches (``micro_batch_size``) every chunk's backward all-reduces the gradient accumulated
so far (correct, as DDP averages what it finds; more traffic than syncing only the last chunk).

The process group itself is started by the caller (Ray Train's ``TorchTrainer``, or
``torch.distributed.init_process_group`` in tests).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from flatlab.errors import ConfigError


@dataclass(frozen=True)
class Shard:
    """This rank's rows of one global mini-batch: ``offset`` (first row) and ``total`` (global rows)."""

    offset: int
    total: int


class DataParallel:
    """The trial's data-parallel group as seen by one rank (``rank`` of ``world``).

    Args:
        rank, world: this process's rank and the number of ranks (``torch.distributed`` must be
            initialised when ``world > 1``).

    Raises:
        ValueError: ``world < 1``, ``rank`` outside ``[0, world)``, or ``world > 1`` without an
            initialised process group.
    """

    def __init__(self, rank: int, world: int) -> None:
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"DataParallel: need 0 <= rank < world, got rank={rank}, world={world}")
        if world > 1 and not (dist.is_available() and dist.is_initialized()):
            raise ValueError("DataParallel: world > 1 needs torch.distributed.init_process_group() first")
        self.rank = rank
        self.world = world

    @classmethod
    def from_environment(cls) -> "DataParallel":
        """The group of the initialised default process group (rank 0 of 1 when there is none)."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls(0, 1)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that reports metrics and writes checkpoints."""
        return self.rank == 0

    def wrap(self, model: nn.Module, device: torch.device, sync_batchnorm: bool = False) -> nn.Module:
        """``model`` (already on ``device``) inside ``DistributedDataParallel``, its BatchNorm layers first
        converted to ``nn.SyncBatchNorm`` (statistics over the global batch) if ``sync_batchnorm``; the
        model itself when ``world == 1``. DDP broadcasts rank 0's parameters and buffers.

        Raises:
            ConfigError: ``sync_batchnorm`` on a device other than CUDA (torch's SyncBatchNorm is GPU-only).
        """
        if self.world == 1:
            return model
        if sync_batchnorm and device.type != "cuda":
            raise ConfigError(
                f"trainer: sync_batchnorm=True needs CUDA devices (torch's SyncBatchNorm runs on GPUs only), but the "
                f"workers train on {device.type!r}: set sync_batchnorm=False (each worker normalises with its own rows)"
            )
        if sync_batchnorm:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        ids = [device.index] if device.type == "cuda" and device.index is not None else None
        return DistributedDataParallel(model, device_ids=ids)

    def shard(self, n: int) -> slice:
        """This rank's rows of a global batch of ``n`` rows: contiguous, sizes differing by at most 1."""
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (1 if self.rank < extra else 0))

    def shard_of(self, n: int) -> Shard:
        """:meth:`shard` as a :class:`Shard` (offset, total)."""
        return Shard(self.shard(n).start, n)

    def augment_seed(self, seed: int, epoch: int) -> int:
        """Seed of this rank's augmentation generator for ``epoch`` (distinct per rank and epoch)."""
        return (seed * 1_000_003 + epoch * 4099 + self.rank) % (2**63 - 1)

    @torch.no_grad()
    def mean_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Average ``tensors`` over the ranks, in place (one all-reduce per tensor; nothing when W = 1)."""
        if self.world == 1:
            return
        for t in tensors:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t.div_(self.world)

    @torch.no_grad()
    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """A new tensor: ``value`` averaged over the ranks (``value`` itself when W = 1)."""
        if self.world == 1:
            return value
        out = value.detach().clone()
        self.mean_([out])
        return out

    @torch.no_grad()
    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """A new tensor: ``value`` summed over the ranks."""
        if self.world == 1:
            return value
        out = value.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out


def sampled_uniforms(n: int, shard: Optional[Shard], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``(n, 1)`` uniforms for sampling ``n`` labels: ``torch.rand(n, 1)``, or with a ``shard`` the
    shard's rows of ``torch.rand(shard.total, 1)`` (so every rank consumes the global RNG alike and the
    labels equal the single-process draw over the global batch)."""
    if shard is None:
        return torch.rand(n, 1, device=device, dtype=dtype)
    return torch.rand(shard.total, 1, device=device, dtype=dtype)[shard.offset : shard.offset + n]


@contextlib.contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """``model.no_sync()`` for a DDP model (forward AND backward inside the block are not all-reduced);
    nothing for any other module."""
    if isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    else:
        yield


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (the model itself otherwise)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def mean_grads_(parallel: Optional[DataParallel], grads: List[Optional[torch.Tensor]]) -> None:
    """Average the non-``None`` ``grads`` over the ranks in place (IRE's sampled-label gradients)."""
    if parallel is not None and parallel.world > 1:
        parallel.mean_([g for g in grads if g is not None])
