"""Image-workload helpers: uint8 storage, in-model normalisation, augmentation, label noise, synthetic data.

Images are held as ``uint8`` tensors ``(N, 3, H, W)`` (4x smaller than float through Ray's object
store); the model's first module (:class:`ImageClassifier`) converts and normalises them, so training
and evaluation see the same preprocessing and augmentation can work on integers.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence, Tuple

import numpy as np
import torch
from PIL import Image
from torch import nn

from flatlab.lazy import lazy

v2 = lazy("torchvision.transforms.v2")  # torchvision loads in seconds

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUGMENTATIONS = ("crop_flip", "autoaugment", "none")


class ImageClassifier(nn.Module):
    """``net`` behind a normalising front end: ``(N, 3, H, W)`` uint8 (or float in [0, 1]) -> ``(N, C)`` logits.

    ``x / 255`` for uint8 inputs, then ``(x - mean) / std`` per channel. ``mean``/``std`` are
    non-persistent buffers, so ``state_dict()`` holds only ``net.*`` entries.
    """

    def __init__(self, net: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = x.float().div_(255.0)
        return self.net((x - self.mean) / self.std)


def random_crop_flip(x: torch.Tensor, generator: torch.Generator, pad: int = 4, flip: bool = True) -> torch.Tensor:
    """Random crop after zero padding by ``pad`` pixels, and a horizontal flip with probability 1/2.

    Args:
        x: ``(N, C, H, W)`` images (any dtype), on any device.
        generator: the only source of randomness (the trainer's, saved in its checkpoints; a CPU
            generator: the draws are made on the CPU and moved to ``x``'s device, so the images get the
            same offsets and flips on every device).
    Returns:
        ``(N, C, H, W)``, same dtype and device; one offset pair and one flip decision per image.
    """
    n, _, h, w = x.shape
    dev = x.device
    if pad > 0:
        padded = nn.functional.pad(x, (pad, pad, pad, pad))
        oy = torch.randint(0, 2 * pad + 1, (n,), generator=generator).to(dev)
        ox = torch.randint(0, 2 * pad + 1, (n,), generator=generator).to(dev)
        rows = (oy[:, None] + torch.arange(h, device=dev))[:, :, None]  # (N, H, 1)
        cols = (ox[:, None] + torch.arange(w, device=dev))[:, None, :]  # (N, 1, W)
        batch = torch.arange(n, device=dev)[:, None, None]
        x = padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2).contiguous()  # (N, C, H, W)
    if flip:
        mask = (torch.rand(n, generator=generator) < 0.5).to(dev)
        x = torch.where(mask[:, None, None, None], x.flip(-1), x)
    return x


def auto_augment(x: torch.Tensor, generator: torch.Generator, policy: str = "cifar10") -> torch.Tensor:
    """torchvision's AutoAugment (Cubuk et al. 2019), one independent draw per image.

    torchvision draws from torch's global RNG; here that RNG is forked and seeded from ``generator``,
    so the result depends only on ``generator`` and the global RNG state is left untouched.

    Args:
        x: ``(N, 3, H, W)`` uint8 images. ``policy``: ``cifar10`` | ``imagenet`` | ``svhn``.
    """
    aa = v2.AutoAugment(v2.AutoAugmentPolicy(policy))
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.stack([aa(img) for img in x])


def augment_images(
    x: torch.Tensor, generator: torch.Generator, kind: str, pad: int, policy: str = "cifar10"
) -> torch.Tensor:
    """``kind``: ``crop_flip`` (random crop with ``pad`` + flip), ``autoaugment`` (AutoAugment, then crop + flip)
    or ``none``. ``x``: ``(N, 3, H, W)`` uint8."""
    if kind == "none":
        return x
    if kind == "autoaugment":
        x = auto_augment(x, generator, policy)
    return random_crop_flip(x, generator, pad=pad)


def uniform_label_noise(
    targets: np.ndarray, num_classes: int, fraction: float, seed: int
) -> Tuple[np.ndarray, np.ndarray]:
    """Replace exactly ``round(fraction * N)`` labels by a DIFFERENT class drawn uniformly from the other C-1.

    Args:
        targets: ``(N,)`` int class ids in ``[0, num_classes)``.
        fraction: share of labels to corrupt, in ``[0, 1]`` (TSAM paper: 0.2 on CIFAR-100).
        seed: the draw is a function of ``seed`` only.
    Returns:
        ``(noisy_targets, noisy_indices)``: a new ``(N,)`` array and the sorted ``(K,)`` positions changed.
    Raises:
        ValueError: ``fraction`` outside ``[0, 1]`` or ``num_classes < 2``.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"label noise fraction must be in [0, 1], got {fraction}")
    if num_classes < 2:
        raise ValueError(f"label noise needs num_classes >= 2, got {num_classes}")
    rng = np.random.default_rng([seed, 0x1AB])
    n = len(targets)
    k = int(round(fraction * n))
    idx = np.sort(rng.choice(n, size=k, replace=False)) if k else np.zeros(0, dtype=np.int64)
    shift = rng.integers(1, num_classes, size=k)  # 1 .. C-1: never the same class, uniform over the others
    noisy = np.array(targets, dtype=np.int64, copy=True)
    noisy[idx] = (noisy[idx] + shift) % num_classes
    return noisy, idx.astype(np.int64)


def synthetic_images(n: int, num_classes: int, size: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """``n`` class-dependent uint8 images ``(n, 3, size, size)`` and labels ``(n,)``, deterministic in ``seed``.

    Each class has a smooth random template (a 4x4 colour grid, upsampled); an image is its class
    template plus pixel noise, so a small network can learn the task. Labels cycle through classes.
    """
    rng = np.random.default_rng([seed, 0x5EED])
    templates = rng.uniform(40, 215, size=(num_classes, 3, 4, 4))
    rep = -(-size // 4)
    templates = np.repeat(np.repeat(templates, rep, axis=2), rep, axis=3)[:, :, :size, :size]
    y = np.arange(n) % num_classes
    rng.shuffle(y)
    x = np.empty((n, 3, size, size), dtype=np.uint8)
    for s in range(0, n, 2048):  # in chunks: the float noise of 50,000 images would take 1.2 GB
        e = min(n, s + 2048)
        x[s:e] = np.clip(templates[y[s:e]] + rng.normal(0, 30, size=(e - s, 3, size, size)), 0, 255).astype(np.uint8)
    return x, y.astype(np.int64)


def to_chw_uint8(images: Iterable[Any], size: int = 0) -> np.ndarray:
    """Stack images (PIL images or ``(H, W, 3)`` / ``(H, W)`` arrays) into ``(N, 3, H, W)`` uint8.

    ``size > 0``: resize the shorter side to ``size`` (bilinear) and centre-crop ``size x size`` first
    (images of different sizes, e.g. DTD); ``size = 0`` requires equal sizes.
    """
    out = []
    for im in images:
        if not isinstance(im, Image.Image):
            arr = np.asarray(im, dtype=np.uint8)
            im = Image.fromarray(arr)
        im = im.convert("RGB")
        if size:
            w, h = im.size
            scale = size / min(w, h)
            im = im.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BILINEAR)
            w, h = im.size
            left, top = (w - size) // 2, (h - size) // 2
            im = im.crop((left, top, left + size, top + size))
        out.append(np.asarray(im, dtype=np.uint8).transpose(2, 0, 1))
    if not out:
        raise ValueError("no images to stack")
    return np.stack(out)


def holdout_split(targets: np.ndarray, n_val: int, seed: int, stream: int = 0x7A1) -> Tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, val)``: a stratified random hold-out of exactly ``n_val`` examples, both sorted.

    The examples are ordered by class (randomly within a class) and ``n_val`` evenly spaced positions
    of that order are held out, so every class contributes in proportion to its size (to within one
    example), even when there are more classes than held-out examples. Deterministic in ``seed``;
    another ``stream`` gives an independent draw for the same seed (e.g. a subset after a hold-out).

    Raises:
        ValueError: ``n_val`` outside ``[0, len(targets)]``.
    """
    n = len(targets)
    if not 0 <= n_val <= n:
        raise ValueError(f"hold-out size must be in [0, {n}], got {n_val}")
    rng = np.random.default_rng([seed, stream])
    order = np.lexsort((rng.random(n), np.asarray(targets)))  # by class, random within a class
    pos = (
        np.floor((np.arange(n_val) + rng.random()) * n / max(1, n_val)).astype(np.int64)
        if n_val
        else np.zeros(0, np.int64)
    )
    va = np.sort(order[pos])
    mask = np.ones(n, dtype=bool)
    mask[va] = False
    return np.flatnonzero(mask), va
