"""Networks for 28x28 grey images (Fashion-MNIST): DeepOBS's ``2c2d`` and ``mlp``, and a small CNN.

All take ``(N, 1, 28, 28)`` float images and return ``(N, 10)`` logits (the workload puts them behind
:class:`~flatlab.workloads.images.ImageClassifier`, which turns uint8 pixels into [0, 1]).

DeepOBS (Schneider, Balles & Hennig, ICLR 2019), test problems ``fmnist_2c2d`` and ``fmnist_mlp``,
read in ``fsschneider/DeepOBS``: ``deepobs/pytorch/testproblems/testproblems_modules.py``
(``net_mnist_2c2d``, ``net_mlp``), ``deepobs/pytorch/testproblems/testproblems_utils.py``
(``tfconv2d``, ``tfmaxpool2d``, ``_truncated_normal_init``) and, for the TensorFlow code that produced
the published baselines, ``deepobs/tensorflow/testproblems/_2c2d.py`` and ``_mlp.py``:

``2c2d`` (3,274,634 parameters)
    conv 5x5, 1 -> 32 channels, TF "same" padding, ReLU, max-pool 2x2 stride 2 -> (32, 14, 14);
    conv 5x5, 32 -> 64, "same", ReLU, max-pool 2x2 stride 2 -> (64, 7, 7); flatten (3,136);
    dense 3,136 -> 1,024, ReLU; dense 1,024 -> 10. Every weight ~ truncated normal (std 0.05, cut at
    2 std, i.e. at +-0.1), every bias = 0.05.
``mlp`` (1,336,610 parameters)
    flatten (784); dense 784 -> 1,000 -> 500 -> 100 with ReLU; dense 100 -> 10. Weights ~ truncated
    normal (std 0.03, cut at 2 std), biases = 0.

TF's "same" padding of a stride-1 5x5 convolution is 2 pixels on every side (symmetric, so
``padding=2`` here is the same map), and a 2x2 stride-2 pool of an even-sized input pads nothing.
DeepOBS draws its truncated normals with scipy (``truncnorm(-2, 2)``) from a numpy state seeded from
torch's RNG; here ``torch.nn.init.trunc_normal_`` draws the same distribution from torch's RNG (the
same law, another stream). TensorFlow flattens (H, W, C) where torch flattens (C, H, W): a fixed
permutation of the first dense layer's inputs, the same model class and the same i.i.d. initial law.

``small_cnn`` (flatlab's, for CPU studies; 20,746 parameters at ``width=16``, 20,842 with BatchNorm)
    conv 5x5 stride 2 pad 2, 1 -> w, [BatchNorm], ReLU -> (w, 14, 14); conv 3x3 stride 2 pad 1,
    w -> 2w, [BatchNorm], ReLU -> (2w, 7, 7); flatten; dense 98w -> 10. PyTorch's default
    initialisation. Parameters: 26w + (18w^2 + 2w) + (980w + 10) (+ 6w with BatchNorm). Strided
    convolutions instead of max-pooling: on one CPU thread a training step takes about a quarter of
    the time of the same widths with 3x3 convs and 2x2 max-pools at full resolution, for about the same
    accuracy after 3 epochs (88.2 % vs 88.6 % on the validation split; one seed, SGD with momentum 0.9, lr 0.05).
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
