"""A token stream cut into next-token windows, the data of the language-model workloads (:mod:`flatlab.workloads.lm`).

:class:`TokenWindows`: a 1-D token stream (memory-mapped from a ``.npy`` file, or in memory) read as
``(N, context)`` int64 rows, inputs or targets shifted by one token, that pickles as its file's path only;
:class:`Stream`: a slice of a stream, cut into splits; :func:`markov_tokens`: the synthetic stream (a
random sparse Markov chain), for tests and smoke runs without a download.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

import numpy as np
import torch

from flatlab.workloads.base import Split


class TokenWindows:
    """A 1-D token stream as ``(N, context)`` int64 rows: row i = ``tokens[start + i*context + shift :][:context]``.

    Behaves like the tensors a :class:`~flatlab.workloads.base.Split` holds (``shape``, ``len``,
    indexing by int / slice / index tensor returns an int64 ``torch.Tensor``). ``shift=0`` gives the
    inputs, ``shift=1`` the next-token targets; only ``tokens[start:stop]`` is used and
    ``N = (stop - start - 1) // context``. A stream loaded from ``path`` (a ``.npy`` file,
    memory-mapped) pickles as ``(path, start, stop)`` only, so Ray never copies the tokens.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        context: int,
        shift: int = 0,
        path: Optional[str] = None,
        start: int = 0,
        stop: Optional[int] = None,
    ) -> None:
        if tokens.ndim != 1:
            raise ValueError(f"TokenWindows needs a 1-D token stream, got shape {tokens.shape}")
        self.tokens, self.context, self.shift, self.path = tokens, int(context), int(shift), path
        self.start = int(start)
        self.stop = int(len(tokens) if stop is None else min(stop, len(tokens)))
        self.n = max(0, (self.stop - self.start - 1) // self.context)

    @classmethod
    def from_file(
        cls, path: str, context: int, shift: int = 0, start: int = 0, stop: Optional[int] = None
    ) -> "TokenWindows":
        """Memory-map the ``.npy`` stream at ``path``."""
        return cls(np.load(path, mmap_mode="r"), context, shift, path, start, stop)

    def __reduce__(self) -> Any:
        if self.path is not None:
            return (TokenWindows.from_file, (self.path, self.context, self.shift, self.start, self.stop))
        used = np.asarray(self.tokens[self.start : self.start + self.n * self.context + 1])
        return (TokenWindows, (used, self.context, self.shift))

    @property
    def shape(self) -> Tuple[int, int]:
        return (self.n, self.context)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: Union[int, slice, torch.Tensor, np.ndarray]) -> torch.Tensor:
        if isinstance(idx, slice):
            rows = np.arange(self.n)[idx]
        elif isinstance(idx, torch.Tensor):
            rows = idx.cpu().numpy().astype(np.int64)
        else:
            rows = np.asarray(idx, dtype=np.int64)
        single = rows.ndim == 0
        rows = np.atleast_1d(rows)
        if rows.size and (rows.min() < -self.n or rows.max() >= self.n):
            raise IndexError(f"window index out of range for {self.n} windows")
        rows = rows % max(1, self.n)
        pos = self.start + self.shift + rows[:, None] * self.context + np.arange(self.context)[None, :]  # (B, context)
        out = torch.from_numpy(np.asarray(self.tokens[pos], dtype=np.int64))
        return out[0] if single else out


@dataclass(frozen=True)
class Stream:
    """``tokens[start:stop]`` of a token array, file-backed when ``path`` is set."""

    tokens: np.ndarray
    path: Optional[str] = None
    start: int = 0
    stop: Optional[int] = None

    def __len__(self) -> int:
        return (len(self.tokens) if self.stop is None else self.stop) - self.start

    def head(self, n: int) -> "Stream":
        """The first ``n`` tokens (or all, if fewer)."""
        return Stream(self.tokens, self.path, self.start, self.start + min(n, len(self)))

    def cut(self, n: int) -> Tuple["Stream", "Stream"]:
        """(the first ``n`` tokens, the rest)."""
        end = self.start + len(self)
        return Stream(self.tokens, self.path, self.start, self.start + n), Stream(
            self.tokens, self.path, self.start + n, end
        )

    def windows(self, context: int) -> Split:
        """A :class:`Split` of next-token windows (inputs and targets shifted by one)."""
        args = (self.path, self.start, self.stop)
        return Split(TokenWindows(self.tokens, context, 0, *args), TokenWindows(self.tokens, context, 1, *args))  # type: ignore[arg-type]


def markov_tokens(n: int, vocab: int, seed: int) -> np.ndarray:
    """``n`` tokens from a random sparse Markov chain over ``vocab`` symbols (4 successors each), int32."""
    rng = np.random.default_rng([seed, 0x1A])
    succ = rng.integers(0, vocab, size=(vocab, 4))
    choice = rng.integers(0, 4, size=n)
    out = np.empty(n, dtype=np.int32)
    t = int(rng.integers(0, vocab))
    for i in range(n):
        out[i] = t
        t = int(succ[t, choice[i]])
    return out
