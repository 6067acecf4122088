"""Networks for 28x28 grey images (Fashion-MNIST): DeepOBS's ``2c2d`` and ``mlp``, and a small CNN.

All take ``(N, 1, 28, 28)`` float images and return ``(N, 10)`` logits (the workload puts them behind
:class:`~flatlab.workloads.images.ImageClassifier`, which turns uint8 pixels into [0, 1]).

* ``2c2d`` (DeepOBS ``fmnist_2c2d``, 3,274,634 parameters): two 5x5 convolutions (32, 64 channels, TF
  "same" padding, ReLU, 2x2 max-pool), dense 3,136 -> 1,024 -> 10; weights ~ truncated normal (std
  0.05, cut at 2 std), biases 0.05.
* ``mlp`` (DeepOBS ``fmnist_mlp``, 1,336,610 parameters): dense 784 -> 1,000 -> 500 -> 100 -> 10 with
  ReLU; weights ~ truncated normal (std 0.03, cut at 2 std), biases 0.
* ``small_cnn`` (flatlab's, for CPU studies; 20,746 parameters at ``width=16``, 20,842 with BatchNorm):
  conv 5x5 stride 2 (1 -> w), conv 3x3 stride 2 (w -> 2w), each [BatchNorm] and ReLU, dense 98w -> 10;
  PyTorch's default initialisation.

The DeepOBS files read (Schneider, Balles & Hennig, ICLR 2019), layer by layer shapes, and where these
differ from DeepOBS's own draws (the same law from another RNG stream; TensorFlow's flatten order):
``docs/workloads.md`` (Fashion-MNIST).
"""

from __future__ import annotations

from torch import nn

FMNIST_MODELS = ("2c2d", "mlp", "small_cnn")
NUM_CLASSES = 10


def deepobs_init(module: nn.Module, std: float, bias: float) -> None:
    """DeepOBS's initialisation of every ``Conv2d``/``Linear`` in ``module``: weights ~ normal(0, ``std``)
    truncated at 2 ``std`` (TF's ``truncated_normal_initializer``), biases = ``bias``."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.trunc_normal_(m.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)
            nn.init.constant_(m.bias, bias)


class DeepOBS2C2D(nn.Module):
    """DeepOBS's ``2c2d`` (``net_mnist_2c2d``): ``(N, 1, 28, 28)`` -> ``(N, 10)``; see the module docstring."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),  # (N, 32, 14, 14)
            nn.Conv2d(32, 64, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),  # (N, 64, 7, 7)
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(7 * 7 * 64, 1024), nn.ReLU(), nn.Linear(1024, num_classes))
        deepobs_init(self, std=0.05, bias=0.05)

    def forward(self, x):
        return self.head(self.features(x))


class DeepOBSMLP(nn.Module):
    """DeepOBS's ``mlp`` (``net_mlp``): ``(N, 1, 28, 28)`` -> ``(N, 10)``; see the module docstring."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        layers = [nn.Flatten()]
        sizes = (784, 1000, 500, 100)
        for d_in, d_out in zip(sizes, sizes[1:]):
            layers += [nn.Linear(d_in, d_out), nn.ReLU()]
        layers.append(nn.Linear(sizes[-1], num_classes))
        self.net = nn.Sequential(*layers)
        deepobs_init(self, std=3e-2, bias=0.0)

    def forward(self, x):
        return self.net(x)


class SmallCNN(nn.Module):
    """Two stride-2 conv blocks and one dense layer: ``(N, 1, 28, 28)`` -> ``(N, 10)``; ``width`` channels
    in the first block (5x5), ``2 * width`` in the second (3x3), BatchNorm after each conv when ``batchnorm``."""

    def __init__(self, width: int = 16, batchnorm: bool = False, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()

        def block(c_in: int, c_out: int, k: int) -> list:
            norm = [nn.BatchNorm2d(c_out)] if batchnorm else []
            return [nn.Conv2d(c_in, c_out, k, stride=2, padding=k // 2), *norm, nn.ReLU()]

        self.features = nn.Sequential(
            *block(1, width, 5), *block(width, 2 * width, 3)
        )  # (N, w, 14, 14) -> (N, 2w, 7, 7)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 49, num_classes))

    def forward(self, x):
        return self.head(self.features(x))


def build_fmnist_net(name: str, width: int = 16, batchnorm: bool = False) -> nn.Module:
    """One of :data:`FMNIST_MODELS` (``width``/``batchnorm`` apply to ``small_cnn`` only).

    Raises:
        ValueError: unknown ``name`` (the message lists the valid ones).
    """
    if name == "2c2d":
        return DeepOBS2C2D()
    if name == "mlp":
        return DeepOBSMLP()
    if name == "small_cnn":
        return SmallCNN(width, batchnorm)
    raise ValueError(f"unknown Fashion-MNIST model {name!r}; expected one of {', '.join(FMNIST_MODELS)}")
