"""Image datasets for the CLIP workloads: sources, one-off preprocessing to uint8 tensors, label spaces.

A *source* string names where the images are:

* ``folder:<path>`` or a plain ``<path>``: an image folder, one sub-folder per class (torchvision
  ImageFolder layout; labels = sorted sub-folder names that hold images, files found recursively);
* ``hf:<name or path>[@<split>]``: a Hugging Face dataset, by hub name (``load_dataset``; offline with
  a filled cache and ``HF_DATASETS_OFFLINE=1``) or a folder written by ``save_to_disk``
  (``load_from_disk``); default split ``train``; the first ``Image`` column is the image and the first
  ``ClassLabel`` column the label (its names are the label names);
* ``synthetic:<train|val|ood>``: a tiny generated data set (3 colour classes, 40x40 images; the ``ood``
  variant changes the background and shape) for defaults, tests and smoke runs.

Images are preprocessed ONCE (on the driver) with the model's evaluation transform up to, not including,
tensor conversion and normalisation (open_clip: resize, centre crop, RGB), and kept as uint8
``(N, 3, S, S)`` tensors; :class:`~flatlab.workloads.clip_model.ClipClassifier` normalises inside, and
augmentations act on the uint8 pixels. Memory: ``N * 3 * S * S`` bytes (150 KB per 224x224 image).

Label spaces: the classifier's classes are the labels of the ID set; another split's labels are mapped
into them by name (:func:`label_indices`). A split whose classes are a strict subset (ImageNet-A/R:
200 of the 1,000 ImageNet classes) becomes a :class:`SubsetSplit`, evaluated on that subset of logits.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from flatlab.errors import ConfigError
from flatlab.workloads.base import Split

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
SYNTHETIC_CLASSES = ("red", "green", "blue")
SYNTHETIC_VARIANTS = {"train": (8, 0), "val": (4, 1), "ood": (4, 2)}  # images per class, seed offset
_SYNTHETIC_SIZE = 40
_SET_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")

PixelTransform = Callable[[Any], torch.Tensor]
"""PIL image -> uint8 ``(3, S, S)`` tensor."""


@dataclass
class SubsetSplit(Split):
    """A split whose classes are a subset of the model's: ``classes`` ``(K,)`` int64 are the logit
    columns of its classes (in its label order) and ``targets`` index into them (``0 <= y < K``)."""

    classes: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class Source:
    """A parsed source string (module docstring): ``kind`` in ``folder``, ``hf``, ``synthetic``."""

    kind: str
    location: str
    split: str = "train"

    def __str__(self) -> str:
        if self.kind == "hf":
            return f"hf:{self.location}@{self.split}"
        return f"{self.kind}:{self.location}"


def parse_source(text: str) -> Source:
    """Parse a source string (module docstring).

    Raises:
        ConfigError: an empty string, an empty location, or an unknown synthetic variant.
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"an image source must be a non-empty string (folder path, hf:<name>, synthetic:<variant>); got {text!r}")
    text = text.strip()
    if text.startswith("synthetic:"):
        variant = text[len("synthetic:") :]
        if variant not in SYNTHETIC_VARIANTS:
            raise ConfigError(f"synthetic source {text!r}: variant must be one of {', '.join(SYNTHETIC_VARIANTS)}")
        return Source("synthetic", variant)
    if text.startswith("hf:"):
        rest = text[len("hf:") :]
        name, sep, split = rest.rpartition("@")
        if not sep:
            name, split = rest, "train"
        if not name or not split:
            raise ConfigError(f"hf source {text!r}: expected hf:<name or path>[@<split>]")
        return Source("hf", name, split)
    path = text[len("folder:") :] if text.startswith("folder:") else text
    if not path:
        raise ConfigError(f"folder source {text!r} has an empty path")
    return Source("folder", os.path.expanduser(path))


# ---- image folders ----------------------------------------------------------------------------
def _folder_index(root: str) -> Tuple[List[str], List[Tuple[str, int]]]:
    base = Path(root)
    if not base.is_dir():
        raise ConfigError(f"image folder {root!r} does not exist or is not a directory")
    labels: List[str] = []
    items: List[Tuple[str, int]] = []
    for sub in sorted(p for p in base.iterdir() if p.is_dir()):
        files = sorted(
            os.path.join(d, f)
            for d, _, names in os.walk(sub)
            for f in names
            if f.lower().endswith(IMAGE_EXTENSIONS)
        )
        if not files:
            continue
        labels.append(sub.name)
        items.extend((f, len(labels) - 1) for f in files)
    if not labels:
        raise ConfigError(
            f"image folder {root!r} has no class sub-folders with images ({', '.join(IMAGE_EXTENSIONS)}); "
            "expected <root>/<class>/<image>"
        )
    return labels, items


