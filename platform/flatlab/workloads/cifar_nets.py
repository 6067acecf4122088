"""Small-image networks for 32x32 inputs: ResNet-18 (CIFAR stem), ResNet-56, Wide ResNets, and CIFAR ViTs.

All take ``(N, 3, 32, 32)`` float images and return ``(N, num_classes)`` logits. ``width_mult`` scales
every channel count (ViT: the embedding width), so tests and ``smoke`` studies run the same
architecture in miniature. Parameter counts at ``width_mult=1`` with 10 classes:

======================  =========  ============================================================
model                   params     reference
======================  =========  ============================================================
``resnet18``            11.17 M    He et al. 2016, 3x3 stem, no max-pool (TSAM Table 1)
``resnet56``            0.85 M     He et al. 2016 Sec. 4.2, 3 x 9 basic blocks, identity shortcuts
                                   with zero padding ("option A") (IRE Table 1)
``wrn16_8``             10.96 M    Zagoruyko & Komodakis 2016, pre-activation (IRE Fig. 2)
``wrn28_10``            36.48 M    same (IRE Table 1)
``vit_t`` / ``vit_s``   5.4 / 21.3 M  timm ``VisionTransformer``, patch 4, 64 tokens + class token
                                   (IRE Table 3)
======================  =========  ============================================================
"""

from __future__ import annotations

from typing import List

import torch
from torch import nn

from flatlab.lazy import lazy

vision_transformer = lazy("timm.models.vision_transformer", extra="vision")

CIFAR_MODELS = ("resnet18", "resnet56", "wrn16_8", "wrn28_10", "vit_t", "vit_s")


def _w(c: int, mult: float) -> int:
    return max(1, int(round(c * mult)))


def _init_conv_bn(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class BasicBlock(nn.Module):
    """Post-activation residual block: conv3x3-BN-ReLU-conv3x3-BN + shortcut, ReLU.

    ``shortcut``: ``"conv"`` (1x1 conv + BN when the shape changes, ResNet-18) or ``"pad"`` (stride-2
    subsampling and zero channel padding, parameter-free, ResNet-56's option A).
    """

    def __init__(self, c_in: int, c_out: int, stride: int, shortcut: str = "conv") -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.pad = 0
        self.stride = stride
        self.proj: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            if shortcut == "conv":
                self.proj = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
            else:
                self.proj = _PadShortcut(c_out - c_in, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.proj(x))


class _PadShortcut(nn.Module):
    def __init__(self, extra: int, stride: int) -> None:
        super().__init__()
        self.extra, self.stride = extra, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        lo = self.extra // 2
        return nn.functional.pad(x, (0, 0, 0, 0, lo, self.extra - lo))


class CifarResNet(nn.Module):
    """ResNet for 32x32 images: 3x3 stem conv (no max-pool), stages of :class:`BasicBlock`, global pool, linear.

    Args:
        widths: channels per stage (ResNet-18: 64, 128, 256, 512; ResNet-56: 16, 32, 64).
        blocks: blocks per stage (ResNet-18: 2, 2, 2, 2; ResNet-56: 9, 9, 9).
        shortcut: ``"conv"`` or ``"pad"`` (see :class:`BasicBlock`).
    """

    def __init__(self, widths: List[int], blocks: List[int], num_classes: int, shortcut: str = "conv") -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers: List[nn.Module] = []
        c_in = widths[0]
        for i, (c, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                layers.append(BasicBlock(c_in, c, stride=2 if (i > 0 and j == 0) else 1, shortcut=shortcut))
                c_in = c
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, num_classes)
        _init_conv_bn(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))  # (N, c, H/2^k, W/2^k)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class WideBlock(nn.Module):
    """Pre-activation wide block: BN-ReLU-conv3x3-BN-ReLU-(dropout)-conv3x3 + shortcut (1x1 conv on shape change)."""

    def __init__(self, c_in: int, c_out: int, stride: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.proj = None if (stride == 1 and c_in == c_out) else nn.Conv2d(c_in, c_out, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = torch.relu(self.bn1(x))
        shortcut = x if self.proj is None else self.proj(o)
        o = self.conv1(o)
        o = self.conv2(self.drop(torch.relu(self.bn2(o))))
        return o + shortcut


class WideResNet(nn.Module):
    """WRN-``depth``-``widen`` (Zagoruyko & Komodakis 2016): (depth - 4) / 6 blocks per stage,
    widths 16, 16k, 32k, 64k.

    Raises:
        ValueError: ``depth - 4`` not divisible by 6.
    """

    def __init__(
        self, depth: int, widen: float, num_classes: int, width_mult: float = 1.0, dropout: float = 0.0
    ) -> None:
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WRN depth must satisfy (depth - 4) % 6 == 0, got depth={depth}")
        n = (depth - 4) // 6
        widths = [_w(16, width_mult)] + [_w(16 * widen * m, width_mult) for m in (1, 2, 4)]
        self.stem = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        blocks: List[nn.Module] = []
        c_in = widths[0]
        for i, c in enumerate(widths[1:]):
            for j in range(n):
                blocks.append(WideBlock(c_in, c, stride=2 if (i > 0 and j == 0) else 1, dropout=dropout))
                c_in = c
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(c_in)
        self.fc = nn.Linear(c_in, num_classes)
        _init_conv_bn(self)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.blocks(self.stem(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def cifar_vit(size: str, num_classes: int, width_mult: float = 1.0, img_size: int = 32) -> nn.Module:
    """timm ``VisionTransformer`` for small images: patch 4, depth 12, MLP ratio 4, class token.

    ``size``: ``"t"`` (width 192, 3 heads) or ``"s"`` (width 384, 6 heads); ``width_mult`` scales the
    width, rounded to a multiple of the head count. Needs ``timm`` (the ``vision`` extra).
    """
    width, heads = {"t": (192, 3), "s": (384, 6)}[size]
    width = max(heads, int(round(width * width_mult / heads)) * heads)
    return vision_transformer.VisionTransformer(
        img_size=img_size,
        patch_size=4,
        num_classes=num_classes,
        embed_dim=width,
        depth=12,
        num_heads=heads,
        mlp_ratio=4.0,
    )


def build_cifar_net(name: str, num_classes: int, width_mult: float = 1.0) -> nn.Module:
    """One of :data:`CIFAR_MODELS` for ``num_classes`` classes (32x32 inputs).

    Raises:
        ValueError: unknown ``name`` (the message lists the valid ones).
    """
    m = width_mult
    if name == "resnet18":
        return CifarResNet([_w(c, m) for c in (64, 128, 256, 512)], [2, 2, 2, 2], num_classes, shortcut="conv")
    if name == "resnet56":
        return CifarResNet([_w(c, m) for c in (16, 32, 64)], [9, 9, 9], num_classes, shortcut="pad")
    if name == "wrn16_8":
        return WideResNet(16, 8, num_classes, width_mult=m)
    if name == "wrn28_10":
        return WideResNet(28, 10, num_classes, width_mult=m)
    if name in ("vit_t", "vit_s"):
        return cifar_vit(name[-1], num_classes, width_mult=m)
    raise ValueError(f"unknown CIFAR model {name!r}; expected one of {', '.join(CIFAR_MODELS)}")
