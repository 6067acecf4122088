"""Checkpoints that load without executing code: tensors in safetensors, everything else as JSON.

A trainer state (model, optimizer, scheduler, RNG states, counters) is a tree of dicts, lists and
tuples whose leaves are tensors, ints, floats, bools, ``None`` and strings. :func:`save_state` writes
the tensors to ``trainer.safetensors`` and the tree, with each tensor replaced by a reference to its
safetensors key, to ``trainer.json``. Neither format can run code when read (unlike pickle, which
``torch.load(weights_only=False)`` executes), and :func:`load_state` rebuilds the tree exactly:
tuples stay tuples (Adam's ``betas``), non-string dict keys stay ints (an optimizer's per-parameter
``state``), floats round-trip through ``repr`` bit for bit (NaN and infinities included).

JSON encoding of the tree (a value is one of):

* ``null``, ``true``/``false``, a number, a string: itself;
* a list: a JSON array of encoded values;
* ``{"__tensor__": key}``: the tensor stored under ``key`` in the safetensors file;
* ``{"__tuple__": [...]}``: a tuple;
* ``{"__dict__": [[key, value], ...]}``: a dict whose keys are not all strings, or one with a key
  starting with ``"__"`` (so a stored dict is never mistaken for a marker);
* any other JSON object: a dict with string keys.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Dict, Iterable, Iterator, Optional, Tuple

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from flatlab.errors import FlatlabError

#: the two files of a checkpoint directory
TENSORS_FILE = "trainer.safetensors"
STATE_FILE = "trainer.json"
CHECKPOINT_FILES: Tuple[str, str] = (TENSORS_FILE, STATE_FILE)
FORMAT = "flatlab.trainer-state"
VERSION = 1

_TENSOR, _TUPLE, _DICT = "__tensor__", "__tuple__", "__dict__"
# Leaves that encode as themselves: a list or tuple of only these (RNG states: 625 ints; the loss curve:
# up to 2 x 1024 numbers) is copied in one pass instead of being walked element by element.
_PLAIN = frozenset((int, float, bool, str, type(None)))


class CheckpointError(FlatlabError, ValueError):
    """A checkpoint directory is not in flatlab's safe form (missing files, an old pickle
    ``trainer.pt``, a malformed or tampered file); the message names the file."""


class _Encoder:
    """Walks a state tree, collecting tensors into ``tensors`` and returning the JSON-ready tree
    (``copy``: every tensor is copied, so the tree no longer shares memory with the live state)."""

    def __init__(self, copy: bool = False) -> None:
        self.tensors: Dict[str, torch.Tensor] = {}
        self._storages: set = set()
        self._copy = copy

    def _key(self, path: str) -> str:
        key, n = path or "tensor", 1
        while key in self.tensors:
            key, n = f"{path}#{n}", n + 1
        return key

    def _tensor(self, t: torch.Tensor, path: str) -> Dict[str, str]:
        if self._copy:  # an own, contiguous CPU copy (one copy: a GPU tensor is copied by the move itself)
            t = t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)
        else:
            t = t.detach().to("cpu")
        storage = t.untyped_storage()
        shared = storage.data_ptr() in self._storages and t.numel() > 0
        # safetensors refuses tensors that share memory (tied weights, views): store a copy of those
        if shared or not t.is_contiguous() or storage.nbytes() != t.numel() * t.element_size():
            t = t.clone(memory_format=torch.contiguous_format)
        self._storages.add(t.untyped_storage().data_ptr())
        key = self._key(path)
        self.tensors[key] = t
        return {_TENSOR: key}

    def encode(self, value: Any, path: str = "") -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value, path)
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)):
            return float(value)
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, (list, tuple)) and all(type(v) in _PLAIN for v in value):
            return {_TUPLE: list(value)} if isinstance(value, tuple) else list(value)
        if isinstance(value, tuple):
            return {_TUPLE: [self.encode(v, f"{path}.{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, f"{path}.{i}") for i, v in enumerate(value)]
        if isinstance(value, dict):
            items = [
                (self.encode(k, path), self.encode(v, f"{path}.{k}" if path else str(k))) for k, v in value.items()
            ]
            if all(isinstance(k, str) and not k.startswith("__") for k in value):
                return dict(items)
            return {_DICT: [[k, v] for k, v in items]}
        raise TypeError(
            f"save_state: {type(value).__name__} at {path or 'the root'!r} cannot be checkpointed safely; "
            "allowed: tensors, int, float, bool, None, str, and lists/tuples/dicts of them"
        )


def _decode(value: Any, tensors: Dict[str, torch.Tensor], where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_decode(v, tensors, where) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and _TENSOR in value:
            key = value[_TENSOR]
            if not isinstance(key, str) or key not in tensors:
                raise CheckpointError(f"{where}: refers to tensor {key!r}, which the safetensors file does not hold")
            return tensors[key]
        if len(value) == 1 and _TUPLE in value and isinstance(value[_TUPLE], list):
            return tuple(_decode(v, tensors, where) for v in value[_TUPLE])
        if len(value) == 1 and _DICT in value and isinstance(value[_DICT], list):
            out = {}
            for pair in value[_DICT]:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise CheckpointError(f"{where}: malformed {_DICT} entry {pair!r} (expected [key, value])")
                k = _decode(pair[0], tensors, where)
                if isinstance(k, (list, dict)):
                    raise CheckpointError(f"{where}: unhashable dict key {pair[0]!r}")
                out[k] = _decode(pair[1], tensors, where)
            return out
        if any(k.startswith("__") for k in value):
            raise CheckpointError(f"{where}: unknown marker object with keys {sorted(value)}")
        return {k: _decode(v, tensors, where) for k, v in value.items()}
    raise CheckpointError(f"{where}: unexpected JSON value {value!r}")  # pragma: no cover (json yields no others)


class StateSnapshot:
    """A state captured now and written later (:func:`snapshot_state`): the JSON-ready tree and its
    tensors, on CPU, in memory of their own. Training can go on while another thread calls
    :meth:`write`; what is written is the state as it was when captured."""

    def __init__(self, tree: Any, tensors: Dict[str, torch.Tensor]) -> None:
        self.tree, self.tensors = tree, tensors

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data the snapshot holds."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def write(self, directory: str) -> None:
        """Write ``directory/trainer.safetensors`` (the tensors) and ``directory/trainer.json`` (the tree);
        ``directory`` is created if missing. :func:`load_state` reads them back."""
        os.makedirs(directory, exist_ok=True)
        save_file(
            self.tensors, os.path.join(directory, TENSORS_FILE), metadata={"format": FORMAT, "version": str(VERSION)}
        )
        text = json.dumps({"format": FORMAT, "version": VERSION, "state": self.tree})  # one C-encoded string, one write
        with open(os.path.join(directory, STATE_FILE), "w", encoding="utf-8") as f:
            f.write(text)


def snapshot_state(state: Any) -> StateSnapshot:
    """Capture ``state`` for a later :meth:`StateSnapshot.write`: the tree is encoded now and every tensor
    copied to CPU (GPU tensors: the one device-to-host copy a save needs anyway; CPU tensors: a copy in
    memory), so changes to the live state after this call are not written. Much cheaper than the save
    itself, which then runs off the training thread (figures: ``bench/README.md``).

    Raises:
        TypeError: a leaf of ``state`` is not a tensor, int, float, bool, None or str.
    """
    enc = _Encoder(copy=True)
    tree = enc.encode(state)
    return StateSnapshot(tree, enc.tensors)


@contextlib.contextmanager
def written(snapshot: Optional[StateSnapshot]) -> Iterator[Optional[str]]:
    """A temporary folder holding ``snapshot`` written (:meth:`StateSnapshot.write`) for the duration of
    the block, removed after it however the block ends; ``None`` for ``None`` (a report without a
    checkpoint). Tune and Ray Train copy a reported checkpoint folder into the trial's storage before
    their ``report`` returns, so the block is the report."""
    if snapshot is None:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="flatlab-checkpoint-")
    try:
        snapshot.write(folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def save_state(state: Any, directory: str) -> None:
    """Write ``state`` as ``directory/trainer.safetensors`` (every tensor, moved to CPU) and
    ``directory/trainer.json`` (the rest of the tree); ``directory`` is created if missing.

    Raises:
        TypeError: a leaf of ``state`` is not a tensor, int, float, bool, None or str.
    """
    enc = _Encoder()
    tree = enc.encode(state)
    StateSnapshot(tree, enc.tensors).write(directory)


def _missing_message(directory: str, missing: Iterable[str]) -> str:
    found = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    msg = f"checkpoint {directory!r} lacks {', '.join(missing)}"
    if any(n.endswith((".pt", ".pth", ".pkl", ".pickle")) for n in found):
        legacy = [n for n in found if n.endswith((".pt", ".pth", ".pkl", ".pickle"))]
        msg += (
            f"; it holds {', '.join(legacy)}, a pickle (an old checkpoint or a crafted one), which flatlab refuses "
            "to load"
        )
    elif found:
        msg += f"; it holds {', '.join(found)}"
    return msg + ". Checkpoints are trainer.safetensors + trainer.json; start the trial afresh."


def load_state(directory: str) -> Any:
    """Read a state written by :func:`save_state` (tensors on CPU). Nothing read can execute code.

    Raises:
        CheckpointError: a file is missing (e.g. only an old pickle ``trainer.pt`` is there), the JSON
            is not valid or not flatlab's format/version, the safetensors file is malformed, or the tree
            refers to a tensor the safetensors file does not hold. The message names the file.
    """
    tensors_path, state_path = (os.path.join(directory, n) for n in CHECKPOINT_FILES)
    missing = [p for p in (tensors_path, state_path) if not os.path.isfile(p)]
    if missing:
        raise CheckpointError(_missing_message(directory, missing))
    try:
        with open(state_path, "r", encoding="utf-8") as f:
            doc = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{state_path}: not a JSON trainer state ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION or "state" not in doc:
        head = {k: doc[k] for k in ("format", "version") if k in doc} if isinstance(doc, dict) else type(doc).__name__
        raise CheckpointError(f"{state_path}: not a {FORMAT} version {VERSION} file (found {head})")
    try:
        tensors = load_file(tensors_path, device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{tensors_path}: not a valid safetensors file ({exc})") from None
    return _decode(doc["state"], tensors, state_path)


__all__ = [
    "CHECKPOINT_FILES",
    "CheckpointError",
    "STATE_FILE",
    "StateSnapshot",
    "TENSORS_FILE",
    "load_state",
    "save_state",
    "snapshot_state",
    "written",
]