# ---- Hugging Face datasets -------------------------------------------------------------------
def _hf_dataset(source: Source):
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(f"hf: sources need the `datasets` package (pip install 'flatlab[clip]'): {exc}") from None
    loc = source.location
    try:
        if os.path.isdir(loc) and (
            os.path.exists(os.path.join(loc, "dataset_info.json")) or os.path.exists(os.path.join(loc, "dataset_dict.json"))
        ):
            ds = datasets.load_from_disk(loc)
            if isinstance(ds, datasets.DatasetDict):
                if source.split not in ds:
                    raise ConfigError(f"hf source {source}: split {source.split!r} not found; splits: {', '.join(ds)}")
                ds = ds[source.split]
        else:
            ds = datasets.load_dataset(loc, split=source.split)
    except ConfigError:
        raise
    except Exception as exc:  # datasets raises many types (FileNotFoundError, ConnectionError, ValueError ...)
        raise ConfigError(
            f"cannot load hf source {source}: {exc}. Offline: use a save_to_disk folder or a filled cache with HF_DATASETS_OFFLINE=1"
        ) from None
    image_col = label_col = None
    for name, feature in ds.features.items():
        if image_col is None and isinstance(feature, datasets.Image):
            image_col = name
        if label_col is None and isinstance(feature, datasets.ClassLabel):
            label_col = name
    if image_col is None or label_col is None:
        raise ConfigError(
            f"hf source {source}: needs an Image column and a ClassLabel column; features: "
            + ", ".join(f"{k}: {type(v).__name__}" for k, v in ds.features.items())
        )
    return ds, image_col, label_col


# ---- synthetic --------------------------------------------------------------------------------
def synthetic_images(variant: str, n_per_class: Optional[int] = None, seed: int = 0) -> Tuple[List[Any], List[int]]:
    """A tiny generated data set: PIL RGB images (40x40) of a coloured square (``train``/``val``) or disc
    (``ood``, on a brighter, noisier background), class = colour (:data:`SYNTHETIC_CLASSES`).

    Deterministic in ``(variant, n_per_class, seed)``. Returns ``(images, labels)``.

    Raises:
        ConfigError: an unknown variant.
    """
    from PIL import Image

    if variant not in SYNTHETIC_VARIANTS:
        raise ConfigError(f"synthetic variant {variant!r}; expected one of {', '.join(SYNTHETIC_VARIANTS)}")
    default_n, offset = SYNTHETIC_VARIANTS[variant]
    n = default_n if n_per_class is None else n_per_class
    rng = np.random.default_rng(1000 * seed + offset)
    colours = np.array([[220, 40, 40], [40, 200, 60], [50, 70, 230]], dtype=np.float64)
    s = _SYNTHETIC_SIZE
    yy, xx = np.mgrid[0:s, 0:s]
    images, labels = [], []
    for c in range(len(SYNTHETIC_CLASSES)):
        for _ in range(n):
            base = 150.0 if variant == "ood" else 90.0
            img = base + rng.normal(0, 35 if variant == "ood" else 15, size=(s, s, 3))
            r = int(rng.integers(8, 14))
            cy, cx = (int(v) for v in rng.integers(r, s - r, size=2))
            mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r if variant == "ood" else (abs(yy - cy) <= r) & (abs(xx - cx) <= r)
            img[mask] = colours[c] + rng.normal(0, 10, size=3)
            images.append(Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), mode="RGB"))
            labels.append(c)
    return images, labels


def write_image_folder(root: os.PathLike, images: Sequence[Any], labels: Sequence[int], names: Sequence[str]) -> Path:
    """Write PIL ``images`` as PNG files ``<root>/<names[label]>/<i>.png``; returns ``root``."""
    root = Path(root)
    for i, (img, y) in enumerate(zip(images, labels)):
        d = root / names[y]
        d.mkdir(parents=True, exist_ok=True)
        img.save(d / f"{i:05d}.png")
    return root


