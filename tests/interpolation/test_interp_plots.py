"""Plot helpers write non-empty PNG files."""

from __future__ import annotations

import pytest

from flatlab.errors import ConfigError
from flatlab.interpolation import SweepResult, plots
from flatlab.sharpness import SharpnessEstimate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _sweep(shift: float) -> SweepResult:
    return SweepResult(
        ALPHAS,
        {"ood": tuple(1.0 + shift + a * (1 - a) for a in ALPHAS)},
        {"ood": tuple(0.5 + shift + 0.1 * a * (1 - a) for a in ALPHAS)},
    )


def _is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data[:8] == PNG_MAGIC


def test_every_plot_writes_a_png(tmp_path):
    est = [SharpnessEstimate(v, 0.01, 4, (v,) * 4, 1.0, 1.0, True) for v in (0.1, 0.2, 0.4, 0.3, 0.2)]
    written = [
        plots.plot_sweeps({"ViT-B/32": _sweep(0.0), "ViT-B/16": _sweep(0.05)}, tmp_path / "ood.png"),
        plots.plot_sharpness_vs_alpha(
            ALPHAS, {"ViT-B/32": est, "ViT-B/16": [0.1, 0.1, 0.2, 0.2, 0.3]}, tmp_path / "sharp.png"
        ),
        plots.plot_layerwise_heatmap(
            ALPHAS, {"visual.conv1": est, "visual.transformer.resblocks.0": [0.0] * 5}, tmp_path / "sub" / "heat.png"
        ),
        plots.plot_pruned_vs_unpruned(_sweep(0.0), _sweep(0.02), tmp_path / "pruned.png"),
    ]
    assert [p.name for p in written] == ["ood.png", "sharp.png", "heat.png", "pruned.png"]
    assert all(_is_png(p) for p in written)


def test_plot_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"must end in .png, got '.*ood.pdf'"):
        plots.plot_sweeps({"m": _sweep(0.0)}, tmp_path / "ood.pdf")
    with pytest.raises(ConfigError, match=r"'layer' has 2 values for 5 alphas"):
        plots.plot_layerwise_heatmap(ALPHAS, {"layer": [0.1, 0.2]}, tmp_path / "h.png")
    with pytest.raises(ConfigError, match=r"sweep 'm' has no split 'id'; it has: ood"):
        plots.plot_sweeps({"m": _sweep(0.0)}, tmp_path / "x.png", split="id")
