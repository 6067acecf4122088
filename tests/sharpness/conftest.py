"""Tiny models with known curvature for the sharpness tests (CPU, float64 where exactness matters)."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class Quadratic(nn.Module):
    """``L(w) = 1/2 w^T H w`` (independent of the inputs); ``unused`` never touches the loss."""

    def __init__(self, H: torch.Tensor, w: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(w.clone())
        self.register_buffer("H", H.clone())
        self.unused = nn.Linear(3, 2).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, 1) -> (B,) copies of L(w)
        return (0.5 * self.w @ self.H @ self.w).expand(x.shape[0])


def quadratic_loss(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return out.mean()


QUAD_DATA = [(torch.zeros(1, 1), torch.zeros(1))]


def spd(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    return a @ a.T / d + 0.5 * torch.eye(d, dtype=torch.float64)


@pytest.fixture
def quad():
    g = torch.Generator().manual_seed(1)
    H = spd(8, 0)
    w = torch.randn(8, generator=g, dtype=torch.float64)
    return Quadratic(H, w), H, w


def make_mlp(seed: int = 0, dtype=torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(dtype)


def classification_data(n: int = 24, d: int = 4, classes: int = 3, seed: int = 0, dtype=torch.float64, batch: int = 8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    y = torch.randint(0, classes, (n,), generator=g)
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, n, batch)]


class TinyConvNet(nn.Module):
    """Conv + BatchNorm + Dropout + Linear: checks eval mode and buffers under vmap."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
        return self.fc(self.drop(h))


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 2)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, B, width)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class _Transformer(nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.resblocks = nn.ModuleList(_Block(width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.resblocks:
            x = block(x)
        return x


class _Visual(nn.Module):
    def __init__(self, width: int = 8, patch: int = 4, image: int = 8, out: int = 6) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, patch, stride=patch, bias=False)
        self.class_embedding = nn.Parameter(torch.randn(width) * 0.1)
        self.positional_embedding = nn.Parameter(torch.randn((image // patch) ** 2 + 1, width) * 0.1)
        self.ln_pre = nn.LayerNorm(width)
        self.transformer = _Transformer(width, 2)
        self.ln_post = nn.LayerNorm(width)
        self.proj = nn.Parameter(torch.randn(width, out) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, 8, 8) -> (B, out)
        h = self.conv1(x).flatten(2).transpose(1, 2)  # (B, P, width)
        cls = self.class_embedding.expand(h.shape[0], 1, -1)
        h = torch.cat([cls, h], dim=1) + self.positional_embedding
        h = self.transformer(self.ln_pre(h).transpose(0, 1)).transpose(0, 1)
        return self.ln_post(h[:, 0]) @ self.proj


class TinyCLIPClassifier(nn.Module):
    """CLIP naming (visual tower, text tower parameters, logit_scale) plus a linear ``head``."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.visual = _Visual()
        self.token_embedding = nn.Embedding(10, 8)
        self.positional_embedding = nn.Parameter(torch.randn(4, 8) * 0.1)
        self.transformer = _Transformer(8, 1)
        self.ln_final = nn.LayerNorm(8)
        self.text_projection = nn.Parameter(torch.randn(8, 6) * 0.1)
        self.logit_scale = nn.Parameter(torch.tensor(2.0))
        self.head = nn.Linear(6, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        feats = self.visual(images)
        feats = feats / feats.norm(dim=-1, keepdim=True)
        return self.logit_scale.exp() * self.head(feats)


@pytest.fixture
def kit():
    """The helpers above, for tests (conftest modules are not imported by name)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        Quadratic=Quadratic,
        quadratic_loss=quadratic_loss,
        QUAD_DATA=QUAD_DATA,
        spd=spd,
        make_mlp=make_mlp,
        classification_data=classification_data,
        TinyConvNet=TinyConvNet,
        TinyCLIPClassifier=TinyCLIPClassifier,
    )


def snapshot(model: nn.Module):
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=False).items()}


def assert_bitwise_equal(model: nn.Module, snap) -> None:
    for k, v in model.state_dict().items():
        assert torch.equal(v, snap[k]), f"{k} changed"


@pytest.fixture
def unchanged():
    """``with unchanged(model): ...`` asserts every parameter/buffer, ``.grad`` and the training flags
    are bitwise identical afterwards."""
    import contextlib

    @contextlib.contextmanager
    def check(model: nn.Module):
        snap = snapshot(model)
        grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
        flags = [m.training for m in model.modules()]
        yield
        assert_bitwise_equal(model, snap)
        for n, p in model.named_parameters():
            assert (p.grad is None) == (grads[n] is None) and (p.grad is None or torch.equal(p.grad, grads[n])), n
        assert [m.training for m in model.modules()] == flags

    return check


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield
