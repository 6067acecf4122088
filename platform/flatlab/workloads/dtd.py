"""``dtd``: fine-tuning an ImageNet-pretrained ViT on the Describable Textures Dataset (TSAM Table 1).

DTD (Cimpoi et al. 2014): 5,640 texture images, 47 classes, out of ImageNet's distribution. Sources
(``data_path``): the hub dataset ``tanganke/dtd`` (``train``/``test`` splits, columns ``image``,
``label``), a local ``save_to_disk`` folder with the same layout (images as PIL images or
``(H, W, 3)`` uint8 arrays), or ``"synthetic"``. Images are resized (shorter side) and centre-cropped
to ``image_size`` once, at load time, and held as uint8. ``val_size`` training images (stratified,
study seed) are held out for validation; ``test`` is the official test split.

Model: ``timm.create_model(model, pretrained=pretrained, num_classes=47, img_size=image_size)``
behind the model's own normalisation (``pretrained_cfg`` mean/std). ``pretrained=True`` loads the
named timm weights from the hub/cache, or from ``weights_path`` (a local ``.safetensors``/``.bin``
file) when given. Tests use ``pretrained=False`` with a small ``image_size``.

Augmentation (training): random crop after zero padding by ``image_size // 8`` + horizontal flip,
or ``none``. Default recipe: batch 64, constant LR, label smoothing 0.1 (TSAM's settings).
"""

from __future__ import annotations

from typing import Any, ClassVar, Dict

import torch
from torch import nn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.lazy import lazy
from flatlab.workloads.base import Data, Inputs, TrainDefaults, Workload
from flatlab.workloads.cifar import load_labelled_images
from flatlab.workloads.images import ImageClassifier, augment_images
from flatlab.workloads.registry import register_workload
from flatlab.workloads.sources import describe_error

timm = lazy("timm", extra="vision")

NUM_CLASSES = 47


@register_workload
class DTD(Workload):
    data_hparams = ("image_size", "data_path", "hub_name", "synthetic_size", "val_size")
    """ViT fine-tuning on DTD, 47 classes; metric ``val/accuracy`` (max). See the module docstring."""

    name = "dtd"
    doc = "Describable Textures (47 classes), fine-tuning an ImageNet-pretrained timm ViT"
    hparams = (
        HParam("model", "vit_small_patch16_224.augreg_in21k_ft_in1k", str, doc="timm model name (with pretrained tag)"),
        HParam("pretrained", True, bool, doc="load ImageNet weights (from the hub/cache, or weights_path)"),
        HParam("weights_path", None, str, nullable=True, doc="local weights file for pretrained=True (offline)"),
        HParam(
            "image_size", 224, int, low=8, doc="images are resized/cropped to this (pixels); the ViT is built for it"
        ),
        HParam("data_path", None, str, nullable=True, doc="None: hub; a save_to_disk folder; or 'synthetic'"),
        HParam("hub_name", "tanganke/dtd", str, doc="Hugging Face dataset used when data_path is None"),
        HParam(
            "synthetic_size", 188, int, low=47, doc="data_path='synthetic': training images (val, test: a quarter each)"
        ),
        HParam("val_size", 376, int, low=0, doc="training images held out for validation (stratified; 0: val = test)"),
        HParam("augment", "crop_flip", str, choices=("crop_flip", "none"), doc="training augmentation"),
    )
    train_defaults = TrainDefaults(batch_size=64, schedule="constant", label_smoothing=0.1)
    #: tiny offline parameters (synthetic 32x32 data, random-weight ViT-Ti/16): for tests over the registry
    smoke_params: ClassVar[Dict[str, Any]] = {
        "data_path": "synthetic",
        "synthetic_size": 47,
        "model": "vit_tiny_patch16_224",
        "pretrained": False,
        "image_size": 32,
    }

    def load_data(self, seed: int) -> Data:
        p = self.params
        data = load_labelled_images(
            self.name,
            p,
            NUM_CLASSES,
            seed,
            image_columns=("image", "img"),
            label_columns=("label",),
            size=p["image_size"],
        )
        data.meta["image_size"] = p["image_size"]
        return data

    def build_model(self) -> nn.Module:
        create_model = timm.create_model  # imported here: a missing timm is not a weights error below
        p = self.params
        kwargs: Dict[str, Any] = dict(num_classes=NUM_CLASSES, img_size=p["image_size"])
        if p["pretrained"] and p["weights_path"]:
            kwargs["pretrained_cfg_overlay"] = dict(file=p["weights_path"])
        try:
            net = create_model(p["model"], pretrained=p["pretrained"], **kwargs)
        except RuntimeError as exc:
            if "Unknown model" in str(exc):
                raise ConfigError(
                    f"workload 'dtd': model={p['model']!r} is not a timm model ({describe_error(exc)})"
                ) from exc
            raise
        except Exception as exc:  # noqa: BLE001 - weights not reachable: no network, no cache, bad file
            if not p["pretrained"]:
                raise
            raise ConfigError(
                f"workload 'dtd': could not load pretrained weights for model={p['model']!r} ({describe_error(exc)}). "
                "Offline: download them elsewhere (timm.create_model(name, pretrained=True) fills the HF cache) and "
                "set HF_HUB_OFFLINE=1, or pass weights_path=<file>; or pretrained=False for random weights."
            ) from exc
        cfg = getattr(net, "pretrained_cfg", {}) or {}
        mean = cfg.get("mean", (0.485, 0.456, 0.406))
        std = cfg.get("std", (0.229, 0.224, 0.225))
        return ImageClassifier(net, mean, std)

    augments_on_device = True  # crop + flip: tensor ops, run on the accelerator when the images are in memory

    def augment(self, inputs: Inputs, generator: torch.Generator) -> Inputs:
        return augment_images(inputs, generator, self.params["augment"], pad=max(1, self.params["image_size"] // 8))  # type: ignore[arg-type]
