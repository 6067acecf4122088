"""Batched uint8 augmentations: reproducible from the generator alone, shapes kept, reference semantics."""

from __future__ import annotations

import pytest
import torch

from flatlab.errors import ConfigError
from flatlab.workloads.clip_augment import RANDAUG_OPS, _apply_op, _equalize, augment_batch, flip_crop, rand_augment


def images(n=6, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, 3, size, size, generator=g) * 255).to(torch.uint8)


@pytest.mark.parametrize("kind", ["flip-crop", "randaug"])
def test_same_generator_state_same_batch(kind):
    x = images()
    outs = [augment_batch(x, kind, torch.Generator().manual_seed(7)) for _ in range(2)]
    other = augment_batch(x, kind, torch.Generator().manual_seed(8))
    assert outs[0].dtype == torch.uint8 and outs[0].shape == x.shape
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], other) and not torch.equal(outs[0], x)


def test_none_is_identity_and_draws_nothing():
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    x = images()
    assert augment_batch(x, "none", g) is x and torch.equal(g.get_state(), state)


def test_flip_crop_full_area_is_a_flip_or_the_image():
    x = images(n=32)
    out = flip_crop(x, torch.Generator().manual_seed(0), scale_min=1.0)
    # area 1 and aspect ratio near 1: the crop is (almost) the whole image, so each image is itself or mirrored
    d_same = (out.float() - x.float()).abs().mean(dim=(1, 2, 3))
    d_flip = (out.float() - x.flip(-1).float()).abs().mean(dim=(1, 2, 3))
    closest = torch.minimum(d_same, d_flip)
    assert (d_flip < d_same).any() and (d_same < d_flip).any()
    assert float(closest.median()) < float(torch.maximum(d_same, d_flip).median()) / 2


def test_randaug_ops_match_reference_semantics():
    import torchvision.transforms.v2.functional as TF

    x = images(n=4, size=12)
    one = torch.ones(4)
    torch.testing.assert_close(_equalize(x), TF.equalize(x), atol=0, rtol=0)
    torch.testing.assert_close(_apply_op(x, "posterize", 0.3, one), TF.posterize(x, 7), atol=0, rtol=0)
    torch.testing.assert_close(_apply_op(x, "solarize", 0.3, one), TF.solarize(x, 178.5), atol=0, rtol=0)
    for op, ref in (
        ("brightness", TF.adjust_brightness),
        ("contrast", TF.adjust_contrast),
        ("color", TF.adjust_saturation),
    ):
        diff = (_apply_op(x, op, 0.3, one).int() - ref(x, 1.27).int()).abs().max()
        assert diff <= 1, op  # rounding vs truncation
    for op in RANDAUG_OPS:
        out = _apply_op(x, op, 0.5, -one)
        assert out.dtype == torch.uint8 and out.shape == x.shape, op


def test_rand_augment_zero_ops_is_identity_and_errors():
    x = images()
    assert torch.equal(rand_augment(x, torch.Generator(), n_ops=0), x)
    with pytest.raises(ConfigError, match=r"magnitude must be in \[0, 30\]; got 31"):
        rand_augment(x, torch.Generator(), magnitude=31)
    with pytest.raises(ConfigError, match=r"expect uint8 images \(B, 3, S, S\); got torch.float32"):
        flip_crop(x.float(), torch.Generator())
    with pytest.raises(ConfigError, match=r"augment='mixup' is not allowed; expected one of none, flip-crop, randaug"):
        augment_batch(x, "mixup", torch.Generator())
