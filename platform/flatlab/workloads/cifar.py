"""``cifar10`` and ``cifar100``: 32x32 colour images (Krizhevsky 2009), optionally with uniform label noise.

Sources (``data_path``, see :mod:`flatlab.workloads.sources`): the hub datasets ``uoft-cs/cifar10``
(columns ``img``, ``label``) and ``uoft-cs/cifar100`` (``img``, ``fine_label``), a local
``save_to_disk`` folder with ``train``/``test`` splits holding images (PIL or ``(32, 32, 3)`` uint8
arrays, column ``img`` or ``image``) and labels (``fine_label`` or ``label``), or ``"synthetic"``.

Splits: ``val_size`` training images (stratified, fixed by the study seed) are held out for model
selection; ``test`` is the official test set, evaluated once at the end. With ``label_noise = q``,
exactly ``round(q * N_train)`` labels of the (remaining) training split are replaced by a different
class drawn uniformly from the other C-1 (TSAM paper, Table 1: q = 0.2 on CIFAR-100); validation
and test labels stay clean. ``Data.meta`` records ``noisy_indices`` (positions in the training
split) and ``clean_train_targets``.

Augmentation (training only, drawn from the trainer's generator): ``crop_flip`` (random crop after
4-pixel zero padding + horizontal flip), ``autoaugment`` (torchvision's CIFAR-10 AutoAugment policy,
then crop + flip; for ViTs) or ``none``. Default recipe: batch 128, cosine, label smoothing 0.1
(IRE Table 1; TSAM uses batch 64, set by its studies).
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict, Optional, Tuple

import numpy as np
import torch
from torch import nn

from flatlab.hparams import HParam
from flatlab.workloads.base import Data, Inputs, Split, TrainDefaults, Workload
from flatlab.workloads.cifar_nets import CIFAR_MODELS, build_cifar_net
from flatlab.workloads.images import (
    AUGMENTATIONS,
    CIFAR_MEAN,
    CIFAR_STD,
    ImageClassifier,
    augment_images,
    holdout_split,
    synthetic_images,
    to_chw_uint8,
    uniform_label_noise,
)
from flatlab.workloads.registry import register_workload
from flatlab.workloads.sources import get_split, is_synthetic, load_hf, require_columns, require_split


def image_column_to_uint8(ds: Any, column: str, size: int = 0, chunk: int = 2048) -> np.ndarray:
    """Column ``column`` of a ``datasets.Dataset`` as ``(N, 3, H, W)`` uint8 (see :func:`to_chw_uint8`)."""
    parts = []
    for start in range(0, len(ds), chunk):
        rows = ds[start : start + chunk][column]
        if not size:
            try:
                arr = np.asarray(rows, dtype=np.uint8)
                if arr.ndim == 4 and arr.shape[-1] == 3:
                    parts.append(arr.transpose(0, 3, 1, 2))
                    continue
            except (TypeError, ValueError):
                pass
        parts.append(to_chw_uint8(rows, size))
    return np.ascontiguousarray(np.concatenate(parts))


def split_and_noise(
    x: np.ndarray, y: np.ndarray, val_size: int, label_noise: float, num_classes: int, seed: int
) -> Tuple[Split, Split, Dict[str, Any]]:
    """(train, val, meta): a stratified hold-out of ``val_size`` and label noise on the training part."""
    tr, va = holdout_split(y, val_size, seed)
    y_tr = y[tr]
    meta: Dict[str, Any] = {"label_noise": label_noise}
    if label_noise > 0:
        noisy, idx = uniform_label_noise(y_tr, num_classes, label_noise, seed)
        meta.update(noisy_indices=idx, clean_train_targets=y_tr.copy(), noise_seed=seed)
        y_tr = noisy
    train = Split(torch.from_numpy(np.ascontiguousarray(x[tr])), torch.from_numpy(y_tr))
    val = Split(torch.from_numpy(np.ascontiguousarray(x[va])), torch.from_numpy(y[va]))
    return train, val, meta


class _Cifar(Workload):
    """CIFAR-10/100 classification; see the module docstring. Metric ``val/accuracy`` (max)."""

    num_classes: ClassVar[int]
    default_hub: ClassVar[str]
    label_columns: ClassVar[Tuple[str, ...]]
    hparams = ()
    data_hparams = ("data_path", "hub_name", "synthetic_size", "val_size", "label_noise")
    train_defaults = TrainDefaults(batch_size=128, schedule="cosine", label_smoothing=0.1)
    #: tiny offline parameters (synthetic data, 1/16-width ResNet-18): for tests over the registry
    smoke_params: ClassVar[Dict[str, Any]] = {
        "data_path": "synthetic",
        "synthetic_size": 40,
        "model": "resnet18",
        "width_mult": 1 / 16,
    }

    @classmethod
    def _hparams(cls, hub: str) -> Tuple[HParam, ...]:
        return (
            HParam("model", "resnet18", str, choices=CIFAR_MODELS, doc="network (flatlab.workloads.cifar_nets)"),
            HParam(
                "width_mult",
                1.0,
                float,
                low=0.0,
                low_open=True,
                doc="channel / embedding width multiplier (1 = paper size)",
            ),
            HParam("data_path", None, str, nullable=True, doc="None: hub; a save_to_disk folder; or 'synthetic'"),
            HParam("hub_name", hub, str, doc="Hugging Face dataset used when data_path is None"),
            HParam(
                "synthetic_size",
                512,
                int,
                low=8,
                doc="data_path='synthetic': training images (val, test: a quarter each)",
            ),
            HParam(
                "val_size", 5000, int, low=0, doc="training images held out for validation (stratified; 0: val = test)"
            ),
            HParam(
                "label_noise",
                0.0,
                float,
                low=0.0,
                high=1.0,
                high_open=True,
                doc="share of training labels replaced by another class (TSAM: 0.2)",
            ),
            HParam("augment", "crop_flip", str, choices=AUGMENTATIONS, doc="training augmentation"),
        )

    def load_data(self, seed: int) -> Data:
        p = self.params
        return load_labelled_images(
            self.name,
            p,
            self.num_classes,
            seed,
            image_columns=("img", "image"),
            label_columns=self.label_columns,
            label_noise=p["label_noise"],
        )

    def build_model(self) -> nn.Module:
        return ImageClassifier(
            build_cifar_net(self.params["model"], self.num_classes, self.params["width_mult"]), CIFAR_MEAN, CIFAR_STD
        )

    @property
    def augments_on_device(self) -> bool:  # type: ignore[override]
        """Crop + flip are tensor ops (run on the accelerator); AutoAugment (torchvision, per image) stays on
        the host."""
        return self.params["augment"] != "autoaugment"

    def augment(self, inputs: Inputs, generator: torch.Generator) -> Inputs:
        return augment_images(inputs, generator, self.params["augment"], pad=4, policy="cifar10")  # type: ignore[arg-type]


@register_workload
class Cifar10(_Cifar):
    """CIFAR-10: 50,000 training and 10,000 test 32x32 images, 10 classes (IRE Fig. 2, Table 1)."""

    name = "cifar10"
    doc = "CIFAR-10, 32x32, 10 classes (HF uoft-cs/cifar10, local save_to_disk folder, or synthetic)"
    num_classes = 10
    default_hub = "uoft-cs/cifar10"
    label_columns = ("label",)
    hparams = _Cifar._hparams("uoft-cs/cifar10")


@register_workload
class Cifar100(_Cifar):
    """CIFAR-100 (fine labels): 50,000 / 10,000 32x32 images, 100 classes; ``label_noise`` for the
    noisy-label setting (IRE Tables 1, 3; TSAM Table 1)."""

    name = "cifar100"
    doc = "CIFAR-100 fine labels, 32x32, 100 classes, optional uniform label noise (HF uoft-cs/cifar100 or local)"
    num_classes = 100
    default_hub = "uoft-cs/cifar100"
    label_columns = ("fine_label", "label")
    hparams = _Cifar._hparams("uoft-cs/cifar100")


def load_labelled_images(
    name: str,
    p: Dict[str, Any],
    num_classes: int,
    seed: int,
    *,
    image_columns: Tuple[str, ...],
    label_columns: Tuple[str, ...],
    label_noise: float = 0.0,
    size: Optional[int] = None,
) -> Data:
    """Train/val/test splits of an image-classification dataset as uint8 ``(N, 3, H, W)`` tensors.

    ``p`` holds the workload's ``data_path`` (None: the hub dataset ``hub_name``; a ``save_to_disk``
    folder; or ``"synthetic"``, ``synthetic_size`` images in the same schema) and ``val_size`` (training
    images held out, stratified by ``split_and_noise``; 0 = validate on the test split). ``size`` resizes
    images (None keeps them). Label noise, when asked for, touches the training split only.

    Raises:
        ValueError: labels outside ``[0, num_classes)``, or ``val_size=0`` without a test split.
    """
    if is_synthetic(p["data_path"]):
        n, q = p["synthetic_size"], p["synthetic_size"] // 4
        val_size = q if p["val_size"] else 0
        x, y = synthetic_images(n + val_size + q, num_classes, size or 32, seed=0)
        x_te, y_te = x[n + val_size :], y[n + val_size :]
        x, y = x[: n + val_size], y[: n + val_size]
        source = "synthetic"
    else:
        dsets = load_hf(name, p["hub_name"], None, p["data_path"])
        train_ds = require_split(dsets, ("train",), name, p["data_path"])
        test_ds = get_split(dsets, ("test",))
        img = require_columns(train_ds, image_columns, "image", name)
        lab = require_columns(train_ds, label_columns, "label", name)
        kw = {} if size is None else {"size": size, "chunk": 256}
        x = image_column_to_uint8(train_ds, img, **kw)
        y = np.asarray(list(train_ds[lab]), dtype=np.int64)
        x_te = y_te = None
        if test_ds is not None:
            x_te = image_column_to_uint8(test_ds, img, **kw)
            y_te = np.asarray(list(test_ds[lab]), dtype=np.int64)
        val_size = min(p["val_size"], len(y) // 2)
        source = p["data_path"] or p["hub_name"]
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(
            f"workload {name!r}: labels must lie in [0, {num_classes}), got [{y.min()}, {y.max()}] from {source}"
        )
    if val_size == 0 and x_te is None:
        raise ValueError(f"workload {name!r}: val_size=0 needs a test split to validate on; the data has none")
    train, val, meta = split_and_noise(x, y, val_size, label_noise, num_classes, seed)
    test = Split(torch.from_numpy(x_te), torch.from_numpy(y_te)) if x_te is not None else None
    if val_size == 0:
        val = test  # type: ignore[assignment]
    meta.update(source=source, split_seed=seed, num_classes=num_classes)
    return Data(train=train, val=val, test=test, meta=meta)