def write_synthetic_folders(
    root: os.PathLike, *, n_train: int = 8, n_val: int = 4, n_ood: int = 4, ood_classes: int = 2, seed: int = 0
) -> Dict[str, Path]:
    """Write the synthetic ``train``, ``val`` and ``ood`` sets as image folders under ``root`` (skipped
    when ``root/.complete`` exists). The OOD set keeps only the first ``ood_classes`` classes, to
    exercise class-subset evaluation (like ImageNet-A's 200 of 1,000 classes).

    Returns:
        ``{"train": path, "val": path, "ood": path}``.
    """
    root = Path(root)
    paths = {k: root / k for k in ("train", "val", "ood")}
    if (root / ".complete").exists():
        return paths
    for variant, n in (("train", n_train), ("val", n_val), ("ood", n_ood)):
        images, labels = synthetic_images(variant, n, seed)
        keep = [i for i, y in enumerate(labels) if variant != "ood" or y < ood_classes]
        write_image_folder(paths[variant], [images[i] for i in keep], [labels[i] for i in keep], SYNTHETIC_CLASSES)
    (root / ".complete").write_text("ok\n")
    return paths


# ---- common -----------------------------------------------------------------------------------
def label_names(source: Source) -> List[str]:
    """The label names of ``source`` in label-index order (cheap: no image is decoded).

    Raises:
        ConfigError: as the source's loader.
    """
    if source.kind == "synthetic":
        return list(SYNTHETIC_CLASSES)
    if source.kind == "folder":
        return _folder_index(source.location)[0]
    ds, _, label_col = _hf_dataset(source)
    return list(ds.features[label_col].names)


def pixel_transform(preprocess: Any) -> PixelTransform:
    """Turn open_clip's evaluation transform (a ``Compose``) into PIL -> uint8 ``(3, S, S)``: its steps
    before tensor conversion (resize, centre crop, RGB) then ``pil_to_tensor``; ``ToTensor`` and
    ``Normalize`` are dropped (the classifier normalises)."""
    from torchvision.transforms import Normalize, ToTensor
    from torchvision.transforms.functional import pil_to_tensor

    steps = [t for t in getattr(preprocess, "transforms", [preprocess]) if not isinstance(t, (ToTensor, Normalize))]

    def apply(img: Any) -> torch.Tensor:
        img = img.convert("RGB")
        for t in steps:
            img = t(img)
        return pil_to_tensor(img)

    return apply


