"""CLIP models for the ``clip_finetune`` / ``clip_interpolate`` workloads (open_clip, imported lazily).

* :class:`ClipSpec` names an open_clip model: architecture ``model_name`` plus ``pretrained`` weights,
  which may be an open_clip tag (``openai``, ``laion2b_s34b_b79k`` ...; needs internet, or a pre-filled
  Hugging Face cache with ``HF_HUB_OFFLINE=1``), a local checkpoint file (safetensors or torch), or
  ``""`` for random weights drawn with ``init_seed`` (tests, smoke runs).
* OpenAI's CLIP weights were trained with quick-GELU (``x * sigmoid(1.702 x)``); open_clip's plain
  configs use exact GELU, so OpenAI weights need ``quick_gelu=True`` (or a ``*-quickgelu`` config).
* :data:`TINY_MODEL` is a tiny ViT config (width 32, 2 layers, patch 8, 32x32 images, text width 32,
  2 layers, CLIP's 49,408-token vocabulary) registered with open_clip on demand, for offline tests.
* :func:`zero_shot_head` builds the zero-shot head with open_clip's ``build_zero_shot_classifier``
  (per class: mean of the L2-normalised text embeddings over templates, renormalised); the seed paper
  "In Search of the Successful Interpolation" starts robust fine-tuning from this model.
* :class:`ClipClassifier` = CLIP image tower + head, ``logits = logit_scale.exp() * normalise(f(x)) @ head``;
  its state-dict keys keep open_clip's names (``visual.transformer.resblocks.{i}...``, ``logit_scale``)
  plus ``head``, so :func:`flatlab.sharpness.clip_grouping` groups it layer by layer.
* :func:`export_open_clip_checkpoint` writes a full open_clip checkpoint (fine-tuned image tower, the
  original text tower) that ``open_clip.create_model_and_transforms(name, pretrained=<file>)`` loads.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from flatlab.errors import ConfigError
from flatlab.lazy import lazy, load

open_clip = lazy("open_clip")  # optional (the clip extra): _require_open_clip says how to install it

TINY_MODEL = "flatlab-tiny-vit"
TINY_CONFIG: Dict[str, Any] = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
TEMPLATE_SETS = ("openai", "simple")

_LOCK = threading.Lock()
_HEADS: "OrderedDict[Tuple, torch.Tensor]" = OrderedDict()  # zero-shot heads of this process (small)
_MAX_HEADS = 8


def _require_open_clip() -> None:
    """Import open_clip now.

    Raises:
        ConfigError: it cannot be imported; the message says how to install it.
    """
    try:
        load(open_clip)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "the clip workloads need open_clip; install it with `pip install 'flatlab[clip]'` "
            f"(or `pip install open_clip_torch`): {exc}"
        ) from None


def register_model_config(name: str, config: Mapping[str, Any]) -> None:
    """Register an open_clip architecture ``config`` (``embed_dim``, ``vision_cfg``, ``text_cfg``) as ``name``.

    Written to a JSON file in a temporary folder and added with ``open_clip.add_model_config`` (the
    registry is per process, so every process that builds the model calls this). Idempotent.

    Raises:
        ConfigError: ``config`` lacks one of ``embed_dim``, ``vision_cfg``, ``text_cfg``.
    """
    missing = [k for k in ("embed_dim", "vision_cfg", "text_cfg") if k not in config]
    if missing:
        raise ConfigError(f"open_clip model config {name!r} lacks {', '.join(missing)}")
    _require_open_clip()
    if name in open_clip.list_models():
        return
    folder = Path(tempfile.mkdtemp(prefix="flatlab-openclip-"))
    path = folder / f"{name}.json"
    path.write_text(json.dumps(dict(config)))
    open_clip.add_model_config(path)


def ensure_model_config(model_name: str, model_config: str = "") -> None:
    """Make ``model_name`` known to open_clip: the built-in tiny config, or a JSON file ``model_config``.

    Raises:
        ConfigError: ``model_config`` missing or not a JSON model config; its file name (stem) differs
            from ``model_name``.
    """
    if model_config:
        path = Path(model_config)
        if not path.is_file():
            raise ConfigError(f"model_config={model_config!r} is not a file; give the path of an open_clip JSON config")
        if path.stem != model_name:
            raise ConfigError(
                f"model_config={model_config!r} registers the name {path.stem!r} (its file name), "
                f"but model_name={model_name!r}; rename one of them"
            )
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model_config={model_config!r} is not valid JSON: {exc}") from None
        register_model_config(model_name, config)
    elif model_name == TINY_MODEL:
        register_model_config(TINY_MODEL, TINY_CONFIG)


@dataclass(frozen=True)
class ClipSpec:
    """Which open_clip model and weights (module docstring).

    Attributes:
        model_name: open_clip architecture (``ViT-B-32``, :data:`TINY_MODEL` ...).
        pretrained: open_clip tag, local checkpoint path, or ``""`` for random weights.
        quick_gelu: force quick-GELU activations (required for OpenAI weights).
        init_seed: seed of the random weights when ``pretrained == ""``.
        model_config: optional path to a JSON architecture config registered as ``model_name``.
    """

    model_name: str = TINY_MODEL
    pretrained: str = ""
    quick_gelu: bool = False
    init_seed: int = 0
    model_config: str = ""

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "ClipSpec":
        """The spec from a workload's resolved parameters (the fields above, by name)."""
        return cls(**{k: params[k] for k in ("model_name", "pretrained", "quick_gelu", "init_seed", "model_config")})

    def cache_key(self) -> Tuple:
        """A key that changes when the weights could change (a checkpoint file's size and mtime included)."""
        stamp: Tuple = ()
        if self.pretrained and os.path.isfile(self.pretrained):
            st = os.stat(self.pretrained)
            stamp = (st.st_size, st.st_mtime_ns)
        return (*asdict(self).values(), stamp)


