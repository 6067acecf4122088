"""Training images decoded on the fly: :class:`LazyImages`, a stand-in for a uint8 ``(N, 3, S, S)`` tensor.

A data set too large for memory (ImageNet's 1.28M training images take 190 GB as 224x224 uint8) is held
as its list of items (file paths, or row indices of a data set) and a picklable reader that decodes and
preprocesses one item. Indexing it with the rows of a mini-batch decodes just those images, on a thread
pool (PIL decodes and resizes without holding the GIL), and :meth:`LazyImages.prefetch` starts decoding
the next mini-batch in the background while the current one trains (the trainer calls it when its
training inputs have such a method).

Pickling (Ray's object store, a trial on another node) carries the items and the reader, never pixels:
the receiving process re-opens the files, so they must lie on a filesystem every node sees (a shared or
replicated mount at the same path).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from flatlab.errors import ConfigError

ItemReader = Callable[[Any], torch.Tensor]
"""One item (an element of :attr:`LazyImages.items`) -> uint8 ``(3, S, S)``; raises ConfigError naming
the item when it cannot be read. May have ``describe(item) -> str`` (used in error messages)."""


def default_workers(workers: int = 0) -> int:
    """Decoding threads: ``workers``, or for 0 ``min(8, torch.get_num_threads())``: torch's thread
    count is the process's CPU share (a trial sets it to its CPU allocation; elsewhere it is the
    machine's cores), so a 1-CPU trial on a shared node does not start 8 decoders."""
    return workers or min(8, max(1, torch.get_num_threads()))


class LazyImages:
    """A uint8 image tensor ``(N, 3, S, S)`` whose rows are decoded when indexed.

    Args:
        items: the ``N`` items, a 1-D numpy array (e.g. file paths as bytes, or int row indices); kept
            as given, row ``i`` is ``read(items[i])``.
        read: picklable :data:`ItemReader` (holds the pixel transform, not the pixels).
        workers: decoding threads per process (0 = :func:`default_workers`).

    The first item is decoded once here, to learn ``S`` (:attr:`shape`).

    Indexing (``x[idx]``): a 1-D integer index (LongTensor, numpy array or list; negative values count
    from the end) or a slice gives the decoded batch uint8 ``(B, 3, S, S)``, row ``b`` = item
    ``idx[b]``, the same pixels the in-memory tensor of these items would hold; an int gives one image
    ``(3, S, S)``. Thread-safe.

    Pickling carries ``items``, ``read``, ``workers`` and the shape only (a few bytes per item): the
    files are re-opened where it is unpickled, so they must be on a filesystem every node sees.

    Raises:
        ConfigError: no items; (when decoding, here or on indexing) an item that cannot be read (missing
            file, not an image) or whose shape after preprocessing differs from the first item's; both
            name the item.
        IndexError: (on indexing) rows out of range.
    """

    def __init__(self, items: Sequence[Any], read: ItemReader, *, workers: int = 0) -> None:
        self.items = np.asarray(items)
        if self.items.ndim != 1:
            raise ValueError(f"items must be one-dimensional; got shape {self.items.shape}")
        if len(self.items) == 0:
            raise ConfigError("no images selected")
        self.read = read
        self.workers = workers
        first = read(self.items[0])
        self._item_shape: Tuple[int, ...] = tuple(first.shape)
        self._setup()

    def _setup(self) -> None:
        self._pool: Optional[ThreadPoolExecutor] = None
        self._pending: Optional[Tuple[List[int], List[Future]]] = None
        self._lock = threading.Lock()

    # ---- pickling: items and reader only --------------------------------------------------------
    def __getstate__(self) -> dict:
        return {"items": self.items, "read": self.read, "workers": self.workers, "_item_shape": self._item_shape}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    # ---- tensor-like surface ---------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        """``(N, 3, S, S)``."""
        return torch.Size((len(self.items), *self._item_shape))

    @property
    def dtype(self) -> torch.dtype:
        """``torch.uint8``."""
        return torch.uint8

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"LazyImages(shape={tuple(self.shape)}, workers={default_workers(self.workers)})"

    def __getitem__(self, idx: Any) -> torch.Tensor:
        if isinstance(idx, (int, np.integer)) or (isinstance(idx, torch.Tensor) and idx.ndim == 0):
            return self[[int(idx)]][0]
        rows = self._rows(idx)
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None and pending[0] == rows:
            futures = pending[1]
        else:
            if pending is not None:
                _cancel(pending[1])
            futures = self._submit(rows)
        return self._collect(rows, futures)

    def prefetch(self, idx: Any) -> None:
        """Start decoding rows ``idx`` (as for indexing) in the background; the next ``self[idx]`` with
        the same rows then returns them without decoding again. Replaces an earlier prefetch not yet
        taken (whose decoding is abandoned). Errors surface at that indexing, not here."""
        rows = self._rows(idx)
        futures = self._submit(rows)
        with self._lock:
            old, self._pending = self._pending, (rows, futures)
        if old is not None:
            _cancel(old[1])

    def close(self) -> None:
        """Abandon a pending prefetch and stop the decoding threads (indexing restarts them)."""
        with self._lock:
            pending, self._pending = self._pending, None
            pool, self._pool = self._pool, None
        if pending is not None:
            _cancel(pending[1])
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    # ---- internals -------------------------------------------------------------------------------
    def _rows(self, idx: Any) -> List[int]:
        n = len(self.items)
        if isinstance(idx, slice):
            return list(range(*idx.indices(n)))
        if isinstance(idx, torch.Tensor):
            if idx.dtype == torch.bool or idx.is_floating_point() or idx.is_complex() or idx.ndim != 1:
                raise IndexError(
                    f"LazyImages takes a 1-D integer index or a slice; got a {idx.dtype} tensor of shape "
                    f"{tuple(idx.shape)}"
                )
            rows = idx.tolist()
        else:
            arr = np.asarray(idx)
            if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
                raise IndexError(
                    f"LazyImages takes a 1-D integer index or a slice; got {type(idx).__name__} of shape {arr.shape}"
                )
            rows = arr.tolist()
        out = []
        for r in rows:
            if not -n <= r < n:
                raise IndexError(f"row {r} is out of range for {n} images")
            out.append(r + n if r < 0 else r)
        return out

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=default_workers(self.workers), thread_name_prefix="lazy-images"
                )
            return self._pool

    def _submit(self, rows: List[int]) -> List[Future]:
        pool = self._executor()
        return [pool.submit(self.read, self.items[r]) for r in rows]

    def _collect(self, rows: List[int], futures: List[Future]) -> torch.Tensor:
        out = torch.empty((len(rows), *self._item_shape), dtype=torch.uint8)
        try:
            for b, (r, fut) in enumerate(zip(rows, futures)):
                t = fut.result()
                if tuple(t.shape) != self._item_shape:
                    raise ConfigError(
                        f"image {_describe(self.read, self.items[r])} has shape {tuple(t.shape)} after preprocessing, "
                        f"expected {self._item_shape} (that of the first image)"
                    )
                out[b] = t
        except BaseException:
            _cancel(futures)
            raise
        return out


def _cancel(futures: List[Future]) -> None:
    for f in futures:
        f.cancel()


def _describe(read: ItemReader, item: Any) -> str:
    describe = getattr(read, "describe", None)
    return describe(item) if describe is not None else repr(item)
