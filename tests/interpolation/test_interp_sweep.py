"""Instability, barrier, gain and failure mode on hand-made curves; alpha_sweep end to end."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from flatlab.errors import ConfigError
from flatlab.interpolation import (
    DEFAULT_ALPHAS,
    SweepResult,
    alpha_grid,
    alpha_sweep,
    barrier,
    gain,
    instability,
    interpolate_keys,
    is_failure_mode,
    layerwise_alpha_sweep,
)
from flatlab.sharpness import group_parameters

ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
LOSSES = (1.0, 1.5, 2.0, 1.2, 0.8)


def test_summary_numbers_on_a_hand_made_curve():
    assert instability(ALPHAS, LOSSES) == pytest.approx(2.0 - 0.5 * (1.0 + 0.8))  # 1.1
    assert barrier(ALPHAS, LOSSES) == pytest.approx(2.0 - 1.0)  # 1.0
    assert barrier(ALPHAS, (1.0, 0.9, 0.7, 0.6, 0.5)) == 0.0  # monotone path: no barrier
    acc = (0.50, 0.55, 0.60, 0.52, 0.45)
    assert gain(ALPHAS, acc) == pytest.approx(0.10)
    assert is_failure_mode(ALPHAS, acc) is False


def test_failure_mode_when_no_interior_alpha_beats_the_zero_shot_end():
    acc = (0.60, 0.58, 0.55, 0.50, 0.70)  # only the fine-tuned END beats zero-shot
    assert is_failure_mode(ALPHAS, acc) is True
    assert gain(ALPHAS, acc) == pytest.approx(0.10)
    assert is_failure_mode(ALPHAS, (0.60, 0.605, 0.55, 0.5, 0.5), tol=0.01) is True
    assert is_failure_mode(ALPHAS, (0.60, 0.605, 0.55, 0.5, 0.5)) is False


def test_sweep_result_methods_and_summary():
    res = SweepResult(
        ALPHAS,
        {"id": (0.5, 0.4, 0.3, 0.2, 0.1), "ood": LOSSES},
        {"id": (0.7, 0.8, 0.85, 0.9, 0.95), "ood": (0.50, 0.55, 0.60, 0.52, 0.45)},
    )
    assert res.instability() == pytest.approx(1.1) and res.barrier("ood") == pytest.approx(1.0)
    assert res.best_alpha("ood") == 0.5 and res.best_alpha("id") == 1.0
    summary = res.summary()
    assert summary["ood/gain"] == pytest.approx(0.10) and summary["ood/failure_mode"] == 0.0
    assert summary["id/instability"] == pytest.approx(0.5 - 0.3) and summary["id/barrier"] == 0.0
    with pytest.raises(ConfigError, match=r"unknown split 'test'; this sweep has: id, ood"):
        res.gain("test")


def test_grid_and_curve_errors():
    assert len(DEFAULT_ALPHAS) == 21 and DEFAULT_ALPHAS[1] == 0.05 and DEFAULT_ALPHAS[-1] == 1.0
    assert alpha_grid(0.25) == ALPHAS
    with pytest.raises(ConfigError, match=r"step must divide 1 into whole steps"):
        alpha_grid(0.3)
    with pytest.raises(ConfigError, match=r"instability needs alpha=1 on the grid"):
        instability((0.0, 0.5), (1.0, 2.0))
    with pytest.raises(ConfigError, match=r"gain needs alpha=0 on the grid"):
        gain((0.5, 1.0), (0.5, 0.6))
    with pytest.raises(ConfigError, match=r"at least one alpha strictly between 0 and 1"):
        is_failure_mode((0.0, 1.0), (0.5, 0.6))
    with pytest.raises(ConfigError, match=r"equal length; got 5 and 2"):
        barrier(ALPHAS, (1.0, 2.0))


def _evaluator(build, data):
    model = build()

    def evaluate(state, split):
        model.load_state_dict(state)
        model.eval()
        x, y = data[split]
        with torch.no_grad():
            logits = model(x)
        return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())

    return evaluate


def test_alpha_sweep_evaluates_every_alpha_and_split(pair):
    zs, ft, build = pair
    g = torch.Generator().manual_seed(0)
    data = {s: (torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g)) for s in ("id", "ood")}
    evaluate = _evaluator(build, data)
    res = alpha_sweep(zs, ft, evaluate, alphas=ALPHAS)
    assert res.alphas == ALPHAS and set(res.loss) == {"id", "ood"}
    assert res.loss["ood"][0] == evaluate(zs, "ood")[0] and res.loss["ood"][-1] == evaluate(ft, "ood")[0]
    assert res.accuracy["id"][-1] == evaluate(ft, "id")[1]
    assert res.instability("ood") == pytest.approx(
        max(res.loss["ood"]) - 0.5 * (res.loss["ood"][0] + res.loss["ood"][-1])
    )
    as_dict = alpha_sweep(zs, ft, lambda s, split: {"loss": 1.0, "accuracy": 0.5}, alphas=ALPHAS, splits=("ood",))
    assert as_dict.loss == {"ood": (1.0,) * 5}
    with pytest.raises(ConfigError, match=r"must return \(loss, accuracy\)"):
        alpha_sweep(zs, ft, lambda s, split: 1.0, alphas=ALPHAS)


def test_layerwise_sweep_interpolates_one_group(pair):
    zs, ft, build = pair
    g = torch.Generator().manual_seed(1)
    data = {"ood": (torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g))}
    evaluate = _evaluator(build, data)
    groups = group_parameters(zs.keys())
    assert set(groups) == {"0", "1", "3"}  # BatchNorm "1" holds weight, bias and its buffers
    res = layerwise_alpha_sweep(zs, ft, evaluate, {"3": groups["3"]}, alphas=(0.0, 0.5, 1.0), splits=("ood",))
    only_head = interpolate_keys(zs, ft, 1.0, groups["3"])
    assert res["3"].loss["ood"][2] == evaluate(only_head, "ood")[0]
    assert res["3"].loss["ood"][0] == evaluate(zs, "ood")[0]
    same = alpha_sweep(
        zs,
        ft,
        evaluate,
        alphas=(0.5,),
        splits=("ood",),
        interpolator=functools.partial(interpolate_keys, keys=groups["3"]),
    )
    assert same.loss["ood"][0] == res["3"].loss["ood"][1]
