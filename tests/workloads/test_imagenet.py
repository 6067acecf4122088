"""The ``imagenet`` workload: synthetic and ImageFolder sources streamed lazily, the evaluation transform,
RandomResizedCrop + flip drawn from the trainer's generator, torchvision's ResNet-50."""

import math
import pickle

import numpy as np
import pytest
import torch

from flatlab.errors import ConfigError
from flatlab.workloads import build_workload
from flatlab.workloads.imagenet import ImageNet, center_crop, pixel_steps, random_resized_crop, resized_crop_params
from flatlab.workloads.lazy_images import LazyImages

SMOKE = dict(ImageNet.smoke_params)


def test_synthetic_splits_are_lazy_with_the_right_shapes_and_disjoint():
    wl = build_workload("imagenet", **SMOKE)  # 16 train + 4 held out, 4 test, 4 classes, 40 px -> 36 stored, 32 eval
    d = wl.load_data(0)
    assert isinstance(d.train.inputs, LazyImages) and isinstance(d.val.inputs, LazyImages)
    assert tuple(d.train.inputs.shape) == (16, 3, 36, 36)
    assert tuple(d.val.inputs.shape) == (4, 3, 32, 32) and tuple(d.test.inputs.shape) == (4, 3, 32, 32)
    assert set(d.train.inputs.items.tolist()).isdisjoint(d.val.inputs.items.tolist())
    assert set(d.test.inputs.items.tolist()) == {20, 21, 22, 23}  # generated after the training pool
    assert sorted(d.val.targets.tolist()) == [0, 1, 2, 3]  # stratified: one per class
    assert d.meta["val_size"] == 4 and d.meta["source"] == "synthetic"
    x = d.train.inputs[torch.tensor([0, 3])]
    assert x.dtype == torch.uint8 and x.shape == (2, 3, 36, 36)
    # the reader pickles without pixels and decodes the same rows again
    again = pickle.loads(pickle.dumps(d.train.inputs))
    assert torch.equal(again[torch.tensor([0, 3])], x)
    no_val = build_workload("imagenet", **{**SMOKE, "val_size": 0}).load_data(0)
    assert no_val.val is no_val.test and len(no_val.train) == 16


def test_crop_params_stay_in_the_image_and_follow_the_scale_and_ratio_ranges():
    g = torch.Generator().manual_seed(0)
    boxes = resized_crop_params(2000, 256, 256, g)
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 256).all() and (left + w <= 256).all()
    frac = (h * w).double() / 256**2
    assert frac.min() >= 0.07 and frac.max() <= 1.0  # U(0.08, 1) up to rounding of the sides
    # the same distribution as torchvision's RandomResizedCrop.get_params (boxes that do not fit are redrawn,
    # which favours small areas on a square image: mean ~0.48, not E[U(0.08, 1)] = 0.54)
    from torchvision.transforms import RandomResizedCrop

    torch.manual_seed(0)
    img = torch.zeros(3, 256, 256)
    ref = torch.tensor(
        [RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3])[2:] for _ in range(2000)]
    ).double()
    ref_frac = ref.prod(dim=1) / 256**2
    assert frac.mean() == pytest.approx(float(ref_frac.mean()), abs=0.025)  # 3 standard errors of the difference
    assert (frac > 0.5).double().mean() == pytest.approx(float((ref_frac > 0.5).double().mean()), abs=0.05)
    ratio = w.double() / h.double()
    assert ratio.min() >= 0.74 and ratio.max() <= 1.35
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(resized_crop_params(7, 40, 30, g1), resized_crop_params(7, 40, 30, g2))


def test_crop_params_fallback_is_the_centred_box_with_the_ratio_clamped():
    g = torch.Generator().manual_seed(0)
    # an area fraction of 2 never fits: torchvision's fallback, a centred box of clamped aspect ratio
    assert resized_crop_params(1, 10, 40, g, scale=(2.0, 2.0)).tolist() == [[0, 13, 10, 13]]  # 40/10 > 4/3 -> 13 x 10
    assert resized_crop_params(1, 40, 40, g, scale=(2.0, 2.0)).tolist() == [[0, 0, 40, 40]]  # ratio 1: the whole image


