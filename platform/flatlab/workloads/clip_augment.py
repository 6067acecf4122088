"""Batched training augmentations on uint8 image tensors, drawing only from a given ``torch.Generator``.

Both act on a whole mini-batch ``(B, 3, S, S)`` uint8 at once (per-image parameters, one vectorised
call per operation), so they add little to a CPU step and are exactly reproducible from the trainer's
generator state (hence resumable).

* :func:`flip_crop`: random resized crop (area fraction in ``[scale_min, 1]``, aspect ratio in
  [3/4, 4/3]) back to ``S x S`` with bilinear sampling, and a horizontal flip with probability 1/2
  (one affine warp per image).
* :func:`rand_augment`: RandAugment (Cubuk et al. 2020): ``n_ops`` times, every image gets one operation
  drawn uniformly from :data:`RANDAUG_OPS` at the fixed magnitude ``magnitude`` / 30 of each
  operation's range, with a random sign for signed operations. Ranges follow the paper's table
  (shear 0.3, translate 0.45 of the side, rotate 30 degrees, enhance factors 1 +- 0.9, posterize down
  to 4 bits, solarize threshold down to 0).
* ``randaug`` in the workloads = :func:`flip_crop` then :func:`rand_augment`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from flatlab.errors import ConfigError

AUGMENTATIONS = ("none", "flip-crop", "randaug")
RANDAUG_OPS = (
    "identity",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
    "rotate",
    "brightness",
    "color",
    "contrast",
    "sharpness",
    "posterize",
    "solarize",
    "autocontrast",
    "equalize",
)
_GEOMETRIC = {"shear_x", "shear_y", "translate_x", "translate_y", "rotate"}
_GREY = (0.299, 0.587, 0.114)  # ITU-R 601 luma weights


def _check(x: torch.Tensor) -> None:
    if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[1] != 3:
        raise ConfigError(f"augmentations expect uint8 images (B, 3, S, S); got {x.dtype} {tuple(x.shape)}")


def _warp(x: torch.Tensor, theta: torch.Tensor, padding: str) -> torch.Tensor:
    """Bilinear affine warp of uint8 ``x`` ``(B, 3, H, W)`` by ``theta`` ``(B, 2, 3)`` (output -> input,
    normalised coordinates), back to uint8."""
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    out = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode=padding, align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def flip_crop(x: torch.Tensor, generator: torch.Generator, *, scale_min: float = 0.35) -> torch.Tensor:
    """Random resized crop + horizontal flip (module docstring) of uint8 ``(B, 3, S, S)`` images.

    Draws ``4 * B`` uniforms from ``generator`` (area, log aspect ratio, two centre coordinates) and
    ``B`` more for the flips.

    Raises:
        ConfigError: not a uint8 ``(B, 3, S, S)`` tensor; ``scale_min`` outside (0, 1].
    """
    _check(x)
    if not 0.0 < scale_min <= 1.0:
        raise ConfigError(f"scale_min must be in (0, 1]; got {scale_min}")
    b = x.shape[0]
    u = torch.rand((b, 4), generator=generator, dtype=torch.float64)
    area = scale_min + (1.0 - scale_min) * u[:, 0]
    log_ratio = math.log(3 / 4) + (math.log(4 / 3) - math.log(3 / 4)) * u[:, 1]
    ratio = torch.exp(log_ratio)
    half_w = torch.sqrt(area * ratio).clamp(max=1.0)  # crop half-width in normalised units (full = 1)
    half_h = torch.sqrt(area / ratio).clamp(max=1.0)
    cx = (2 * u[:, 2] - 1) * (1 - half_w)
    cy = (2 * u[:, 3] - 1) * (1 - half_h)
    flip = torch.where(torch.rand(b, generator=generator) < 0.5, -1.0, 1.0).double()
    theta = torch.zeros((b, 2, 3), dtype=torch.float64)
    theta[:, 0, 0] = half_w * flip
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = half_h
    theta[:, 1, 2] = cy
    return _warp(x, theta.float(), "reflection")


def _grey(xf: torch.Tensor) -> torch.Tensor:
    w = torch.tensor(_GREY, dtype=xf.dtype).view(1, 3, 1, 1)
    return (xf * w).sum(dim=1, keepdim=True)  # (B, 1, H, W)


def _blend(a: torch.Tensor, b: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``b + factor * (a - b)`` with per-image ``factor`` ``(B,)`` (PIL ImageEnhance semantics)."""
    return b + factor.view(-1, 1, 1, 1) * (a - b)


def _sharpen_base(xf: torch.Tensor) -> torch.Tensor:
    """PIL's SMOOTH kernel (1 1 1 / 1 5 1 / 1 1 1, /13) on the interior; borders unchanged."""
    k = torch.ones((3, 1, 3, 3), dtype=xf.dtype)
    k[:, :, 1, 1] = 5.0
    k /= 13.0
    out = xf.clone()
    if xf.shape[-1] > 2 and xf.shape[-2] > 2:
        out[..., 1:-1, 1:-1] = F.conv2d(xf, k, groups=3)
    return out