def _choose(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """Indices of at most ``per_class`` examples of each class (a seeded random choice), sorted."""
    if per_class <= 0:
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    keep = [rng.permutation(np.flatnonzero(labels == c))[:per_class] for c in np.unique(labels)]
    return np.sort(np.concatenate(keep)) if keep else np.arange(0)


def _decode(items: Sequence[Any], load: Callable[[Any], torch.Tensor], workers: int) -> torch.Tensor:
    if not items:
        raise ConfigError("no images selected")
    first = load(items[0])
    out = torch.empty((len(items), *first.shape), dtype=torch.uint8)
    out[0] = first
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:  # PIL decodes and resizes without the GIL
        for i, t in enumerate(pool.map(load, items[1:]), start=1):
            if t.shape != first.shape:
                raise ConfigError(f"image {i} has shape {tuple(t.shape)} after preprocessing, expected {tuple(first.shape)}")
            out[i] = t
    return out


def load_images(
    source: Source, transform: PixelTransform, *, per_class: int = 0, seed: int = 0, workers: int = 0
) -> Tuple[torch.Tensor, torch.Tensor, List[str]]:
    """Load and preprocess ``source``.

    Args:
        transform: PIL -> uint8 ``(3, S, S)`` (:func:`pixel_transform`).
        per_class: keep at most this many images per class (a random choice fixed by ``seed``); 0 = all.
        workers: decoding threads (0 = ``min(8, cpu count)``).

    Returns:
        ``(images, targets, label_names)``: uint8 ``(N, 3, S, S)``, int64 ``(N,)`` in the source's label
        order, and the label names.

    Raises:
        ConfigError: a missing or empty source, images of different sizes after preprocessing.
    """
    workers = workers or min(8, os.cpu_count() or 1)
    if source.kind == "synthetic":
        images, labels = synthetic_images(source.location)
        idx = _choose(np.asarray(labels), per_class, seed)
        pix = _decode([images[i] for i in idx], transform, workers)
        return pix, torch.as_tensor(np.asarray(labels)[idx], dtype=torch.int64), list(SYNTHETIC_CLASSES)
    if source.kind == "folder":
        names, items = _folder_index(source.location)
        labels = np.asarray([y for _, y in items])
        idx = _choose(labels, per_class, seed)

        def load_file(path: str) -> torch.Tensor:
            from PIL import Image

            with Image.open(path) as img:
                return transform(img)

        pix = _decode([items[i][0] for i in idx], load_file, workers)
        return pix, torch.as_tensor(labels[idx], dtype=torch.int64), names
    ds, image_col, label_col = _hf_dataset(source)
    labels = np.asarray(ds[label_col])
    idx = _choose(labels, per_class, seed)
    column = ds.select_columns([image_col])
    pix = _decode([int(i) for i in idx], lambda i: transform(column[i][image_col]), workers)
    return pix, torch.as_tensor(labels[idx], dtype=torch.int64), list(ds.features[label_col].names)


def label_indices(names: Sequence[str], label_space: Sequence[str], where: str) -> torch.Tensor:
    """Positions of ``names`` in ``label_space`` (matched by exact name), int64 ``(len(names),)``.

    Raises:
        ConfigError: names not in the label space (the first few are listed with the fix).
    """
    pos = {n: i for i, n in enumerate(label_space)}
    unknown = [n for n in names if n not in pos]
    if unknown:
        raise ConfigError(
            f"{where}: {len(unknown)} label(s) are not among the ID set's labels, e.g. {', '.join(map(repr, unknown[:5]))}; "
            "label names must match the ID set's (e.g. WordNet ids for ImageNet folders), or give ood_classes explicitly"
        )
    return torch.as_tensor([pos[n] for n in names], dtype=torch.int64)


def into_label_space(
    pixels: torch.Tensor, targets: torch.Tensor, names: Sequence[str], label_space: Sequence[str], where: str,
    classes: Optional[Sequence[int]] = None,
) -> Split:
    """A split in the model's label space.

    Same labels in the same order: a plain :class:`Split`. Otherwise a :class:`SubsetSplit` over the
    logit columns ``classes`` (given, e.g. ImageNet-A's 200 indices, one per label of the split in its
    order) or matched by name.

    Raises:
        ConfigError: unmatched names; ``classes`` of the wrong length or out of range.
    """
    if classes is None and list(names) == list(label_space):
        return Split(pixels, targets)
    if classes is not None:
        cls = torch.as_tensor(list(classes), dtype=torch.int64)
        if len(cls) != len(names):
            raise ConfigError(f"{where}: {len(cls)} class indices given for {len(names)} labels")
        if len(cls) and (int(cls.min()) < 0 or int(cls.max()) >= len(label_space)):
            raise ConfigError(f"{where}: class indices must lie in [0, {len(label_space)}); got {int(cls.min())}..{int(cls.max())}")
    else:
        cls = label_indices(names, label_space, where)
    return SubsetSplit(pixels, targets, classes=cls)


def parse_index_list(text: str, where: str) -> Optional[List[int]]:
    """``"auto"`` -> ``None``; ``"3,7,12"`` -> ``[3, 7, 12]``.

    Raises:
        ConfigError: anything else.
    """
    if text.strip() in ("", "auto"):
        return None
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ConfigError(f"{where}: expected 'auto' or comma-separated class indices, got {text!r}") from None


def parse_ood_sources(text: str) -> List[Tuple[str, Source]]:
    """``"src"`` or ``"src1;name2=src2;..."`` -> ``[(split key, Source)]``.

    The first set is always reported as ``ood`` (``ood/accuracy`` ...); later ones as ``ood_<name>``
    (``name`` given as ``name=source``, letters, digits, ``_`` and ``-``; default: the position, 2, 3 ...).

    Raises:
        ConfigError: no source, duplicate names, bad sources.
    """
    out: List[Tuple[str, Source]] = []
    for i, part in enumerate(p.strip() for p in text.split(";") if p.strip()):
        name, sep, src = part.partition("=")
        if not (sep and _SET_NAME.match(name.strip())):
            name, src = "", part
        key = "ood" if i == 0 else f"ood_{name.strip() or i + 1}"
        out.append((key, parse_source(src)))
    if not out:
        raise ConfigError(f"expected at least one OOD source; got {text!r}")
    keys = [k for k, _ in out]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"OOD set names must be unique; got {keys}")
    return out