def load_clip(spec: ClipSpec) -> Tuple[nn.Module, Callable[[Any], torch.Tensor]]:
    """The open_clip model of ``spec`` on CPU in eval mode, and its evaluation preprocessing.

    Random weights (``pretrained == ""``) are drawn from the CPU generator seeded with
    ``spec.init_seed`` inside ``torch.random.fork_rng``, so they are identical in every process and
    the caller's RNG state is untouched.

    Returns:
        ``(model, preprocess)``: an ``open_clip.CLIP`` and open_clip's validation transform (PIL image ->
        normalised ``(3, S, S)`` float tensor).

    Raises:
        ConfigError: unknown architecture, weights that cannot be found or downloaded (with the offline
            options in the message).
    """
    _require_open_clip()
    ensure_model_config(spec.model_name, spec.model_config)
    known = spec.model_name.replace("/", "-") in open_clip.list_models()  # open_clip accepts ViT-B/32 for ViT-B-32
    if not known and not spec.model_name.startswith(("hf-hub:", "local-dir:")):
        raise ConfigError(
            f"model_name={spec.model_name!r} is not an open_clip architecture; see open_clip.list_models(), "
            f"use {TINY_MODEL!r}, or register a JSON config with model_config=<path>"
        )
    kwargs: Dict[str, Any] = {"force_quick_gelu": spec.quick_gelu}
    try:
        if spec.pretrained:
            model, _, preprocess = open_clip.create_model_and_transforms(
                spec.model_name, pretrained=spec.pretrained, **kwargs
            )
        else:
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(spec.init_seed)
                model, _, preprocess = open_clip.create_model_and_transforms(spec.model_name, pretrained=None, **kwargs)
    except (RuntimeError, OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot load open_clip model {spec.model_name!r} with pretrained={spec.pretrained!r}: {exc}. "
            "Offline: pass a local checkpoint file as pretrained, or pre-fill the Hugging Face cache and set "
            "HF_HUB_OFFLINE=1"
        ) from None
    model.eval()
    return model, preprocess


def templates_for(name: str) -> Sequence[Callable[[str], str]]:
    """Prompt templates: ``openai`` (open_clip's 80 ``OPENAI_IMAGENET_TEMPLATES``) or ``simple`` (its 7).

    Raises:
        ConfigError: another name.
    """
    _require_open_clip()
    if name == "openai":
        return open_clip.OPENAI_IMAGENET_TEMPLATES
    if name == "simple":
        return open_clip.SIMPLE_IMAGENET_TEMPLATES
    raise ConfigError(f"templates={name!r} is not allowed; expected one of {', '.join(TEMPLATE_SETS)}")


