"""``fashion_mnist``: Zalando's Fashion-MNIST (Xiao, Rasul & Vollgraf 2017), 28x28 grey images of 10
kinds of clothing; 60,000 training and 10,000 test images, 6,000 / 1,000 per class.

Models (``model``, :mod:`flatlab.workloads.fmnist_nets`): DeepOBS's ``2c2d`` and ``mlp`` (test problems
``fmnist_2c2d``, ``fmnist_mlp``; architecture and initialisation as DeepOBS defines them) and
``small_cnn``, a 21k-parameter CNN for CPU studies.

Sources (``data_path``, the convention of :mod:`flatlab.workloads.sources`): ``None`` (default) reads
Debian's folder :data:`DEBIAN_DIR` when it holds the four IDX files (read by :mod:`flatlab.workloads.idx`,
never torchvision's downloader), else the hub dataset ``hub_name``; a folder of the four IDX files
(``.gz`` or not); a ``save_to_disk`` folder; or ``"synthetic"`` (generated images, for tests). Missing
data fails in :meth:`FashionMNIST.check_data`, before a study starts anything, with one message that
says how to get it (:func:`how_to_get`).

Splits: ``val`` = ``val_size`` training images held out, stratified by class, chosen by the study seed
(:func:`~flatlab.workloads.images.holdout_split`); ``train`` = the rest, or a stratified subset of
``train_size`` of it (another draw from the same seed); ``test`` = the official 10,000 test images,
evaluated once at the end. ``val_size = 0`` trains on all 60,000 and validates on the test split.
Pixels / 255 into [0, 1], no normalisation, no augmentation; default recipe batch 128, constant
learning rate, no label smoothing (DeepOBS's baselines).

How this compares with DeepOBS's PyTorch and TensorFlow data code: ``docs/workloads.md`` (Fashion-MNIST).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Tuple

import numpy as np
import torch
from PIL import Image
from torch import nn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.lazy import lazy, load
from flatlab.workloads.base import Data, Split, TrainDefaults, Workload
from flatlab.workloads.fmnist_nets import FMNIST_MODELS, NUM_CLASSES, build_fmnist_net
from flatlab.workloads.idx import read_idx_pair
from flatlab.workloads.images import ImageClassifier, holdout_split, synthetic_images
from flatlab.workloads.registry import register_workload
from flatlab.workloads.sources import (
    DataUnavailable,
    describe_error,
    get_split,
    is_synthetic,
    load_hf,
    require_columns,
    require_split,
)

datasets = lazy("datasets")  # optional (the vision extra): _load_hf says how to get the data without it

#: where Debian's package ``dataset-fashion-mnist`` installs the four gzipped IDX files
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
HUB_NAME = "zalando-datasets/fashion_mnist"
#: split -> (images file, labels file), each read with or without a ``.gz`` suffix
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
IMAGE_SHAPE = (28, 28)

Arrays = Tuple[np.ndarray, np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]  # x_train, y_train, x_test, y_test


def how_to_get(hub_name: str = HUB_NAME) -> str:
    """The three ways to provide Fashion-MNIST, in one sentence (for error messages)."""
    stems = ", ".join(s for pair in IDX_FILES.values() for s in pair)
    return (
        f"Get Fashion-MNIST in one of three ways: (1) apt: `sudo apt-get update && sudo apt-get install -y "
        f"dataset-fashion-mnist` installs it in {DEBIAN_DIR}/, which is found by default (`make data` does this "
        f"when run as root); (2) the hub: leave data_path unset on a machine that reaches huggingface.co "
        f"({hub_name!r}), or save it elsewhere with `datasets.load_dataset({hub_name!r}).save_to_disk(DIR)` and "
        f"pass workload_params={{'data_path': DIR}}; (3) a folder: workload_params={{'data_path': DIR}} with the "
        f"four IDX files {stems} (.gz or not). For tests: data_path='synthetic'."
    )


def find_idx_files(folder: Path) -> Tuple[Dict[str, Path], List[str]]:
    """``({stem: path}, [missing stems])`` for the four IDX files in ``folder`` (plain preferred over ``.gz``)."""
    found: Dict[str, Path] = {}
    missing: List[str] = []
    for stem in (s for pair in IDX_FILES.values() for s in pair):
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                found[stem] = folder / name
                break
        else:
            missing.append(stem)
    return found, missing


def read_idx_folder(folder: Path) -> Arrays:
    """Train and test arrays from the four IDX files in ``folder``: ``(N, 28, 28)`` uint8, ``(N,)`` int64.

    Raises:
        DataUnavailable: a file is missing (the message lists which); :class:`~flatlab.workloads.idx.IdxFormatError`
            for a corrupt file (naming it).
    """
    found, missing = find_idx_files(folder)
    if missing:
        raise DataUnavailable(
            f"workload 'fashion_mnist': {folder} lacks {', '.join(missing)} (.gz or not). {how_to_get()}"
        )
    out = []
    for images, labels in IDX_FILES.values():
        out += read_idx_pair(found[images], found[labels], image_shape=IMAGE_SHAPE, num_classes=NUM_CLASSES)
    return tuple(out)  # type: ignore[return-value]


def _grey_uint8(images: List[Any], source: str) -> np.ndarray:
    """``(N, 28, 28)`` uint8 from PIL images or arrays (``(28, 28)`` or ``(28, 28, 1)``)."""
    out = []
    for im in images:
        if isinstance(im, Image.Image):
            im = im.convert("L") if im.mode != "L" else im
        arr = np.asarray(im, dtype=np.uint8)
        if arr.ndim == 3 and arr.shape[-1] == 1:
            arr = arr[..., 0]
        if arr.shape != IMAGE_SHAPE:
            raise DataUnavailable(
                f"workload 'fashion_mnist': an image of shape {arr.shape} in {source}; expected 28x28 grey"
            )
        out.append(arr)
    return np.stack(out) if out else np.zeros((0, *IMAGE_SHAPE), np.uint8)


def _hf_arrays(dsets: Any, source: str, data_path: Optional[str]) -> Arrays:
    train_ds = require_split(dsets, ("train",), "fashion_mnist", data_path)
    test_ds = get_split(dsets, ("test",))
    img = require_columns(train_ds, ("image", "img"), "image", "fashion_mnist")
    lab = require_columns(train_ds, ("label",), "label", "fashion_mnist")

    def arrays(ds: Any) -> Tuple[np.ndarray, np.ndarray]:
        x = np.concatenate(
            [_grey_uint8(ds[s : s + 4096][img], source) for s in range(0, len(ds), 4096)]
            or [np.zeros((0, 28, 28), np.uint8)]
        )
        return x, np.asarray(list(ds[lab]), dtype=np.int64)

    x, y = arrays(train_ds)
    x_te, y_te = arrays(test_ds) if test_ds is not None else (None, None)
    return x, y, x_te, y_te


def _synthetic_arrays(n: int) -> Arrays:
    x, y = synthetic_images(n + n // 4, NUM_CLASSES, IMAGE_SHAPE[0], seed=0)
    x = np.ascontiguousarray(x[:, 0])  # grey: one channel of the colour templates, (n, 28, 28)
    return x[:n], y[:n], x[n:], y[n:]


def split_train(y: np.ndarray, val_size: int, train_size: Optional[int], seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, val)`` into the training pool ``y`` ``(N,)``: a stratified hold-out of ``val_size``
    chosen by ``seed``, and of the rest all (``train_size=None``) or a stratified subset of ``train_size``.

    Raises:
        ConfigError: ``val_size`` or ``train_size`` larger than what is left of the ``N`` images.
    """
    n = len(y)
    if val_size >= n:
        raise ConfigError(
            f"workload 'fashion_mnist': val_size={val_size} leaves no training image of the {n}; expected < {n}"
        )
    rest, va = holdout_split(y, val_size, seed)
    if train_size is None:
        return rest, va
    if train_size > len(rest):
        raise ConfigError(
            f"workload 'fashion_mnist': train_size={train_size} exceeds the {len(rest)} training images "
            f"left after val_size={val_size}; expected <= {len(rest)} or None (all)"
        )
    _, keep = holdout_split(y[rest], train_size, seed, stream=0x5B5)  # stratified subset, independent of the hold-out
    return rest[keep], va


