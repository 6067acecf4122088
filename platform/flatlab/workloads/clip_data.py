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
:func:`lazy_images` instead gives a :class:`~flatlab.workloads.lazy_images.LazyImages` that decodes the
same pixels when a mini-batch is indexed (training sets larger than memory; the files must be on a
filesystem every node sees).

Label spaces: the classifier's classes are the labels of the ID set; another split's labels are mapped
into them by name (:func:`label_indices`). A split whose classes are a strict subset (ImageNet-A/R:
200 of the 1,000 ImageNet classes) becomes a :class:`SubsetSplit`, evaluated on that subset of logits.

One job kept whole, past 500 lines: reading a source into the workload's splits (the three source kinds,
their one preprocessing and the label spaces they map into).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from flatlab.errors import ConfigError
from flatlab.lazy import lazy, load
from flatlab.workloads.base import Split
from flatlab.workloads.lazy_images import LazyImages

datasets = lazy("datasets")  # optional (the clip extra): _hf_dataset says how to install it
# torchvision loads in seconds
tv_transforms = lazy("torchvision.transforms")
tv_functional = lazy("torchvision.transforms.functional")

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
        raise ConfigError(
            f"an image source must be a non-empty string (folder path, hf:<name>, synthetic:<variant>); got {text!r}"
        )
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
        local = os.path.expanduser(name)
        if os.path.isdir(
            local
        ):  # a save_to_disk folder: absolute, so trials (Tune moves each into its own dir) find it
            name = os.path.abspath(local)
        return Source("hf", name, split)
    path = text[len("folder:") :] if text.startswith("folder:") else text
    if not path:
        raise ConfigError(f"folder source {text!r} has an empty path")
    # Absolute: streamed images are read in the trials, whose working directory Tune changes.
    return Source("folder", os.path.abspath(os.path.expanduser(path)))