def zero_shot_head(
    clip: nn.Module, spec: ClipSpec, classnames: Sequence[str], templates: str = "openai"
) -> torch.Tensor:
    """The zero-shot head of ``clip`` for ``classnames`` (open_clip's ``build_zero_shot_classifier``).

    Text embeddings are computed on CUDA when it is available (then moved back), in batches of 10
    classes. Heads are memoised per process by ``(spec, classnames, templates)``.

    Returns:
        ``(embed_dim, n_classes)`` float32 CPU tensor with unit-norm columns.

    Raises:
        ConfigError: no class names, an unknown template set.
    """
    if not classnames:
        raise ConfigError("the zero-shot head needs at least one class name")
    key = (spec.cache_key(), tuple(classnames), templates)
    with _LOCK:
        if key in _HEADS:
            _HEADS.move_to_end(key)
            return _HEADS[key].clone()
    _require_open_clip()
    tokenizer = open_clip.get_tokenizer(spec.model_name)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    moved = next(clip.parameters()).device != device
    if moved:
        clip.to(device)
    try:
        head = open_clip.build_zero_shot_classifier(
            clip, tokenizer, list(classnames), templates_for(templates), num_classes_per_batch=10, device=device
        )
    finally:
        if moved:
            clip.to("cpu")
    head = head.detach().float().cpu().contiguous()  # (embed_dim, n_classes)
    with _LOCK:
        _HEADS[key] = head
        while len(_HEADS) > _MAX_HEADS:
            _HEADS.popitem(last=False)
    return head.clone()


