"""``clip_finetune``: robust fine-tuning of CLIP (WiSE-FT; seed paper "In Search of the Successful
Interpolation"), and what the CLIP workloads share (:class:`ClipWorkload`: the zero-shot model, the ID/OOD
evaluation sets, evaluation).

``clip_finetune`` fine-tunes an open_clip image tower end to end, starting from the zero-shot classifier
(head from class names x prompt templates with open_clip's ``build_zero_shot_classifier``; logits =
``logit_scale.exp() * normalised image features @ head``). Recipe: any registered optimizer (the seed
paper and WiSE-FT use AdamW), the trainer's cosine schedule with warm-up, optional label smoothing, and
the augmentation ``augment`` = ``none`` | ``flip-crop`` | ``randaug`` (:mod:`~flatlab.workloads.clip_augment`).
Evaluation every epoch on the ID set (``val/*``) and one or more OOD sets (``ood/*``, ``ood_<name>/*``);
ImageNet-A/R-style OOD sets are scored on their subset of the logits (``ood_classes``).

The alpha search over a fine-tuned model (``clip_interpolate``, evaluation only) is an interpolation
experiment and lives with the interpolation code: :mod:`flatlab.interpolation.workload`.

Models and data: :mod:`~flatlab.workloads.clip_model`, :mod:`~flatlab.workloads.clip_data` (defaults: a
tiny random-weight ViT and generated images, offline). Training images are held in memory as uint8, or
streamed from disk with ``train_in_memory=False`` (:class:`~flatlab.workloads.lazy_images.LazyImages`).
The procedures: ``docs/algorithms/rft.md``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.lazy import lazy
from flatlab.workloads.base import Data, Inputs, Split, TrainDefaults, Workload, take, to_device
from flatlab.workloads.clip_augment import AUGMENTATIONS, augment_batch
from flatlab.workloads.clip_data import (
    into_label_space,
    label_indices,
    label_names,
    lazy_images,
    load_images,
    parse_index_list,
    parse_ood_sources,
    parse_source,
    pixel_transform,
)
from flatlab.workloads.clip_model import (
    TEMPLATE_SETS,
    TINY_MODEL,
    ClipSpec,
    build_zero_shot_classifier,
    classnames_from_labels,
    load_clip,
)
from flatlab.workloads.registry import register_workload

open_clip = lazy("open_clip", extra="clip")

MODEL_HPARAMS = (
    HParam(
        "model_name", TINY_MODEL, str, doc="open_clip architecture (e.g. ViT-B-32); default: a tiny offline test config"
    ),
    HParam(
        "pretrained",
        "",
        str,
        doc="open_clip tag (internet, or HF cache + HF_HUB_OFFLINE=1), checkpoint path, or '' = random weights",
    ),
    HParam("quick_gelu", False, bool, doc="quick-GELU activations: True for OpenAI's CLIP weights"),
    HParam("init_seed", 0, int, low=0, doc="seed of the random weights when pretrained=''"),
    HParam("model_config", "", str, doc="path of an open_clip JSON architecture config, registered as model_name"),
    HParam(
        "classnames",
        "labels",
        str,
        doc="prompt names: 'labels' (ID label names), 'imagenet' (open_clip's 1,000) or 'a,b,c'",
    ),
    HParam(
        "templates",
        "openai",
        str,
        choices=TEMPLATE_SETS,
        doc="prompt templates: open_clip's 80 OpenAI ImageNet ones or its 7 simple ones",
    ),
)
EVAL_HPARAMS = (
    HParam(
        "id_data",
        "synthetic:val",
        str,
        doc="ID evaluation images (val/*); folder path, hf:<name>[@split] or synthetic:<variant>",
    ),
    HParam("id_per_class", 0, int, low=0, doc="ID images kept per class, a seeded random choice (0 = all)"),
    HParam(
        "ood_data",
        "synthetic:ood",
        str,
        doc="OOD images: 'source' or 'src1;name=src2' (first -> ood/*, others -> ood_<name>/*); '' = none",
    ),
    HParam(
        "ood_classes",
        "auto",
        str,
        doc="logit columns of the first OOD set's labels: 'auto' (by label name) or 'i,j,...'",
    ),
    HParam("eval_batch_size", 256, int, low=1, doc="evaluation batch size (images)"),
    HParam(
        "load_workers",
        0,
        int,
        low=0,
        doc="image decoding threads when loading, and in each trial when streaming "
        "(0 = min(8, the process's CPU share: a trial's CPUs))",
    ),
)
ZERO_SHOT_KEYS = ["model_name", "pretrained", "quick_gelu", "init_seed", "model_config", "classnames", "templates"]
EVAL_METRICS = ("ood/loss", "ood/accuracy")


class SubsetCrossEntropy:
    """Mean cross-entropy on the logit columns ``classes`` (targets index into them)."""

    def __init__(self, classes: Optional[torch.Tensor]) -> None:
        self.classes = classes

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.classes is not None:
            outputs = outputs[:, self.classes.to(outputs.device)]
        return F.cross_entropy(outputs, targets)


class ClipWorkload(Workload):
    """What the CLIP workloads share: the zero-shot model, the ID/OOD evaluation sets, evaluation
    (``clip_finetune`` here, ``clip_interpolate`` in :mod:`flatlab.interpolation.workload`)."""

    data_hparams = (
        "id_data",
        "id_per_class",
        "ood_data",
        "ood_classes",
        "train_data",
        "train_per_class",
        "train_in_memory",
    )

    def clip_spec(self) -> ClipSpec:
        return ClipSpec.from_params(self.params)

    def label_space(self) -> List[str]:
        """The classifier's classes: the ID set's label names (cheap, decodes no image)."""
        return label_names(parse_source(self.params["id_data"]))

    def prompt_names(self, labels: List[str]) -> List[str]:
        """Class names used in the prompts, one per label (``classnames`` parameter).

        Raises:
            ConfigError: a list whose length differs from the number of labels.
        """
        choice = self.params["classnames"]
        if choice == "labels":
            return classnames_from_labels(labels)
        if choice == "imagenet":
            names = list(open_clip.IMAGENET_CLASSNAMES)
        else:
            names = [n.strip() for n in choice.split(",")]
        if len(names) != len(labels):
            raise ConfigError(
                f"classnames={choice if len(choice) < 60 else choice[:57] + '...'!r} gives {len(names)} names for the "
                f"ID set's {len(labels)} labels"
            )
        return names

    def build_model(self) -> nn.Module:
        """The zero-shot classifier (:class:`~flatlab.workloads.clip_model.ClipClassifier`, CPU)."""
        labels = self.label_space()
        return build_zero_shot_classifier(self.clip_spec(), self.prompt_names(labels), self.params["templates"])

    def _transform(self):
        _, preprocess = load_clip(self.clip_spec())
        return pixel_transform(preprocess)

    def _load(self, source: str, transform, per_class: int, seed: int):
        return load_images(
            parse_source(source), transform, per_class=per_class, seed=seed, workers=self.params["load_workers"]
        )

    def _load_eval(self, seed: int, transform) -> Tuple[Split, Dict[str, Split], Dict[str, Any]]:
        """``(id split, {ood key: split}, meta)``; the ID labels define the label space."""
        p = self.params
        pix, y, space = self._load(p["id_data"], transform, p["id_per_class"], seed + 1)
        val = Split(pix, y)
        sources = parse_ood_sources(p["ood_data"]) if p["ood_data"].strip() else []
        explicit = parse_index_list(p["ood_classes"], "ood_classes")
        if explicit is not None and len(sources) > 1:
            raise ConfigError("ood_classes with explicit indices needs a single OOD set in ood_data")
        extra: Dict[str, Split] = {}
        for i, (key, src) in enumerate(sources):
            opix, oy, onames = load_images(src, transform, per_class=0, seed=seed + 2 + i, workers=p["load_workers"])
            extra[key] = into_label_space(
                opix, oy, onames, space, f"ood_data {src}", classes=explicit if i == 0 else None
            )
        meta = {"labels": space, "n_id": len(val), **{f"n_{k}": len(s) for k, s in extra.items()}}
        return val, extra, meta

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: Split, batch_size: Optional[int] = None) -> Dict[str, float]:
        """Mean cross-entropy (nats per image) and top-1 accuracy in eval mode; a split with ``classes``
        (:class:`~flatlab.workloads.clip_data.SubsetSplit`) is scored on those logit columns only."""
        bs = batch_size or self.params["eval_batch_size"]
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        classes = getattr(split, "classes", None)
        classes = classes.to(device) if classes is not None else None
        total, correct = 0.0, 0
        for start in range(0, len(split), bs):
            x = to_device(take(split.inputs, slice(start, start + bs)), device)
            y = split.targets[start : start + bs].to(device)
            out = model(x)
            if classes is not None:
                out = out[:, classes]
            total += float(F.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(dim=-1) == y).sum())
        model.train(was_training)
        n = max(1, len(split))
        return {"loss": total / n, "accuracy": correct / n}


@register_workload
class ClipFinetune(ClipWorkload):
    """End-to-end fine-tuning of an open_clip image tower + zero-shot head; metric ``val/accuracy`` (ID)
    or ``ood/accuracy``."""

    name = "clip_finetune"
    doc = "fine-tune CLIP (open_clip) from its zero-shot classifier; ID val/* and OOD ood/* evaluation"
    hparams = (
        MODEL_HPARAMS
        + (
            HParam(
                "train_data",
                "synthetic:train",
                str,
                doc="training images; folder path, hf:<name>[@split] or synthetic:train",
            ),
            HParam("train_per_class", 0, int, low=0, doc="training images kept per class (0 = all)"),
            HParam(
                "train_in_memory",
                True,
                bool,
                doc="False = decode training images on the fly from train_data (one mini-batch "
                "ahead), for datasets larger than memory; the files must be on a filesystem every node sees; "
                "eval splits stay in memory",
            ),
            HParam(
                "augment",
                "none",
                str,
                choices=AUGMENTATIONS,
                doc="training augmentation: none, flip-crop (area fraction 0.35-1), or randaug "
                "(flip-crop + RandAugment(2, 9): 2 operations per image at magnitude 9 of 30)",
            ),
        )
        + EVAL_HPARAMS
    )
    train_defaults = TrainDefaults(batch_size=64, schedule="cosine", warmup_epochs=0.1, label_smoothing=0.0)
    metrics = Workload.metrics + EVAL_METRICS

    def load_data(self, seed: int) -> Data:
        """Train, ID (``val``) and OOD splits as uint8 images; train labels mapped into the ID label space.

        With ``train_in_memory=False`` the training inputs are a
        :class:`~flatlab.workloads.lazy_images.LazyImages` over the same images in the same order
        (decoded per mini-batch, in each trial's process); the evaluation splits are tensors either way.

        Raises:
            ConfigError: unreadable sources; training or OOD labels that are not ID labels.
        """
        p = self.params
        transform = self._transform()
        val, extra, meta = self._load_eval(seed, transform)
        if p["train_in_memory"]:
            pix, y, names = self._load(p["train_data"], transform, p["train_per_class"], seed)
        else:
            pix, y, names = lazy_images(
                parse_source(p["train_data"]),
                transform,
                per_class=p["train_per_class"],
                seed=seed,
                workers=p["load_workers"],
            )
        space = meta["labels"]
        if list(names) != list(space):
            y = label_indices(names, space, f"train_data {p['train_data']}")[y]
        return Data(train=Split(pix, y), val=val, extra=extra, meta={**meta, "n_train": len(y)})

    def augment(self, inputs: Inputs, generator: torch.Generator) -> Inputs:
        """``augment`` applied to a uint8 mini-batch, drawing from ``generator`` only."""
        return augment_batch(inputs, self.params["augment"], generator)