def _autocontrast(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    lo = xf.amin(dim=(2, 3), keepdim=True)
    hi = xf.amax(dim=(2, 3), keepdim=True)
    scale = torch.where(hi > lo, 255.0 / (hi - lo).clamp(min=1e-6), torch.ones_like(hi))
    shift = torch.where(hi > lo, lo, torch.zeros_like(lo))
    return ((xf - shift) * scale).round_().clamp_(0, 255).to(torch.uint8)


def _equalize(x: torch.Tensor) -> torch.Tensor:
    """Histogram equalisation per image and channel (PIL ImageOps.equalize semantics), vectorised."""
    b, c, h, w = x.shape
    flat = x.reshape(b * c, h * w).long()
    hist = torch.zeros((b * c, 256), dtype=torch.long).scatter_add_(1, flat, torch.ones_like(flat))
    last = torch.where(hist > 0, torch.arange(256).expand_as(hist), torch.full_like(hist, -1)).amax(dim=1)
    last_count = hist.gather(1, last.clamp(min=0).unsqueeze(1)).squeeze(1)
    step = torch.div(h * w - last_count, 255, rounding_mode="floor")  # (b*c,)
    cdf = hist.cumsum(dim=1) - hist  # counts strictly below each value
    safe = step.clamp(min=1).unsqueeze(1)
    lut = torch.div(cdf + torch.div(step, 2, rounding_mode="floor").unsqueeze(1), safe, rounding_mode="floor").clamp(
        0, 255
    )
    lut = torch.where((step > 0).unsqueeze(1), lut, torch.arange(256).expand_as(lut))  # flat channels: identity
    return lut.gather(1, flat).reshape(b, c, h, w).to(torch.uint8)


def _apply_op(x: torch.Tensor, op: str, m: float, sign: torch.Tensor) -> torch.Tensor:
    """One RandAugment operation on uint8 ``x`` ``(k, 3, S, S)`` at magnitude fraction ``m`` in [0, 1]
    with per-image signs ``sign`` ``(k,)`` of +-1."""
    k = x.shape[0]
    if op == "identity":
        return x
    if op in _GEOMETRIC:
        theta = torch.zeros((k, 2, 3))
        theta[:, 0, 0] = 1.0
        theta[:, 1, 1] = 1.0
        if op == "shear_x":
            theta[:, 0, 1] = 0.3 * m * sign
        elif op == "shear_y":
            theta[:, 1, 0] = 0.3 * m * sign
        elif op == "translate_x":
            theta[:, 0, 2] = 2 * 0.45 * m * sign
        elif op == "translate_y":
            theta[:, 1, 2] = 2 * 0.45 * m * sign
        else:  # rotate
            angle = torch.deg2rad(30.0 * m * sign)
            theta[:, 0, 0], theta[:, 0, 1] = torch.cos(angle), -torch.sin(angle)
            theta[:, 1, 0], theta[:, 1, 1] = torch.sin(angle), torch.cos(angle)
        return _warp(x, theta, "zeros")
    if op == "autocontrast":
        return _autocontrast(x)
    if op == "equalize":
        return _equalize(x)
    if op == "posterize":
        bits = 8 - int(round(4 * m))
        mask = (0xFF << (8 - bits)) & 0xFF
        return x & mask
    if op == "solarize":
        threshold = 255.0 * (1.0 - m)
        return torch.where(x.float() >= threshold, 255 - x, x)
    xf = x.float()
    factor = 1.0 + 0.9 * m * sign
    if op == "brightness":
        out = _blend(xf, torch.zeros_like(xf), factor)
    elif op == "color":
        out = _blend(xf, _grey(xf).expand_as(xf), factor)
    elif op == "contrast":
        out = _blend(xf, _grey(xf).mean(dim=(2, 3), keepdim=True).expand_as(xf), factor)
    elif op == "sharpness":
        out = _blend(xf, _sharpen_base(xf), factor)
    else:  # pragma: no cover - RANDAUG_OPS is closed
        raise ConfigError(f"unknown RandAugment operation {op!r}")
    return out.round_().clamp_(0, 255).to(torch.uint8)


def rand_augment(x: torch.Tensor, generator: torch.Generator, *, n_ops: int = 2, magnitude: int = 9) -> torch.Tensor:
    """RandAugment (module docstring) of uint8 ``(B, 3, S, S)`` images.

    Per round: ``B`` operation indices and ``B`` signs from ``generator``; images are grouped by
    operation and each group is transformed in one call.

    Raises:
        ConfigError: not a uint8 ``(B, 3, S, S)`` tensor; ``n_ops < 0``; ``magnitude`` outside [0, 30].
    """
    _check(x)
    if n_ops < 0:
        raise ConfigError(f"n_ops must be >= 0; got {n_ops}")
    if not 0 <= magnitude <= 30:
        raise ConfigError(f"magnitude must be in [0, 30]; got {magnitude}")
    m = magnitude / 30.0
    b = x.shape[0]
    out = x.clone()
    for _ in range(n_ops):
        ops = torch.randint(len(RANDAUG_OPS), (b,), generator=generator)
        signs = torch.where(torch.rand(b, generator=generator) < 0.5, -1.0, 1.0)
        for i, op in enumerate(RANDAUG_OPS):
            rows = torch.nonzero(ops == i).flatten()
            if len(rows):
                out[rows] = _apply_op(out[rows], op, m, signs[rows])
    return out


def augment_batch(
    x: torch.Tensor,
    kind: str,
    generator: torch.Generator,
    *,
    n_ops: int = 2,
    magnitude: int = 9,
    scale_min: float = 0.35,
) -> torch.Tensor:
    """``none`` (``x`` itself), ``flip-crop`` or ``randaug`` (flip-crop, then RandAugment).

    Raises:
        ConfigError: an unknown ``kind`` (listing :data:`AUGMENTATIONS`).
    """
    if kind == "none":
        return x
    if kind == "flip-crop":
        return flip_crop(x, generator, scale_min=scale_min)
    if kind == "randaug":
        return rand_augment(flip_crop(x, generator, scale_min=scale_min), generator, n_ops=n_ops, magnitude=magnitude)
    raise ConfigError(f"augment={kind!r} is not allowed; expected one of {', '.join(AUGMENTATIONS)}")
