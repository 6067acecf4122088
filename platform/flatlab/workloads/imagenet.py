"""``imagenet``: ImageNet-1k classification (Russakovsky et al. 2015) with torchvision's ResNet-50 (IRE
paper, Table 2) or timm's ViT-S/16 (IRE paper, Table 4), images streamed from disk.

Sources (``data_path``): ``None`` (default) the gated hub dataset ``hub_name`` (``ILSVRC/imagenet-1k``);
a folder holding ``train/`` and ``val/`` in torchvision's ImageFolder layout, or a ``save_to_disk``
folder of the hub dataset; or ``"synthetic"`` (generated images streamed through the same readers and
transforms, for tests and the ``smoke`` scale).

Nothing is held in memory but the file list and labels: every split is a
:class:`~flatlab.workloads.lazy_images.LazyImages` whose rows are decoded (on a thread pool, the next
mini-batch while the current one trains) when indexed; the files must be on a filesystem every node sees.

Splits: ``val`` = ``val_size`` training images held out (stratified, fixed by the study seed) for model
selection; ``test`` = the official validation set (50,000 images; the split the papers report),
evaluated once at the end. ``val_size = 0`` validates on the official validation set.

Preprocessing (torchvision's reference recipe, mean/std normalisation inside the model): evaluation
resizes the shorter side to ``resize_size`` (256) and centre-crops ``crop_size`` (224); training
(``augment='standard'``) takes a RandomResizedCrop (area in [0.08, 1], aspect ratio in [3/4, 4/3]) and
a flip with probability 1/2 from the STORED image (shorter side resized to ``resize_size``,
centre-cropped to a square). How that differs from cropping the original, and what the flatness
measures see on each split: ``docs/workloads.md`` (ImageNet). ``augment='randaug'`` adds RandAugment
(Cubuk et al. 2020; :func:`flatlab.workloads.clip_augment.rand_augment`, ``randaug_ops`` operations at
magnitude ``randaug_magnitude``) after the crop and flip; ``mixup_alpha > 0`` adds Mixup
(:mod:`flatlab.workloads.mixup`, soft targets). Both touch training mini-batches only: evaluation
always sees the centre crop.

Models (``model``): torchvision's ``resnet50`` / ``resnet18``; timm's ``vit_small_patch16_224`` (ViT-S/16:
patch 16, width 384, depth 12, 6 heads, class token; 22 M parameters at 1000 classes) and ``test_vit``
(timm's tiny test ViT, width 64, for tests and the smoke scale), both built with
``timm.create_model(model, pretrained=False, num_classes=num_classes, img_size=crop_size)``: random
initialisation, nothing is downloaded.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional

import numpy as np
import torch
from PIL import Image
from torch import nn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.lazy import lazy
from flatlab.workloads.base import Data, Inputs, Split, TrainDefaults, Workload
from flatlab.workloads.clip_augment import rand_augment
from flatlab.workloads.clip_data import ImageReader, Source, label_indices, pixel_transform, select_items
from flatlab.workloads.images import IMAGENET_MEAN, IMAGENET_STD, ImageClassifier, holdout_split, synthetic_images
from flatlab.workloads.lazy_images import LazyImages
from flatlab.workloads.mixup import mixup
from flatlab.workloads.registry import register_workload
from flatlab.workloads.sources import DataUnavailable, is_synthetic

timm = lazy("timm", extra="vision")
# torchvision loads in seconds
torchvision = lazy("torchvision")
tv_transforms = lazy("torchvision.transforms")
v2_functional = lazy("torchvision.transforms.v2.functional")

TORCHVISION_MODELS = ("resnet50", "resnet18")
TIMM_MODELS = ("vit_small_patch16_224", "test_vit")  # timm names (the vision extra)
MODELS = TORCHVISION_MODELS + TIMM_MODELS
AUGMENT = ("standard", "randaug", "none")
SCALE = (0.08, 1.0)  # RandomResizedCrop's area fraction range (torchvision's default)
RATIO = (3 / 4, 4 / 3)  # and its aspect-ratio range (width / height)


# ---- preprocessing ---------------------------------------------------------------------------------
def pixel_steps(resize: int, crop: int):
    """PIL -> uint8 ``(3, crop, crop)``: RGB, shorter side resized to ``resize`` (bilinear, antialiased),
    centre crop ``crop`` (torchvision's evaluation transform without normalisation)."""
    return pixel_transform(tv_transforms.Compose([tv_transforms.Resize(resize), tv_transforms.CenterCrop(crop)]))


def resized_crop_params(
    n: int, height: int, width: int, generator: torch.Generator, scale=SCALE, ratio=RATIO, attempts: int = 10
) -> torch.Tensor:
    """RandomResizedCrop's boxes for ``n`` images of ``height x width`` (torchvision's ``get_params`` rule).

    Per image: up to ``attempts`` draws of an area fraction ``a ~ U(scale)`` and a log aspect ratio
    ``log r ~ U(log ratio)``; box width ``round(sqrt(a H W r))``, height ``round(sqrt(a H W / r))``; the
    first draw that fits is placed uniformly. If none fits: the largest centred box whose aspect ratio
    is clamped to ``ratio``. Every draw comes from ``generator`` and the number of values drawn does not
    depend on the outcome (``4 * attempts * n``), so the stream stays aligned.

    Returns:
        ``(n, 4)`` int64 rows ``(top, left, box_height, box_width)``, each box inside the image.
    """
    area = height * width
    a = torch.empty(n, attempts).uniform_(scale[0], scale[1], generator=generator) * area
    logr = torch.empty(n, attempts).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=generator)
    u_top = torch.rand(n, attempts, generator=generator)
    u_left = torch.rand(n, attempts, generator=generator)
    r = torch.exp(logr)
    w = torch.round(torch.sqrt(a * r)).long()
    h = torch.round(torch.sqrt(a / r)).long()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    out = torch.empty(n, 4, dtype=torch.long)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        fw, fh = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        fh, fw = height, int(round(height * ratio[1]))
    else:
        fw, fh = width, height
    for i in range(n):
        ok = torch.nonzero(fits[i])
        if len(ok):
            k = int(ok[0])
            bh, bw = int(h[i, k]), int(w[i, k])
            top = int(u_top[i, k] * (height - bh + 1))
            left = int(u_left[i, k] * (width - bw + 1))
            out[i] = torch.tensor([min(top, height - bh), min(left, width - bw), bh, bw])
        else:
            out[i] = torch.tensor([(height - fh) // 2, (width - fw) // 2, fh, fw])
    return out


def random_resized_crop(
    x: torch.Tensor, generator: torch.Generator, size: int, flip: bool = True, scale=SCALE, ratio=RATIO
) -> torch.Tensor:
    """Inception-style RandomResizedCrop and horizontal flip of a batch (torchvision's ImageNet training
    augmentation), drawing only from ``generator``.

    Args:
        x: ``(N, 3, H, W)`` uint8 images.
        size: output side (pixels).
    Returns:
        ``(N, 3, size, size)`` uint8: each image's box (:func:`resized_crop_params`) resized bilinearly
        (antialiased) to ``size``, then mirrored with probability 1/2 (one draw per image).
    """
    n, _, height, width = x.shape
    boxes = resized_crop_params(n, height, width, generator, scale, ratio)
    out = torch.empty((n, x.shape[1], size, size), dtype=x.dtype)
    for i, (top, left, bh, bw) in enumerate(boxes.tolist()):
        out[i] = v2_functional.resized_crop(x[i], top, left, bh, bw, [size, size], antialias=True)
    if flip:
        mask = torch.rand(n, generator=generator) < 0.5
        out = torch.where(mask[:, None, None, None], out.flip(-1), out)
    return out


def center_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    """The central ``size x size`` window of ``(N, C, H, W)`` images (top/left offsets rounded down)."""
    h, w = x.shape[-2:]
    if size > h or size > w:
        raise ValueError(f"crop size {size} exceeds the image size {h}x{w}")
    top, left = (h - size) // 2, (w - size) // 2
    return x[..., top : top + size, left : left + size].contiguous()


# ---- synthetic source --------------------------------------------------------------------------------
class SyntheticReader:
    """Row ``i`` of a generated image set -> ``transform(PIL image)``; picklable (holds only the generation
    parameters and the transform; the pixels are generated again once per process, on first use)."""

    def __init__(self, n: int, num_classes: int, size: int, seed: int, transform: Any) -> None:
        self.args = (n, num_classes, size, seed)
        self.transform = transform
        self._setup()

    def _setup(self) -> None:
        self._images: Optional[np.ndarray] = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"args": self.args, "transform": self.transform}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    def labels(self) -> np.ndarray:
        """``(n,)`` int64 labels of the generated images."""
        n, c, size, seed = self.args
        return synthetic_images(n, c, size, seed)[1]

    def describe(self, item: Any) -> str:
        return f"synthetic row {int(item)}"

    def __call__(self, item: Any) -> torch.Tensor:
        with self._lock:
            if self._images is None:
                n, c, size, seed = self.args
                self._images = synthetic_images(n, c, size, seed)[0]
        return self.transform(Image.fromarray(np.ascontiguousarray(self._images[int(item)].transpose(1, 2, 0))))


# ---- the workload -----------------------------------------------------------------------------------
@register_workload
class ImageNet(Workload):
    """ImageNet-1k with ResNet-50 (torchvision, random init); see the module docstring. Metric
    ``val/accuracy`` (top-1, max); ``test/accuracy`` is the official validation set."""

    name = "imagenet"
    doc = "ImageNet-1k, ResNet-50 (torchvision), streamed from disk (HF ILSVRC/imagenet-1k, ImageFolder, or synthetic)"
    data_hparams = (
        "data_path",
        "hub_name",
        "val_size",
        "num_classes",
        "synthetic_size",
        "synthetic_image_size",
        "crop_size",
        "resize_size",
        "workers",
    )
    hparams = (
        HParam(
            "model",
            "resnet50",
            str,
            choices=MODELS,
            doc="network, random init: torchvision resnet50 (IRE Table 2) / resnet18, or timm "
            "vit_small_patch16_224 (ViT-S/16, IRE Table 4) / test_vit",
        ),
        HParam(
            "num_classes", 1000, int, low=2, doc="classes (ImageNet-1k: 1000; synthetic data: how many to generate)"
        ),
        HParam(
            "data_path",
            None,
            str,
            nullable=True,
            doc="None: hub; a folder with train/ and val/ ImageFolders, or a save_to_disk folder; or 'synthetic'",
        ),
        HParam("hub_name", "ILSVRC/imagenet-1k", str, doc="Hugging Face dataset used when data_path is None (gated)"),
        HParam(
            "val_size",
            10000,
            int,
            low=0,
            doc="training images held out for validation (stratified; 0: val = official validation set)",
        ),
        HParam(
            "crop_size", 224, int, low=8, doc="network input side, pixels (training crop and evaluation centre crop)"
        ),
        HParam(
            "resize_size",
            256,
            int,
            low=8,
            doc="shorter side before the centre crop, pixels (also the stored training image side)",
        ),
        HParam(
            "augment",
            "standard",
            str,
            choices=AUGMENT,
            doc="standard: RandomResizedCrop + horizontal flip; randaug: standard, then RandAugment; none: centre crop",
        ),
        HParam("randaug_ops", 2, int, low=0, high=10, doc="augment='randaug': operations per image (Cubuk et al.: 2)"),
        HParam(
            "randaug_magnitude", 9, int, low=0, high=30, doc="augment='randaug': magnitude of every operation, of 30"
        ),
        HParam("mixup_alpha", 0.0, float, low=0.0, doc="Mixup's Beta(alpha, alpha) (0: no Mixup)"),
        HParam("synthetic_size", 64, int, low=8, doc="data_path='synthetic': training images (test: a quarter)"),
        HParam(
            "synthetic_image_size", 40, int, low=8, doc="data_path='synthetic': side of the generated images, pixels"
        ),
        HParam("workers", 0, int, low=0, doc="decoding threads per process (0: min(8, the trial's CPUs))"),
    )
    # IRE Table 2 (as far as the paper states it) with the usual ResNet-50 recipe for the rest (see the study).
    train_defaults = TrainDefaults(batch_size=256, schedule="cosine", warmup_epochs=0.0, label_smoothing=0.0)
    smoke_params: ClassVar[Dict[str, Any]] = {
        "data_path": "synthetic",
        "model": "resnet18",
        "num_classes": 4,
        "synthetic_size": 16,
        "val_size": 4,
        "crop_size": 32,
        "resize_size": 36,
        "synthetic_image_size": 40,
    }

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        if p["crop_size"] > p["resize_size"]:
            raise ConfigError(
                f"workload 'imagenet': crop_size={p['crop_size']} must not exceed resize_size={p['resize_size']} "
                f"(the crop is taken from the resized image; ImageNet: 224 from 256)"
            )
        if p["model"] in TIMM_MODELS and p["crop_size"] % 16:
            raise ConfigError(
                f"workload 'imagenet': model={p['model']!r} cuts 16 x 16 patches; crop_size={p['crop_size']} must be "
                f"a multiple of 16 (ViT-S/16: 224)"
            )

    # ---- data -------------------------------------------------------------------------------------
    def _readers(self):
        p = self.params
        return pixel_steps(p["resize_size"], p["resize_size"]), pixel_steps(p["resize_size"], p["crop_size"])

    def load_data(self, seed: int) -> Data:
        """Lazy train / val / test splits (module docstring); only the file list and labels are read here.

        Raises:
            DataUnavailable: the data cannot be found or read (message says how to provide it offline).
            ConfigError: labels outside ``[0, num_classes)``; validation classes missing from training.
        """
        p = self.params
        store_t, eval_t = self._readers()
        if is_synthetic(p["data_path"]):
            q = max(1, p["synthetic_size"] // 4)  # test images, and held-out validation images if val_size > 0
            val_size = min(p["val_size"], q)
            n = p["synthetic_size"] + val_size  # the training pool the hold-out comes from
            gen = (n + q, p["num_classes"], p["synthetic_image_size"], 0)
            labels = SyntheticReader(*gen, store_t).labels()
            train_src = (SyntheticReader(*gen, store_t), SyntheticReader(*gen, eval_t), np.arange(n), labels[:n])
            test_src = (SyntheticReader(*gen, eval_t), np.arange(n, n + q), labels[n:])
            source = "synthetic"
        else:
            train_src, test_src, source = self._real_sources(store_t, eval_t)
            val_size = min(p["val_size"], len(train_src[3]) // 2)
        store_r, eval_r, items, y = train_src
        y = np.asarray(y, dtype=np.int64)
        for name, lab in (("train", y), ("test", np.asarray(test_src[2]))):
            if lab.size and (lab.min() < 0 or lab.max() >= p["num_classes"]):
                raise ConfigError(
                    f"workload 'imagenet': {name} labels must lie in [0, num_classes={p['num_classes']}), got "
                    f"[{lab.min()}, {lab.max()}] from {source}; set num_classes"
                )
        tr, va = holdout_split(y, val_size, seed)
        w = p["workers"]
        train = Split(LazyImages(items[tr], store_r, workers=w), torch.from_numpy(y[tr]))
        test = Split(
            LazyImages(test_src[1], test_src[0], workers=w), torch.as_tensor(np.asarray(test_src[2]), dtype=torch.int64)
        )
        val = Split(LazyImages(items[va], eval_r, workers=w), torch.from_numpy(y[va])) if val_size else test
        meta = {"source": source, "split_seed": seed, "num_classes": p["num_classes"], "val_size": val_size}
        return Data(train=train, val=val, test=test, meta=meta)

    def _real_sources(self, store_t: Any, eval_t: Any):
        """``((store_reader, eval_reader, items, labels), (eval_reader, items, labels), description)``."""
        p = self.params
        path = p["data_path"]
        if path is None:
            train_s, test_s = Source("hf", p["hub_name"], "train"), Source("hf", p["hub_name"], "validation")
        else:
            root = Path(os.path.abspath(os.path.expanduser(path)))
            if (root / "train").is_dir() and (root / "val").is_dir() and not (root / "dataset_dict.json").exists():
                train_s, test_s = Source("folder", str(root / "train")), Source("folder", str(root / "val"))
            elif (root / "dataset_dict.json").exists():
                train_s, test_s = Source("hf", str(root), "train"), Source("hf", str(root), "validation")
            else:
                raise DataUnavailable(
                    f"workload 'imagenet': data_path={path!r} is neither a folder with train/ and val/ image folders "
                    f"(<split>/<class>/<image>) nor a save_to_disk folder (dataset_dict.json); "
                    f"or use data_path='synthetic' for generated data"
                )
        try:
            store_r, items, y, names = select_items(train_s, store_t)
            test_r, test_items, y_te, test_names = select_items(test_s, eval_t)
        except ConfigError as exc:
            raise DataUnavailable(
                f"workload 'imagenet': {exc}. Offline: a folder with train/ and val/ ImageFolders, a save_to_disk "
                f"copy of {p['hub_name']!r} (data_path=DIR), or a filled HF cache with HF_DATASETS_OFFLINE=1"
            ) from exc
        if test_names != names:  # match classes by name (a val folder may lack classes)
            y_te = label_indices(test_names, names, "workload 'imagenet': validation classes")[y_te]
        eval_r = ImageReader(train_s, eval_t)
        return (store_r, eval_r, items, y.numpy()), (test_r, test_items, y_te.numpy()), str(train_s)

    # ---- model, augmentation ---------------------------------------------------------------------
    def build_model(self) -> nn.Module:
        """``ImageClassifier(torchvision.models.<model>(weights=None, num_classes))``: uint8 ``(N, 3, S, S)``
        -> ``(N, num_classes)`` logits, ImageNet mean/std normalisation in front."""
        p = self.params
        if p["model"] in TIMM_MODELS:
            net = timm.create_model(p["model"], pretrained=False, num_classes=p["num_classes"], img_size=p["crop_size"])
        else:
            net = getattr(torchvision.models, p["model"])(weights=None, num_classes=p["num_classes"])
        return ImageClassifier(net, IMAGENET_MEAN, IMAGENET_STD)

    def augment(self, inputs: Inputs, generator: torch.Generator) -> Inputs:
        """``(N, 3, R, R)`` stored uint8 training images -> ``(N, 3, crop_size, crop_size)`` (module docstring)."""
        p = self.params
        if p["augment"] == "none":
            return center_crop(inputs, p["crop_size"])  # type: ignore[arg-type]
        out = random_resized_crop(inputs, generator, p["crop_size"])  # type: ignore[arg-type]
        if p["augment"] == "randaug":
            out = rand_augment(out, generator, n_ops=p["randaug_ops"], magnitude=p["randaug_magnitude"])
        return out

    def mix(self, inputs: Inputs, targets: torch.Tensor, generator: torch.Generator):
        """Mixup of a training mini-batch when ``mixup_alpha > 0`` (:func:`flatlab.workloads.mixup.mixup`):
        ``(B, 3, S, S)`` float in [0, 1] and ``(B, num_classes)`` soft targets; else ``(inputs, targets)``."""
        alpha = self.params["mixup_alpha"]
        if alpha == 0:
            return inputs, targets
        return mixup(inputs, targets, generator, alpha, self.params["num_classes"])  # type: ignore[arg-type]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: Split, batch_size: int = 256) -> Dict[str, float]:
        """As :meth:`Workload.evaluate`, 256 images per batch (ResNet-50 at 224 px)."""
        return super().evaluate(model, split, batch_size)


__all__: List[str] = [
    "ImageNet",
    "SyntheticReader",
    "center_crop",
    "pixel_steps",
    "random_resized_crop",
    "resized_crop_params",
]