class ClipClassifier(nn.Module):
    """CLIP image tower + linear head: ``(B, 3, S, S)`` images -> ``(B, n_classes)`` logits.

    ``logits = logit_scale.exp() * normalise(visual(normalise_pixels(x))) @ head``.

    Inputs are uint8 pixels in [0, 255] or floats in [0, 1] (not yet normalised); the channel mean and
    standard deviation of the model's preprocessing are applied inside (non-persistent buffers, not in
    the state dict). State dict: ``head`` ``(embed_dim, n_classes)`` (trainable), ``logit_scale`` (a
    buffer: log of the temperature, copied from CLIP, not trained and never perturbed by sharpness
    measures, which perturb parameters), and ``visual.*`` with open_clip's names.

    Args:
        visual: open_clip's image tower (``clip.visual``), taken over (not copied).
        head: ``(embed_dim, n_classes)`` initial head (the zero-shot head).
        logit_scale: scalar log temperature (``clip.logit_scale``).
        mean, std: per-channel pixel statistics of the preprocessing (3 values each).
    """

    def __init__(
        self,
        visual: nn.Module,
        head: torch.Tensor,
        logit_scale: Union[torch.Tensor, float],
        mean: Sequence[float],
        std: Sequence[float],
    ) -> None:
        super().__init__()
        if head.ndim != 2:
            raise ConfigError(f"head must be (embed_dim, n_classes); got shape {tuple(head.shape)}")
        self.visual = visual
        self.head = nn.Parameter(head.detach().clone().float())
        self.register_buffer(
            "logit_scale", torch.as_tensor(logit_scale, dtype=torch.float32).detach().clone().reshape(())
        )
        self.register_buffer(
            "pixel_mean", torch.tensor(list(mean), dtype=torch.float32).view(1, 3, 1, 1), persistent=False
        )
        self.register_buffer(
            "pixel_std", torch.tensor(list(std), dtype=torch.float32).view(1, 3, 1, 1), persistent=False
        )

    @classmethod
    def from_clip(cls, clip: nn.Module, head: torch.Tensor) -> "ClipClassifier":
        """Wrap ``clip.visual`` (taken over), ``clip.logit_scale`` and ``head``; pixel statistics from
        ``clip.visual.preprocess_cfg`` (set by open_clip's factory)."""
        cfg = getattr(clip.visual, "preprocess_cfg", None) or {}
        mean = cfg.get("mean", getattr(clip.visual, "image_mean", None))
        std = cfg.get("std", getattr(clip.visual, "image_std", None))
        if mean is None or std is None:
            raise ConfigError("the open_clip model carries no preprocessing mean/std (visual.preprocess_cfg)")
        return cls(clip.visual, head, clip.logit_scale.detach(), mean, std)

    @property
    def num_classes(self) -> int:
        return int(self.head.shape[1])

    def normalise_pixels(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 ``[0, 255]`` or float ``[0, 1]`` ``(B, 3, S, S)`` -> normalised float ``(B, 3, S, S)``."""
        x = images.float().div(255.0) if not torch.is_floating_point(images) else images.float()
        return (x - self.pixel_mean) / self.pixel_std

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """L2-normalised image features, ``(B, embed_dim)``."""
        return F.normalize(self.visual(self.normalise_pixels(images)), dim=-1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.logit_scale.exp() * self.features(images) @ self.head  # (B, n_classes)


def build_zero_shot_classifier(spec: ClipSpec, classnames: Sequence[str], templates: str = "openai") -> ClipClassifier:
    """The zero-shot CLIP classifier of ``spec`` for ``classnames`` (CPU, eval mode).

    Raises:
        ConfigError: as :func:`load_clip` and :func:`zero_shot_head`.
    """
    clip, _ = load_clip(spec)
    head = zero_shot_head(clip, spec, classnames, templates)
    model = ClipClassifier.from_clip(clip, head)
    return model.eval()


def export_open_clip_checkpoint(
    classifier_state: Mapping[str, torch.Tensor], spec: ClipSpec, path: Union[str, os.PathLike]
) -> Path:
    """Write a full open_clip checkpoint: the classifier's image tower and ``logit_scale``, the text tower
    of ``spec``'s weights. ``open_clip.create_model_and_transforms(spec.model_name, pretrained=path)``
    (with the same ``quick_gelu``) then loads it; the head is not part of it (save it separately).

    Args:
        classifier_state: a :class:`ClipClassifier` state dict (e.g. a trial's ``model/model.safetensors``).
        spec: the model the classifier was built from.
        path: ``*.safetensors`` (safetensors) or anything else (``torch.save``).

    Raises:
        ConfigError: the classifier state misses image-tower keys of ``spec``'s architecture or has
            different shapes.
    """
    clip, _ = load_clip(spec)
    full = OrderedDict((k, v.detach().clone()) for k, v in clip.state_dict().items())
    missing = [k for k in full if k.startswith("visual.") and k not in classifier_state]
    if missing:
        raise ConfigError(
            f"classifier state lacks image-tower key {missing[0]!r} of {spec.model_name!r} ({len(missing)} missing)"
        )
    for k in full:
        if k.startswith("visual.") or k == "logit_scale":
            v = classifier_state[k].detach().cpu()
            if k == "logit_scale":
                v = v.reshape(full[k].shape)
            if v.shape != full[k].shape:
                raise ConfigError(
                    f"classifier state {k!r} has shape {tuple(v.shape)}; {spec.model_name!r} expects "
                    f"{tuple(full[k].shape)}"
                )
            full[k] = v.to(full[k].dtype)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in full.items()}
    if path.suffix == ".safetensors":
        save_file(tensors, str(path))
    else:
        torch.save(tensors, path)
    return path


def load_state_file(path: Union[str, os.PathLike]) -> Dict[str, torch.Tensor]:
    """A state dict from a ``*.safetensors`` file or a torch file (``weights_only=True``; a
    ``{"state_dict": ...}`` wrapper is unwrapped).

    Raises:
        ConfigError: a missing file or one that holds no dict of tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        return dict(load_file(str(path)))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"checkpoint {str(path)!r} does not hold a state dict of tensors")
    return dict(state)


def classnames_from_labels(labels: Sequence[str]) -> List[str]:
    """Prompt names from label names: ``_`` becomes a space (``golden_retriever`` -> ``golden retriever``)."""
    return [str(n).replace("_", " ") for n in labels]