@register_workload
class FashionMNIST(Workload):
    """Fashion-MNIST classification, 10 classes; metric ``val/accuracy`` (max). See the module docstring."""

    name = "fashion_mnist"
    doc = (
        "Fashion-MNIST, 28x28 grey, 10 classes; models: DeepOBS 2c2d and mlp, small_cnn "
        "(Debian's IDX files, an IDX folder, the hub zalando-datasets/fashion_mnist, or synthetic)"
    )
    hparams = (
        HParam(
            "model",
            "small_cnn",
            str,
            choices=FMNIST_MODELS,
            doc="network: '2c2d' DeepOBS fmnist_2c2d (3,274,634 params), 'mlp' DeepOBS fmnist_mlp (1,336,610), "
            "'small_cnn' 2 strided conv + 1 dense, for CPUs (20,746 at width 16)",
        ),
        HParam("width", 16, int, low=1, doc="small_cnn only: channels of the first conv (the second has 2 x width)"),
        HParam("batchnorm", False, bool, doc="small_cnn only: BatchNorm after each conv"),
        HParam(
            "data_path",
            None,
            str,
            nullable=True,
            doc=f"None: {DEBIAN_DIR}/ if present, else the hub; a folder of the 4 IDX files (.gz or not); "
            "a save_to_disk folder; or 'synthetic'",
        ),
        HParam(
            "hub_name",
            HUB_NAME,
            str,
            doc="Hugging Face dataset used when data_path is None and Debian's folder is absent",
        ),
        HParam("synthetic_size", 600, int, low=20, doc="data_path='synthetic': training images (test: a quarter)"),
        HParam(
            "val_size",
            10000,
            int,
            low=0,
            doc="training images held out for validation (stratified, study seed; DeepOBS's PyTorch split: 10,000); "
            "0: train on all 60,000, val = test (DeepOBS 1.1's published baselines)",
        ),
        HParam(
            "train_size",
            None,
            int,
            low=1,
            nullable=True,
            doc="a stratified subset of the remaining training images (None: all)",
        ),
    )
    data_hparams = ("data_path", "hub_name", "synthetic_size", "val_size", "train_size")
    train_defaults = TrainDefaults(batch_size=128, schedule="constant")
    #: tiny offline parameters (synthetic data, a 4-channel small_cnn): for tests over the registry
    smoke_params: ClassVar[Dict[str, Any]] = {
        "data_path": "synthetic",
        "synthetic_size": 200,
        "model": "small_cnn",
        "width": 4,
    }

    def _source(self) -> Tuple[str, Optional[Path]]:
        """``("synthetic" | "idx" | "hf", folder)``: where :meth:`load_data` reads from (files are not opened).

        Raises:
            DataUnavailable: an explicit ``data_path`` that does not exist.
        """
        path = self.params["data_path"]
        if is_synthetic(path):
            return "synthetic", None
        if path is None:
            return ("idx", DEBIAN_DIR) if not find_idx_files(DEBIAN_DIR)[1] else ("hf", None)
        folder = Path(path).expanduser()
        if not folder.exists():
            raise DataUnavailable(
                f"workload 'fashion_mnist': data_path={path!r} does not exist. {how_to_get(self.params['hub_name'])}"
            )
        if folder.is_dir() and not any(folder.iterdir()):
            raise DataUnavailable(
                f"workload 'fashion_mnist': data_path={path!r} is an empty folder. "
                f"{how_to_get(self.params['hub_name'])}"
            )
        found, missing = find_idx_files(folder) if folder.is_dir() else ({}, [])
        if found and missing:
            raise DataUnavailable(
                f"workload 'fashion_mnist': data_path={path!r} holds {len(found)} of the 4 IDX files; "
                f"missing {', '.join(missing)} (.gz or not). {how_to_get(self.params['hub_name'])}"
            )
        return ("idx", folder) if found else ("hf", folder)

    def _load_hf(self, folder: Optional[Path]) -> Any:
        """The hub dataset (``folder`` None) or a ``save_to_disk`` folder, as ``datasets`` returns it.

        Raises:
            DataUnavailable: neither can be read; the message says why and how to get the data.
        """
        hub = self.params["hub_name"]
        if folder is None:
            state = "does not exist" if not DEBIAN_DIR.exists() else f"lacks {', '.join(find_idx_files(DEBIAN_DIR)[1])}"
            hint = f"Debian's folder {DEBIAN_DIR} {state} either. {how_to_get(hub)}"
        else:
            hint = f"{folder} holds none of the four IDX files either. {how_to_get(hub)}"
        try:
            load(datasets)  # only checks it is there
        except ImportError as exc:
            raise DataUnavailable(
                f"workload 'fashion_mnist': reading {folder or 'the hub'} needs the `datasets` package "
                f"({describe_error(exc)}); {hint}"
            ) from exc
        return load_hf("fashion_mnist", hub, None, str(folder) if folder is not None else None, hint=hint)

    def check_data(self) -> None:
        """Fail now, in one message, when :meth:`load_data` would find no data (see :func:`how_to_get`).

        Cheap: finds the IDX files without reading them; opens the hub dataset (from its cache, or a
        ``save_to_disk`` folder) only when that is the source.

        Raises:
            DataUnavailable: no source has the data.
        """
        kind, folder = self._source()
        if kind == "hf":
            self._load_hf(folder)

    def _arrays(self) -> Tuple[Arrays, str]:
        kind, folder = self._source()
        if kind == "synthetic":
            return _synthetic_arrays(self.params["synthetic_size"]), "synthetic"
        if kind == "idx":
            assert folder is not None
            return read_idx_folder(folder), str(folder)
        source = str(folder) if folder is not None else self.params["hub_name"]
        return _hf_arrays(self._load_hf(folder), source, self.params["data_path"]), source

    def load_data(self, seed: int) -> Data:
        """Train / val / test as uint8 ``(N, 1, 28, 28)`` images and int64 ``(N,)`` labels; see the module docstring.

        Raises:
            DataUnavailable: no data (see :meth:`check_data`), a corrupt IDX file (naming it), labels
                outside [0, 10).
            ConfigError: ``val_size`` / ``train_size`` larger than the training set allows;
                ``val_size = 0`` with data that has no test split.
        """
        p = self.params
        (x, y, x_te, y_te), source = self._arrays()
        for labels in (y, y_te):
            if labels is not None and labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
                raise DataUnavailable(
                    f"workload 'fashion_mnist': labels must lie in [0, {NUM_CLASSES}), got "
                    f"[{labels.min()}, {labels.max()}] from {source}"
                )
        val_size = min(p["val_size"], len(y) // 4) if source == "synthetic" else p["val_size"]
        if val_size == 0 and x_te is None:
            raise ConfigError(
                f"workload 'fashion_mnist': val_size=0 validates on the test split, but {source} has none"
            )
        tr, va = split_train(y, val_size, p["train_size"], seed)

        def split(xs: np.ndarray, ys: np.ndarray) -> Split:
            return Split(
                torch.from_numpy(np.ascontiguousarray(xs[:, None])), torch.from_numpy(np.ascontiguousarray(ys))
            )

        test = split(x_te, y_te) if x_te is not None and y_te is not None else None
        val = split(x[va], y[va]) if val_size else test
        meta = {
            "source": source,
            "split_seed": seed,
            "num_classes": NUM_CLASSES,
            "val_size": val_size,
            "train_size": len(tr),
            "train_pool": len(y),
        }
        return Data(train=split(x[tr], y[tr]), val=val, test=test, meta=meta)  # type: ignore[arg-type]

    def build_model(self) -> nn.Module:
        p = self.params
        return ImageClassifier(build_fmnist_net(p["model"], p["width"], p["batchnorm"]), mean=(0.0,), std=(1.0,))
