"""interpolate / interpolate_keys: exact ends, midpoint, integer buffers, mismatch errors."""

from __future__ import annotations

import pytest
import torch

from flatlab.errors import ConfigError
from flatlab.interpolation import check_compatible, interpolate, interpolate_keys


def test_alpha_zero_one_and_half(pair):
    zs, ft, _ = pair
    zs_copy = {k: v.clone() for k, v in zs.items()}
    at0, at1, mid = interpolate(zs, ft, 0.0), interpolate(zs, ft, 1.0), interpolate(zs, ft, 0.5)
    assert list(at0) == list(zs)
    for k in zs:
        assert torch.equal(at0[k], zs[k]) and torch.equal(at1[k], ft[k])  # alpha: the weight on the fine-tuned model
        if zs[k].is_floating_point():
            assert torch.allclose(mid[k], (zs[k] + ft[k]) / 2, rtol=0, atol=1e-6)
            assert at0[k].data_ptr() != zs[k].data_ptr()  # fresh copies
        else:  # num_batches_tracked: from the nearer end; the tie at 0.5 goes to the fine-tuned model
            assert zs[k].dtype == torch.int64 and mid[k].dtype == torch.int64
            assert torch.equal(mid[k], ft[k])
    assert not torch.equal(zs["0.weight"], ft["0.weight"])
    for k in zs:  # inputs untouched
        assert torch.equal(zs[k], zs_copy[k])
    quarter = interpolate(zs, ft, 0.25)
    assert torch.allclose(quarter["3.bias"], 0.75 * zs["3.bias"] + 0.25 * ft["3.bias"], atol=1e-7)


@pytest.mark.parametrize("alpha,end", [(0.0, "zs"), (1.0, "ft")])
def test_ends_are_exact_copies_of_every_entry(pair, alpha, end):
    zs, ft, _ = pair
    expected = zs if end == "zs" else ft
    out = interpolate(zs, ft, alpha)
    assert list(out) == list(expected)
    ints = [k for k in zs if not zs[k].is_floating_point()]
    assert ints == ["1.num_batches_tracked"] and int(zs[ints[0]]) != int(ft[ints[0]])  # the ends differ there
    for k, v in expected.items():  # floats and integer buffers alike: same dtype, same bits
        assert out[k].dtype == v.dtype and torch.equal(out[k], v), k


@pytest.mark.parametrize(
    "alpha,end", [(0.25, "zs"), (0.4999, "zs"), (0.5, "ft"), (0.75, "ft"), (-0.5, "zs"), (1.5, "ft")]
)
def test_integer_buffers_come_from_the_nearer_end(pair, alpha, end):
    zs, ft, _ = pair
    out = interpolate(zs, ft, alpha)
    src = zs if end == "zs" else ft
    assert torch.equal(out["1.num_batches_tracked"], src["1.num_batches_tracked"])
    layer = interpolate_keys(zs, ft, alpha, ["1.num_batches_tracked", "1.weight"])
    assert torch.equal(layer["1.num_batches_tracked"], src["1.num_batches_tracked"])


def test_layerwise_interpolation_changes_only_the_given_keys(pair):
    zs, ft, _ = pair
    keys = ["3.weight", "3.bias"]
    out = interpolate_keys(zs, ft, 1.0, keys)
    for k in zs:
        assert torch.equal(out[k], ft[k] if k in keys else zs[k]), k
    half = interpolate_keys(zs, ft, 0.5, keys)
    assert torch.allclose(half["3.weight"], (zs["3.weight"] + ft["3.weight"]) / 2, atol=1e-7)
    assert torch.equal(half["0.weight"], zs["0.weight"])
    with pytest.raises(ConfigError, match=r"key 'head.weight' is not in the state dicts"):
        interpolate_keys(zs, ft, 0.5, ["head.weight"])


def test_mismatches_name_the_first_offending_key(pair):
    zs, ft, _ = pair
    missing = {k: v for k, v in ft.items() if k != "1.running_var"}
    with pytest.raises(
        ConfigError, match=r"key '1.running_var' is in the zero-shot state dict but not in the fine-tuned"
    ):
        interpolate(zs, missing, 0.5)
    extra = dict(ft, **{"head.bias": torch.zeros(3)})
    with pytest.raises(ConfigError, match=r"key 'head.bias' is in the fine-tuned state dict but not in the zero-shot"):
        interpolate(zs, extra, 0.5)
    shape = dict(ft, **{"3.weight": torch.zeros(3, 9)})
    with pytest.raises(ConfigError, match=r"differ at key '3.weight': shape \(3, 8\) \(zero-shot\) vs \(3, 9\)"):
        interpolate(zs, shape, 0.5)
    dtype = dict(ft, **{"0.bias": ft["0.bias"].double()})
    with pytest.raises(
        ConfigError, match=r"differ at key '0.bias': dtype torch.float32 \(zero-shot\) vs torch.float64"
    ):
        check_compatible(zs, dtype)
    with pytest.raises(ConfigError, match=r"alpha must be a finite number"):
        interpolate(zs, ft, float("nan"))
