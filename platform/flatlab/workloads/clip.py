"""``clip_finetune`` and ``clip_interpolate``: robust fine-tuning of CLIP and its alpha search (WiSE-FT;
seed paper "In Search of the Successful Interpolation").

``clip_finetune`` fine-tunes an open_clip image tower end to end, starting from the zero-shot classifier
(head from class names x prompt templates with open_clip's ``build_zero_shot_classifier``; logits =
``logit_scale.exp() * normalised image features @ head``). Recipe: any registered optimizer (the seed
paper and WiSE-FT use AdamW), the trainer's cosine schedule with warm-up, optional label smoothing, and
the augmentation ``augment`` = ``none`` | ``flip-crop`` | ``randaug`` (:mod:`~flatlab.workloads.clip_augment`).
Evaluation every epoch on the ID set (``val/*``) and one or more OOD sets (``ood/*``, ``ood_<name>/*``);
ImageNet-A/R-style OOD sets are scored on their subset of the logits (``ood_classes``).

``clip_interpolate`` trains nothing (``trains = False``; its trial calls :meth:`evaluate_only` once,
:func:`flatlab.train.evaluation.evaluate_trial`): it loads a fine-tuned checkpoint file (``finetuned``; in a
study also an earlier study's trial, ``mlflow:<study>/<arm>?param=value&...`` resolved at launch or
``run:<run_id>``, which the platform fetches from MLflow before the workload is built:
:mod:`flatlab.tracking.checkpoints`), interpolates with the zero-shot model at
``alpha`` (weight on the FINE-TUNED model, WiSE-FT's convention; the seed paper's alpha is our
``1 - alpha``), and reports ID/OOD loss and accuracy, optionally adaptive average sharpness (App. A;
general and per layer) on a fixed OOD subset, and optionally after straggler pruning (Algorithm 1).
``alpha`` is then an ordinary search dimension, e.g. ``sp.grid(alpha_grid(0.05))`` with the grid searcher.

Models and data: :mod:`~flatlab.workloads.clip_model`, :mod:`~flatlab.workloads.clip_data` (defaults: a
tiny random-weight ViT and generated images, offline). Training images are held in memory as uint8, or
streamed from disk with ``train_in_memory=False`` (:class:`~flatlab.workloads.lazy_images.LazyImages`).
The procedures: ``docs/algorithms/rft.md``.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam, resolve
from flatlab.interpolation import check_compatible, find_stragglers, interpolate, prune_stragglers
from flatlab.sharpness import compute_measures, group_parameters, layerwise_sharpness, measure_subset
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
    load_state_file,
)
from flatlab.workloads.registry import register_workload

_MODEL_HPARAMS = (
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
_EVAL_HPARAMS = (
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
_ZERO_SHOT_KEYS = ["model_name", "pretrained", "quick_gelu", "init_seed", "model_config", "classnames", "templates"]
_EVAL_METRICS = ("ood/loss", "ood/accuracy")


class _SubsetCrossEntropy:
    """Mean cross-entropy on the logit columns ``classes`` (targets index into them)."""

    def __init__(self, classes: Optional[torch.Tensor]) -> None:
        self.classes = classes

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.classes is not None:
            outputs = outputs[:, self.classes.to(outputs.device)]
        return F.cross_entropy(outputs, targets)


class _ClipWorkload(Workload):
    data_hparams = (
        "id_data",
        "id_per_class",
        "ood_data",
        "ood_classes",
        "train_data",
        "train_per_class",
        "train_in_memory",
    )
    """What both CLIP workloads share: the zero-shot model, the ID/OOD evaluation sets, evaluation."""

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
            from open_clip import IMAGENET_CLASSNAMES  # deferred: heavy, and optional (the clip extra)

            names = list(IMAGENET_CLASSNAMES)
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
class ClipFinetune(_ClipWorkload):
    """End-to-end fine-tuning of an open_clip image tower + zero-shot head; metric ``val/accuracy`` (ID)
    or ``ood/accuracy``."""

    name = "clip_finetune"
    doc = "fine-tune CLIP (open_clip) from its zero-shot classifier; ID val/* and OOD ood/* evaluation"
    hparams = (
        _MODEL_HPARAMS
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
        + _EVAL_HPARAMS
    )
    train_defaults = TrainDefaults(batch_size=64, schedule="cosine", warmup_epochs=0.1, label_smoothing=0.0)
    metrics = Workload.metrics + _EVAL_METRICS

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


_STRAGGLERS: "OrderedDict[Tuple, Tuple[List[str], Dict[str, float]]]" = OrderedDict()
_STRAGGLER_LOCK = threading.Lock()


@register_workload
class ClipInterpolate(_ClipWorkload):
    """Evaluate ``theta_alpha = (1 - alpha) theta_zs + alpha theta_ft`` (WiSE-FT); no training."""

    name = "clip_interpolate"
    doc = "WiSE-FT interpolation of a fine-tuned CLIP with its zero-shot model at alpha (no training)"
    trains = False
    checkpoint_params = ("finetuned",)
    hparams = (
        _MODEL_HPARAMS
        + _EVAL_HPARAMS
        + (
            HParam(
                "finetuned",
                "",
                str,
                doc="fine-tuned checkpoint: a file; in a study also mlflow:<study>/<arm>?param=value&... "
                "(resolved at launch) or run:<run_id>",
            ),
            HParam(
                "alpha",
                0.5,
                float,
                low=0.0,
                high=1.0,
                doc="weight on the fine-tuned model (WiSE-FT; the seed paper's 1 - alpha)",
            ),
            HParam(
                "prune",
                False,
                bool,
                doc="zero a random half of each straggler layer of the fine-tuned model first (seed Algorithm 1)",
            ),
            HParam(
                "straggler_draws",
                5,
                int,
                low=1,
                doc="draws of the layer-wise sharpness that finds stragglers (seed: 5)",
            ),
            HParam(
                "straggler_threshold",
                1e-3,
                float,
                doc="straggler: layer-wise sharpness of the fine-tuned model below this (nats)",
            ),
            HParam(
                "sharpness_draws",
                0,
                int,
                low=0,
                doc="adaptive average sharpness draws on the OOD subset (0 = off; seed: 20)",
            ),
            HParam(
                "sharpness_rho",
                1.0,
                float,
                low=0.0,
                low_open=True,
                doc="sharpness noise scale rho, relative to |w| (seed: 1.0)",
            ),
            HParam("sharpness_layerwise", True, bool, doc="also per layer (clip grouping), as sharpness/layer/<group>"),
            HParam(
                "sharpness_examples",
                1000,
                int,
                low=0,
                doc="size m of the fixed OOD subset for sharpness and stragglers (0 = all)",
            ),
            HParam(
                "sharpness_seed",
                0,
                int,
                low=0,
                doc="seed of the subset choice and of the noise (the same for every alpha)",
            ),
        )
    )
    metrics = (
        Workload.metrics
        + _EVAL_METRICS
        + (
            "interp/alpha",
            "sharpness/general",
            "sharpness/general_stderr",
            "sharpness/clean_loss",
            "prune/n_stragglers",
        )
    )

    def load_data(self, seed: int) -> Data:
        """ID (``val``, also passed as ``train``, which is never iterated) and OOD splits.

        Raises:
            ConfigError: unreadable sources; OOD labels that are not ID labels.
        """
        val, extra, meta = self._load_eval(seed, self._transform())
        return Data(train=val, val=val, extra=extra, meta=meta)

    # ---- the trial ----------------------------------------------------------------------------
    def evaluate_only(self, model: nn.Module, data: Data) -> Dict[str, float]:
        """One trial: read ``finetuned``, optionally prune stragglers, load ``theta_alpha`` into
        ``model`` (which holds the zero-shot weights, from :meth:`build_model`), evaluate every split and,
        with ``sharpness_draws > 0``, measure adaptive average sharpness.

        Returns:
            ``interp/alpha``; ``val/loss``, ``val/accuracy`` (ID), ``ood/loss``, ``ood/accuracy`` (and other OOD
            sets); with sharpness: ``sharpness/general`` (nats), ``sharpness/general_stderr``,
            ``sharpness/clean_loss`` and ``sharpness/layer/<group>``; with ``prune``:
            ``prune/n_stragglers``, ``prune/straggler/<group>`` = 1 and
            ``prune/layer_sharpness/<group>`` (the fine-tuned model's, that found them).

        Raises:
            ConfigError: an empty ``finetuned`` or one that is not a file; a checkpoint fine-tuned from
                another zero-shot model (architecture, weights, classes or templates differ; known when
                the file comes with its trial's record, :func:`producing_trial`) or whose keys or
                shapes differ.
        """
        p = self.params
        path = self._checkpoint_file()
        self._check_same_zero_shot(producing_trial(path))
        zs = {k: v.detach().clone() for k, v in model.state_dict().items()}
        ft = load_state_file(path)
        check_compatible(zs, ft)
        metrics: Dict[str, float] = {"interp/alpha": p["alpha"]}
        needs_subset = p["prune"] or p["sharpness_draws"] > 0
        subset = loss_fn = None
        if needs_subset:
            if "ood" not in data.extra:
                raise ConfigError("sharpness and straggler pruning run on the OOD set; set ood_data")
            subset, loss_fn = self._sharpness_subset(data.extra["ood"], next(model.parameters()).device)
        if p["prune"]:
            groups = group_parameters(model, "clip")
            stragglers, layer_values = self._stragglers(model, ft, subset, loss_fn, groups, path)
            # seed 0: the same random half of each straggler layer at every alpha
            ft = prune_stragglers(ft, [k for g in stragglers for k in groups[g]], seed=0)
            metrics["prune/n_stragglers"] = float(len(stragglers))
            metrics.update({f"prune/straggler/{g}": 1.0 for g in stragglers})
            metrics.update({f"prune/layer_sharpness/{g}": v for g, v in layer_values.items()})
        model.load_state_dict(interpolate(zs, ft, p["alpha"]))
        for prefix, split in data.eval_splits().items():
            for k, v in self.evaluate(model, split).items():
                metrics[f"{prefix}/{k}"] = v
        if p["sharpness_draws"] > 0:
            metrics.update(self._sharpness(model, subset, loss_fn))
        return metrics

    def _checkpoint_file(self) -> Path:
        """``finetuned`` as an existing file.

        Raises:
            ConfigError: ``finetuned`` is empty or not a file (an MLflow reference reaches the workload
                only as the file the platform fetched).
        """
        ref = self.params["finetuned"]
        if not ref.strip():
            raise ConfigError(
                "finetuned is empty; give a checkpoint file, or in a study run:<run_id> or "
                "mlflow:<study>/<arm>[?param=value&...] (resolved at launch)"
            )
        path = Path(ref).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"finetuned={ref!r} is not a file (run: and mlflow: references are fetched by the platform before "
                f"a study's trial builds this workload: flatlab.tracking.checkpoints)"
            )
        return path

    def _check_same_zero_shot(self, trial: Dict[str, Any]) -> None:
        spec = trial.get("spec") or {}
        if spec.get("workload") != ClipFinetune.name:
            return  # a plain file or a foreign run: only keys and shapes are checked
        theirs = resolve(ClipFinetune.hparams, spec.get("workload_params", {}), "fine-tuned trial", allow_extra=True)
        diff = [
            f"{k}: fine-tuned={theirs.get(k)!r}, here={self.params.get(k)!r}"
            for k in _ZERO_SHOT_KEYS
            if theirs.get(k) != self.params.get(k)
        ]
        if diff:
            raise ConfigError(
                "the fine-tuned checkpoint started from another zero-shot model; interpolating would mix unrelated "
                "weights: " + "; ".join(diff)
            )

    def _sharpness_subset(self, split: Split, device: torch.device):
        """The fixed OOD subset (seed paper App. A): ``m`` examples chosen with ``sharpness_seed``, in
        batches of ``eval_batch_size``, on ``device``; and the loss on the split's logit columns."""
        p = self.params
        subset = measure_subset(split, p["sharpness_examples"], p["sharpness_seed"], p["eval_batch_size"], device)
        return subset, _SubsetCrossEntropy(getattr(split, "classes", None))

    def _stragglers(self, model, ft, subset, loss_fn, groups, path: Path) -> Tuple[List[str], Dict[str, float]]:
        """Straggler groups of the fine-tuned model: layer-wise adaptive average sharpness with
        ``straggler_draws`` draws below ``straggler_threshold`` (seed paper Algorithm 1, step 1).
        Memoised per process (every alpha of one model shares them)."""
        p = self.params
        key = (
            str(path.resolve()),
            p["straggler_draws"],
            p["sharpness_rho"],
            p["straggler_threshold"],
            p["sharpness_seed"],
            subset.m,
            self.clip_spec().cache_key(),
        )
        with _STRAGGLER_LOCK:
            if key in _STRAGGLERS:
                return _STRAGGLERS[key]
        original = {k: v.detach().clone() for k, v in model.state_dict().items()}
        try:
            model.load_state_dict(ft)
            values = layerwise_sharpness(
                model,
                subset,
                groups,
                rho=p["sharpness_rho"],
                n_draws=p["straggler_draws"],
                seed=p["sharpness_seed"],
                loss_fn=loss_fn,
            )
        finally:
            model.load_state_dict(original)
        result = (find_stragglers(values, threshold=p["straggler_threshold"]), {g: e.value for g, e in values.items()})
        with _STRAGGLER_LOCK:
            _STRAGGLERS[key] = result
            while len(_STRAGGLERS) > 16:
                _STRAGGLERS.popitem(last=False)
        return result

    def _sharpness(self, model, subset, loss_fn) -> Dict[str, float]:
        """Adaptive average sharpness (seed paper App. A), general and (optionally) per layer.

        The general value is the measures registry's ``avg_sharpness`` (:func:`flatlab.sharpness.compute_measures`,
        the same measure every study's ``measures=`` runs), under this workload's metric names; the per-layer
        values are the same estimator restricted to one group (:func:`flatlab.sharpness.layerwise_sharpness`).
        """
        p = self.params
        measure = {"avg_sharpness": {"rho": p["sharpness_rho"], "draws": p["sharpness_draws"], "adaptive": True}}
        flat = compute_measures(model, subset, loss_fn, measure, seed=p["sharpness_seed"])
        out = {
            "sharpness/general": flat["flat/avg_sharpness"],
            "sharpness/general_stderr": flat.get("flat/avg_sharpness_stderr", 0.0),  # absent with one draw
            "sharpness/clean_loss": flat["flat/avg_sharpness_clean"],
        }
        if p["sharpness_layerwise"]:
            kw = dict(rho=p["sharpness_rho"], n_draws=p["sharpness_draws"], seed=p["sharpness_seed"], loss_fn=loss_fn)
            for g, est in layerwise_sharpness(model, subset, "clip", **kw).items():
                out[f"sharpness/layer/{g}"] = est.value
        return out


def producing_trial(path: Path) -> Dict[str, Any]:
    """The record (``trial.json``) of the trial that wrote the checkpoint file ``path``, when ``path`` lies in
    a trial's artifact layout: ``<run>/model/model.safetensors`` beside ``<run>/trial.json``, as flatlab
    uploads a trial's model and as :func:`flatlab.tracking.checkpoints.fetch_run` stores one it fetches;
    ``{}`` for any other file or an unreadable record."""
    record = path.parent.parent / "trial.json"
    if path.parent.name != "model" or not record.is_file():
        return {}
    try:
        trial = json.loads(record.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return trial if isinstance(trial, dict) else {}