def test_random_resized_crop_is_determined_by_the_generator():
    x = torch.randint(0, 256, (6, 3, 36, 36), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    a = random_resized_crop(x, torch.Generator().manual_seed(3), 32)
    b = random_resized_crop(x, torch.Generator().manual_seed(3), 32)
    c = random_resized_crop(x, torch.Generator().manual_seed(4), 32)
    assert a.shape == (6, 3, 32, 32) and a.dtype == torch.uint8
    assert torch.equal(a, b) and not torch.equal(a, c)
    wl = build_workload("imagenet", **SMOKE)
    assert torch.equal(wl.augment(x, torch.Generator().manual_seed(3)), a)
    assert torch.equal(
        build_workload("imagenet", **{**SMOKE, "augment": "none"}).augment(x, torch.Generator()), x[:, :, 2:34, 2:34]
    )


def test_full_box_crop_is_the_resized_image_or_its_mirror():
    from torchvision.transforms.v2 import functional as TF

    x = torch.randint(0, 256, (8, 3, 20, 20), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    whole = torch.stack([TF.resize(im, [16, 16], antialias=True) for im in x])
    g = torch.Generator().manual_seed(0)
    out = random_resized_crop(x, g, 16, flip=False, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert torch.equal(out, whole)
    flipped = random_resized_crop(x, torch.Generator().manual_seed(0), 16, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    mirrored = [torch.equal(f, w.flip(-1)) and not torch.equal(f, w) for f, w in zip(flipped, whole)]
    assert all(torch.equal(f, w) or m for f, w, m in zip(flipped, whole, mirrored)) and 0 < sum(mirrored) < 8


def test_eval_transform_resizes_the_shorter_side_then_centre_crops():
    from PIL import Image

    arr = np.zeros((256, 512, 3), dtype=np.uint8)  # height 256 (already the shorter side: no resampling)
    arr[:, :256, 0] = 255  # left half red
    arr[:, 256:, 2] = 255  # right half blue
    out = pixel_steps(256, 224)(Image.fromarray(arr))
    assert out.shape == (3, 224, 224) and out.dtype == torch.uint8
    # the centre crop keeps columns 144..367: the halves meet at output column 112
    assert (out[0, :, :112] == 255).all() and (out[2, :, :112] == 0).all()
    assert (out[2, :, 112:] == 255).all() and (out[0, :, 112:] == 0).all()
    small = pixel_steps(36, 32)(Image.fromarray(np.full((40, 60, 3), 77, dtype=np.uint8)))
    assert small.shape == (3, 32, 32) and (small == 77).all()
    assert torch.equal(center_crop(torch.arange(36.0).expand(1, 1, 36, 36), 32)[0, 0, 0], torch.arange(2.0, 34.0))


def _write_folder(root, split, classes, n, size):
    from PIL import Image

    colours = {"n01_red": (200, 10, 10), "n02_blue": (10, 10, 200), "n03_green": (10, 200, 10)}
    for c in classes:
        (root / split / c).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(np.full((size[1], size[0], 3), colours[c], dtype=np.uint8)).save(
                root / split / c / f"{i}.png"
            )


def test_image_folder_source(tmp_path):
    _write_folder(tmp_path, "train", ["n01_red", "n02_blue"], 4, (50, 40))
    _write_folder(tmp_path, "val", ["n02_blue"], 3, (30, 45))  # a class missing from val: matched by name
    wl = build_workload("imagenet", data_path=str(tmp_path), num_classes=2, val_size=2, crop_size=32, resize_size=36)
    d = wl.load_data(0)
    assert len(d.train) == 6 and len(d.val) == 2 and len(d.test) == 3
    assert tuple(d.train.inputs.shape) == (6, 3, 36, 36) and tuple(d.test.inputs.shape) == (3, 3, 32, 32)
    assert d.test.targets.tolist() == [1, 1, 1]
    assert sorted(d.val.targets.tolist()) == [0, 1]
    for split in (d.train, d.val, d.test):
        x = split.inputs[torch.arange(len(split))].float()
        red = x[:, 0].mean(dim=(1, 2)) > x[:, 2].mean(dim=(1, 2))
        assert red.tolist() == (split.targets == 0).tolist()  # labels = sorted folder names, pixels follow them


def test_bad_sources_and_sizes_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"data_path=.* is neither a folder with train/ and val/ image folders"):
        build_workload("imagenet", data_path=str(tmp_path)).load_data(0)
    with pytest.raises(ConfigError, match=r"crop_size=300 must not exceed resize_size=256"):
        build_workload("imagenet", crop_size=300)
    with pytest.raises(ConfigError, match=r"model='vit' is not allowed; expected one of 'resnet50', 'resnet18'"):
        build_workload("imagenet", model="vit")
    folder = tmp_path / "three"
    _write_folder(folder, "train", ["n01_red", "n02_blue", "n03_green"], 1, (8, 8))
    _write_folder(folder, "val", ["n01_red"], 1, (8, 8))
    with pytest.raises(ConfigError, match=r"train labels must lie in \[0, num_classes=2\), got \[0, 2\]"):
        build_workload(
            "imagenet", data_path=str(folder), num_classes=2, val_size=0, crop_size=8, resize_size=8
        ).load_data(0)


def test_resnet50_is_torchvisions_with_1000_classes_and_normalises_inside():
    wl = build_workload("imagenet")
    model = wl.build_model()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision's ResNet-50
    assert model.mean.flatten().tolist() == pytest.approx([0.485, 0.456, 0.406])
    model.eval()
    x = torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8)
    with torch.no_grad():
        out = model(x)
        ref = model.net((x.float() / 255 - model.mean) / model.std)
    assert out.shape == (2, 1000) and torch.allclose(out, ref)
    assert math.isfinite(float(out.sum()))


def test_vit_s16_is_timms_with_16_pixel_patches_and_no_download():
    model = build_workload("imagenet", model="vit_small_patch16_224").build_model()
    net = model.net
    # ViT-S/16 at 1000 classes: 22,050,664 parameters (width 384, depth 12, 6 heads, 196 patches + class token)
    assert sum(p.numel() for p in model.parameters()) == 22_050_664
    assert net.patch_embed.patch_size == (16, 16) and net.embed_dim == 384 and len(net.blocks) == 12
    assert net.pos_embed.shape == (1, 197, 384)
    tiny = build_workload("imagenet", **{**SMOKE, "model": "test_vit"}).build_model().eval()
    with torch.no_grad():
        assert tiny(torch.zeros(2, 3, 32, 32, dtype=torch.uint8)).shape == (2, 4)
    with pytest.raises(ConfigError, match=r"model='test_vit' cuts 16 x 16 patches; crop_size=24 must be a multiple"):
        build_workload("imagenet", **{**SMOKE, "model": "test_vit", "crop_size": 24})


def test_mixup_blends_images_and_one_hot_targets_with_the_mirrored_row():
    from flatlab.workloads.mixup import mix_batch

    x = torch.tensor([0, 51, 102, 255], dtype=torch.uint8).view(4, 1, 1, 1).expand(4, 3, 2, 2)
    y = torch.tensor([0, 2, 1, 2])
    xm, ym = mix_batch(x, y, num_classes=3, lam=0.7)
    # row 0 with row 3: 0.7 * 0/255 + 0.3 * 255/255 = 0.3; row 1 with row 2: 0.7 * 0.2 + 0.3 * 0.4 = 0.26
    assert xm[:, 0, 0, 0].tolist() == pytest.approx([0.3, 0.26, 0.34, 0.7])
    # soft targets by hand: row 0 = 0.7 e0 + 0.3 e2; row 1 = 0.7 e2 + 0.3 e1; row 2 = 0.7 e1 + 0.3 e2;
    # row 3 = 0.7 e2 + 0.3 e0
    want = torch.tensor([[0.7, 0, 0.3], [0, 0.3, 0.7], [0, 0.7, 0.3], [0.3, 0, 0.7]])
    assert torch.allclose(ym, want)
    # the loss against soft targets: -sum_k y_k log softmax(z)_k, smoothing applied to the mixed targets
    z = torch.tensor([[2.0, 0.0, -1.0]] * 4)
    wl = build_workload("imagenet", **SMOKE)
    logp = torch.log_softmax(z, -1)
    assert float(wl.loss(z, ym)) == pytest.approx(float(-(ym * logp).sum(-1).mean()))
    smoothed = 0.9 * ym + 0.1 / 3
    assert float(wl.loss(z, ym, 0.1)) == pytest.approx(float(-(smoothed * logp).sum(-1).mean()))
    assert wl.batch_stats(z, ym)[0] == 1  # only row 0's largest weight (class 0) is the prediction
    with pytest.raises(ConfigError, match=r"mixup lambda must lie in \[0, 1\]; got 1.5"):
        mix_batch(x, y, 3, 1.5)


def test_mixup_lambda_is_beta_distributed_and_drawn_from_the_generator():
    from scipy import stats

    from flatlab.workloads.mixup import mixup_lambda

    g = torch.Generator().manual_seed(0)
    lams = [mixup_lambda(g, 0.2) for _ in range(2000)]
    assert stats.kstest(lams, stats.beta(0.2, 0.2).cdf).pvalue > 0.01
    assert mixup_lambda(torch.Generator().manual_seed(3), 0.8) == mixup_lambda(torch.Generator().manual_seed(3), 0.8)
    with pytest.raises(ConfigError, match=r"mixup alpha must be a finite number > 0; got 0"):
        mixup_lambda(g, 0)


def test_workload_mix_is_off_by_default_and_mixes_with_mixup_alpha():
    x = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    y = torch.tensor([0, 1, 2, 3])
    g = torch.Generator().manual_seed(0)
    same = build_workload("imagenet", **SMOKE).mix(x, y, g)
    assert same[0] is x and same[1] is y
    xm, ym = build_workload("imagenet", **{**SMOKE, "mixup_alpha": 0.2}).mix(x, y, torch.Generator().manual_seed(0))
    from flatlab.workloads.mixup import mix_batch, mixup_lambda

    lam = mixup_lambda(torch.Generator().manual_seed(0), 0.2)
    ref_x, ref_y = mix_batch(x, y, 4, lam)
    assert torch.equal(xm, ref_x) and torch.equal(ym, ref_y) and ym.sum(-1).tolist() == pytest.approx([1.0] * 4)


def test_randaug_changes_training_batches_only_and_evaluation_sees_the_centre_crop():
    from flatlab.workloads.clip_augment import rand_augment

    plain = build_workload("imagenet", **SMOKE)
    ra = build_workload("imagenet", **{**SMOKE, "augment": "randaug", "randaug_magnitude": 15, "mixup_alpha": 0.2})
    d_plain, d_ra = plain.load_data(0), ra.load_data(0)
    rows = torch.arange(4)
    for split in ("val", "test"):  # evaluation inputs: the same centre crops, whatever the training augmentation
        assert torch.equal(getattr(d_plain, split).inputs[rows], getattr(d_ra, split).inputs[rows])
    batch = d_ra.train.inputs[torch.arange(8)]
    got = ra.augment(batch, torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(1)
    ref = rand_augment(random_resized_crop(batch, g, 32), g, n_ops=2, magnitude=15)  # crop + flip, then RandAugment
    assert torch.equal(got, ref) and not torch.equal(got, plain.augment(batch, torch.Generator().manual_seed(1)))
    torch.manual_seed(0)
    model = plain.build_model()
    assert plain.evaluate(model, d_plain.val) == ra.evaluate(model, d_ra.val)  # no augmentation, no mixing


def test_trainer_mixes_every_training_batch_and_admire_trains_the_smoke_vit(monkeypatch):
    from flatlab.train.trainer import Trainer, TrialSpec

    seen = []
    original = ImageNet.mix

    def spy(self, x, y, generator):
        out = original(self, x, y, generator)
        seen.append((tuple(out[0].shape), out[1].dtype, tuple(out[1].shape)))
        return out

    monkeypatch.setattr(ImageNet, "mix", spy)
    wp = {**SMOKE, "model": "test_vit", "augment": "randaug", "mixup_alpha": 0.2}
    spec = TrialSpec(
        workload="imagenet",
        optimizer="adamw_ire",
        epochs=1,
        workload_params=wp,
        optimizer_params={"lr": 1e-3, "gamma": 0.9, "kappa": 20.0},
        trainer_params={"batch_size": 8, "micro_batch_size": 4, "clip_norm": 1.0},
    )
    metrics = Trainer(spec, build_workload("imagenet", **wp).load_data(0)).run_epoch()
    # 16 training images in batches of 8: two mixed batches of soft (8, 4) targets; evaluation is never mixed
    assert seen == [((8, 3, 32, 32), torch.float32, (8, 4))] * 2
    assert math.isfinite(metrics["train/loss"]) and 0 <= metrics["val/accuracy"] <= 1