# ---- image folders ----------------------------------------------------------------------------
def _folder_index(root: str) -> Tuple[List[str], List[Tuple[str, int]]]:
    """``(label names, [(path relative to root, label)])``, files sorted by path within each class."""
    base = Path(root)
    if not base.is_dir():
        raise ConfigError(f"image folder {root!r} does not exist or is not a directory")
    labels: List[str] = []
    items: List[Tuple[str, int]] = []
    for sub in sorted(p for p in base.iterdir() if p.is_dir()):
        top = str(sub)
        files = sorted(
            os.path.join(sub.name if d == top else os.path.join(sub.name, os.path.relpath(d, top)), f)
            for d, _, names in os.walk(top)
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
        load(datasets)  # imported here, not in the try below
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(f"hf: sources need the `datasets` package (pip install 'flatlab[clip]'): {exc}") from None
    loc = source.location
    try:
        if os.path.isdir(loc) and (
            os.path.exists(os.path.join(loc, "dataset_info.json"))
            or os.path.exists(os.path.join(loc, "dataset_dict.json"))
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
            f"cannot load hf source {source}: {exc}. Offline: use a save_to_disk folder or a filled cache with "
            "HF_DATASETS_OFFLINE=1"
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
            mask = (
                (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
                if variant == "ood"
                else (abs(yy - cy) <= r) & (abs(xx - cx) <= r)
            )
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


class _PixelTransform:
    """PIL -> uint8 ``(3, S, S)``: convert to RGB, apply ``steps`` (PIL -> PIL), ``pil_to_tensor``.
    A class rather than a closure so that it pickles with the standard library."""

    def __init__(self, steps: Iterable[Any]) -> None:
        self.steps = list(steps)

    def __call__(self, img: Any) -> torch.Tensor:
        img = img.convert("RGB")
        for t in self.steps:
            img = t(img)
        return tv_functional.pil_to_tensor(img)


def pixel_transform(preprocess: Any) -> PixelTransform:
    """Turn open_clip's evaluation transform (a ``Compose``) into PIL -> uint8 ``(3, S, S)``: its steps
    before tensor conversion (resize, centre crop, RGB) then ``pil_to_tensor``; ``ToTensor`` and
    ``Normalize`` are dropped (the classifier normalises). The result pickles (as its steps do)."""
    return _PixelTransform(
        t
        for t in getattr(preprocess, "transforms", [preprocess])
        if not isinstance(t, (tv_transforms.ToTensor, tv_transforms.Normalize))
    )


def _choose(labels: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """Indices of at most ``per_class`` examples of each class (a seeded random choice), sorted."""
    if per_class <= 0:
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    keep = [rng.permutation(np.flatnonzero(labels == c))[:per_class] for c in np.unique(labels)]
    return np.sort(np.concatenate(keep)) if keep else np.arange(0)


class ImageReader:
    """Reads one item of ``source`` and preprocesses it with ``transform``: item -> uint8 ``(3, S, S)``.

    Items: for a folder, the file's path relative to the folder (``bytes``, as :func:`select_items`
    gives them); for an ``hf:`` or ``synthetic:`` source, the row index (int). Pickles as the source and
    the transform only; the data set (hf) or the generated images (synthetic) are opened again, once per
    process, on first use. Thread-safe.

    Raises:
        ConfigError: (on a call) an item that cannot be read (missing file, not an image), naming it;
            an unloadable hf source.
    """

    def __init__(self, source: Source, transform: PixelTransform) -> None:
        self.source = source
        self.transform = transform
        self._setup()

    def _setup(self) -> None:
        self._opened: Optional[Tuple[Any, str]] = None  # (images or dataset column, image column)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"source": self.source, "transform": self.transform}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    def _open(self) -> Tuple[Any, str]:
        with self._lock:
            if self._opened is None:
                if self.source.kind == "synthetic":
                    self._opened = (synthetic_images(self.source.location)[0], "")
                else:
                    ds, image_col, _ = _hf_dataset(self.source)
                    self._opened = (ds.select_columns([image_col]), image_col)
            return self._opened

    def describe(self, item: Any) -> str:
        """The item in words: its file path, or ``<source> row <i>``."""
        if self.source.kind == "folder":
            return repr(self.path(item))
        return f"{self.source} row {int(item)}"

    def path(self, item: Any) -> str:
        """The file of a folder item (the folder joined with the relative path)."""
        return os.path.join(self.source.location, os.fsdecode(bytes(item)))

    def __call__(self, item: Any) -> torch.Tensor:
        if self.source.kind == "folder":
            try:
                with Image.open(self.path(item)) as img:
                    return self.transform(img)
            except OSError as exc:  # missing file, unreadable or not an image (PIL.UnidentifiedImageError)
                raise ConfigError(f"cannot read image {self.describe(item)}: {exc}") from None
        data, image_col = self._open()
        try:
            return self.transform(data[int(item)][image_col] if image_col else data[int(item)])
        except OSError as exc:
            raise ConfigError(f"cannot read image {self.describe(item)}: {exc}") from None


def select_items(
    source: Source, transform: PixelTransform, *, per_class: int = 0, seed: int = 0
) -> Tuple[ImageReader, np.ndarray, torch.Tensor, List[str]]:
    """The items of ``source`` that :func:`load_images` keeps, without decoding any image.

    Returns:
        ``(reader, items, targets, label_names)``: the :class:`ImageReader`; the ``N`` items in order
        (folder: relative paths as a bytes array; hf/synthetic: int64 row indices); int64 ``(N,)``
        labels in the source's label order; the label names.

    Raises:
        ConfigError: a missing or empty source.
    """
    reader = ImageReader(source, transform)
    if source.kind == "synthetic":
        images, labels = synthetic_images(source.location)
        reader._opened = (images, "")  # this process's copy; not pickled
        labels, names = np.asarray(labels), list(SYNTHETIC_CLASSES)
        idx = _choose(labels, per_class, seed)
        items = idx.astype(np.int64)
    elif source.kind == "folder":
        names, entries = _folder_index(source.location)
        labels = np.asarray([y for _, y in entries], dtype=np.int64)
        idx = _choose(labels, per_class, seed)
        items = (
            np.asarray([os.fsencode(entries[i][0]) for i in idx], dtype=bytes) if len(idx) else np.zeros(0, dtype="S1")
        )
    else:
        ds, image_col, label_col = _hf_dataset(source)
        reader._opened = (ds.select_columns([image_col]), image_col)
        labels, names = np.asarray(ds[label_col]), list(ds.features[label_col].names)
        idx = _choose(labels, per_class, seed)
        items = idx.astype(np.int64)
    return reader, items, torch.as_tensor(labels[idx], dtype=torch.int64), names


def load_images(
    source: Source, transform: PixelTransform, *, per_class: int = 0, seed: int = 0, workers: int = 0
) -> Tuple[torch.Tensor, torch.Tensor, List[str]]:
    """Load and preprocess ``source``.

    Args:
        transform: PIL -> uint8 ``(3, S, S)`` (:func:`pixel_transform`).
        per_class: keep at most this many images per class (a random choice fixed by ``seed``); 0 = all.
        workers: decoding threads (0 = ``min(8, torch's thread count)``).

    Returns:
        ``(images, targets, label_names)``: uint8 ``(N, 3, S, S)``, int64 ``(N,)`` in the source's label
        order, and the label names.

    Raises:
        ConfigError: a missing or empty source; an unreadable image or images of different sizes after
            preprocessing (naming the image).
    """
    images, targets, names = lazy_images(source, transform, per_class=per_class, seed=seed, workers=workers)
    try:
        return images[:], targets, names  # every row, decoded on the thread pool, shapes checked
    finally:
        images.close()


def lazy_images(
    source: Source, transform: PixelTransform, *, per_class: int = 0, seed: int = 0, workers: int = 0
) -> Tuple[LazyImages, torch.Tensor, List[str]]:
    """:func:`load_images` without holding the pixels: the same items in the same order, as a
    :class:`~flatlab.workloads.lazy_images.LazyImages` that decodes a mini-batch when it is indexed
    (its rows equal :func:`load_images`' exactly). Decodes the first image once, for the shape.

    The images must stay readable at the same place for as long as it is used, from every node that
    receives it (a shared filesystem); an ``hf:`` source is re-opened in each process (a
    ``save_to_disk`` folder on a shared filesystem, or a filled cache there); a ``synthetic:`` source is
    generated again in each process.

    Args:
        workers: decoding threads of each process using it (0 = ``min(8, torch's thread count)``: a trial's CPU
            allocation).

    Returns:
        ``(images, targets, label_names)``: ``LazyImages`` of shape ``(N, 3, S, S)``, int64 ``(N,)``
        targets in the source's label order, and the label names.

    Raises:
        ConfigError: a missing or empty source; an unreadable first image (later images: when indexed).
    """
    reader, items, targets, names = select_items(source, transform, per_class=per_class, seed=seed)
    return LazyImages(items, reader, workers=workers), targets, names


def label_indices(names: Sequence[str], label_space: Sequence[str], where: str) -> torch.Tensor:
    """Positions of ``names`` in ``label_space`` (matched by exact name), int64 ``(len(names),)``.

    Raises:
        ConfigError: names not in the label space (the first few are listed with the fix).
    """
    pos = {n: i for i, n in enumerate(label_space)}
    unknown = [n for n in names if n not in pos]
    if unknown:
        raise ConfigError(
            f"{where}: {len(unknown)} label(s) are not among the ID set's labels, e.g. "
            f"{', '.join(map(repr, unknown[:5]))}; label names must match the ID set's (e.g. WordNet ids for ImageNet "
            "folders), or give ood_classes explicitly"
        )
    return torch.as_tensor([pos[n] for n in names], dtype=torch.int64)


def into_label_space(
    pixels: torch.Tensor,
    targets: torch.Tensor,
    names: Sequence[str],
    label_space: Sequence[str],
    where: str,
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
            raise ConfigError(
                f"{where}: class indices must lie in [0, {len(label_space)}); got {int(cls.min())}..{int(cls.max())}"
            )
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
