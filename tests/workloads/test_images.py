"""Image workloads: CIFAR nets (sizes, shapes), augmentation, label noise, loading from local folders, DTD."""

import pickle

import numpy as np
import pytest
import torch

from flatlab.workloads import build_workload
from flatlab.workloads.cifar_nets import build_cifar_net
from flatlab.workloads.images import auto_augment, holdout_split, random_crop_flip, uniform_label_noise
from flatlab.workloads.sources import DataUnavailable


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize(
    "name, classes, low, high",
    [
        ("resnet18", 100, 11.0e6, 11.4e6),
        ("resnet56", 10, 0.84e6, 0.87e6),  # He et al. 2016: 0.85M
        ("wrn16_8", 10, 10.8e6, 11.1e6),  # Zagoruyko & Komodakis 2016: 11.0M
        ("wrn28_10", 10, 36.3e6, 36.7e6),  # 36.5M
        ("vit_t", 100, 5.2e6, 5.6e6),
        ("vit_s", 100, 21.0e6, 21.8e6),  # ViT-S: about 21M
    ],
)
def test_cifar_nets_have_the_documented_size_and_output_shape(name, classes, low, high):
    torch.manual_seed(0)
    assert low <= n_params(build_cifar_net(name, classes)) <= high
    small = build_cifar_net(name, classes, width_mult=1 / 8).eval()
    assert small(torch.randn(2, 3, 32, 32)).shape == (2, classes)


def test_unknown_cifar_model_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown CIFAR model 'resnet50'; expected one of resnet18, resnet56"):
        build_cifar_net("resnet50", 10)


def test_cifar_workload_model_takes_uint8_and_normalises():
    wl = build_workload("cifar10", model="resnet56", width_mult=0.25)
    torch.manual_seed(0)
    m = wl.build_model().eval()
    x = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    assert torch.allclose(m(x), m(x.float() / 255), atol=1e-5)
    assert all(k.startswith("net.") for k in m.state_dict())  # mean/std are not persistent


# -------------------------------------------------------------------------------------------- noise
def test_label_noise_changes_exactly_the_stated_fraction_never_to_the_same_class():
    y = np.arange(1000) % 100
    noisy, idx = uniform_label_noise(y, 100, 0.2, seed=3)
    changed = np.flatnonzero(noisy != y)
    assert len(idx) == 200 and np.array_equal(changed, idx)  # exactly 20%, all of them really changed
    assert noisy.min() >= 0 and noisy.max() < 100
    again, idx2 = uniform_label_noise(y, 100, 0.2, seed=3)
    assert np.array_equal(again, noisy) and np.array_equal(idx, idx2)  # reproducible
    other, idx3 = uniform_label_noise(y, 100, 0.2, seed=4)
    assert not np.array_equal(idx, idx3)
    # the new class is uniform over the other C-1 (binary case: always the other class)
    b, bi = uniform_label_noise(np.zeros(50, dtype=np.int64), 2, 0.5, seed=0)
    assert len(bi) == 25 and set(b[bi]) == {1}
    with pytest.raises(ValueError, match=r"label noise fraction must be in \[0, 1\], got 1.5"):
        uniform_label_noise(y, 100, 1.5, seed=0)


def test_noisy_cifar100_records_the_noisy_set_and_keeps_val_and_test_clean():
    wl = build_workload("cifar100", data_path="synthetic", synthetic_size=200, label_noise=0.2)
    d = wl.load_data(7)
    idx, clean = d.meta["noisy_indices"], d.meta["clean_train_targets"]
    y = d.train.targets.numpy()
    assert len(idx) == round(0.2 * len(y)) == 40
    assert np.array_equal(np.flatnonzero(y != clean), idx)
    d2 = build_workload("cifar100", data_path="synthetic", synthetic_size=200, label_noise=0.2).load_data(7)
    assert np.array_equal(d2.meta["noisy_indices"], idx) and torch.equal(d2.train.targets, d.train.targets)
    clean_wl = build_workload("cifar100", data_path="synthetic", synthetic_size=200).load_data(7)
    assert torch.equal(clean_wl.val.targets, d.val.targets) and torch.equal(clean_wl.test.targets, d.test.targets)
    assert "noisy_indices" not in clean_wl.meta


def test_holdout_is_exact_stratified_and_disjoint():
    y = np.repeat(np.arange(10), 30)
    tr, va = holdout_split(y, 50, seed=0)
    assert len(va) == 50 and len(tr) == 250 and not set(tr) & set(va)
    assert np.bincount(y[va]).tolist() == [5] * 10
    tr2, va2 = holdout_split(np.arange(30) % 100, 10, seed=0)  # more classes than held-out examples
    assert len(va2) == 10 and len(tr2) == 20


# -------------------------------------------------------------------------------------------- augmentation
def test_crop_flip_draws_only_from_the_generator_and_shifts_within_the_padding():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.int64).reshape(2, 3, 8, 8).to(torch.uint8)
    state = torch.get_rng_state()
    a = random_crop_flip(x, torch.Generator().manual_seed(5), pad=2)
    b = random_crop_flip(x, torch.Generator().manual_seed(5), pad=2)
    assert torch.equal(a, b) and a.shape == x.shape and a.dtype == torch.uint8
    assert torch.equal(torch.get_rng_state(), state)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(2):  # every output is some window of the padded image, possibly flipped
        windows = [padded[i, :, r : r + 8, c : c + 8] for r in range(5) for c in range(5)]
        assert any(torch.equal(a[i], w) or torch.equal(a[i], w.flip(-1)) for w in windows)
    assert torch.equal(random_crop_flip(x, torch.Generator(), pad=0, flip=False), x)


def test_autoaugment_is_a_function_of_the_generator_and_leaves_global_rng_alone():
    x = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    state = torch.get_rng_state()
    a = auto_augment(x, torch.Generator().manual_seed(1))
    b = auto_augment(x, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == x.shape and a.dtype == torch.uint8
    assert torch.equal(torch.get_rng_state(), state)
    wl = build_workload("cifar100", augment="autoaugment")
    assert wl.augment(x, torch.Generator().manual_seed(2)).shape == x.shape
    assert torch.equal(build_workload("cifar10", augment="none").augment(x, torch.Generator()), x)


# -------------------------------------------------------------------------------------------- loading
@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_loads_a_local_save_to_disk_folder(name, cifar_dirs):
    d = build_workload(name, data_path=cifar_dirs[name], val_size=10).load_data(0)
    assert d.train.inputs.dtype == torch.uint8 and d.train.inputs.shape == (50, 3, 32, 32)
    assert len(d.val) == 10 and len(d.test) == 20
    assert d.meta["source"] == cifar_dirs[name]
    import datasets

    raw = datasets.load_from_disk(cifar_dirs[name])["test"]
    first = np.asarray(raw[0]["img"], dtype=np.uint8).transpose(2, 0, 1)
    assert np.array_equal(d.test.inputs[0].numpy(), first)  # HWC arrays -> CHW, untouched


def test_missing_data_names_the_parameter_and_the_offline_fix(tmp_path):
    with pytest.raises(
        DataUnavailable,
        match=r"data_path='.*nope' does not exist\. To run offline.*save_to_disk\(DIR\).*'data_path': DIR",
    ):
        build_workload("cifar10", data_path=str(tmp_path / "nope")).load_data(0)
    with pytest.raises(
        DataUnavailable,
        match=r"data_path is not set and the hub dataset 'flatlab-test/no-such-dataset' could not be loaded.*synthetic",
    ):
        build_workload("cifar100", hub_name="flatlab-test/no-such-dataset").load_data(0)


def test_dtd_resizes_mixed_size_images_and_builds_a_timm_vit(tmp_path):
    import datasets

    rng = np.random.default_rng(0)
    imgs = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in ((40, 50), (36, 36), (64, 48))] * 16
    labels = [i % 47 for i in range(len(imgs))]
    ds = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(
                {"image": [datasets.Image().encode_example(i) for i in imgs], "label": labels},
                features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}),
            ),
            "test": datasets.Dataset.from_dict(
                {"image": [datasets.Image().encode_example(i) for i in imgs[:6]], "label": labels[:6]},
                features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")}),
            ),
        }
    )
    ds.save_to_disk(str(tmp_path / "dtd"))
    wl = build_workload(
        "dtd",
        data_path=str(tmp_path / "dtd"),
        image_size=32,
        val_size=8,
        model="vit_tiny_patch16_224",
        pretrained=False,
    )
    d = wl.load_data(0)
    assert d.train.inputs.shape == (40, 3, 32, 32) and len(d.val) == 8 and d.test.inputs.shape == (6, 3, 32, 32)
    torch.manual_seed(0)
    m = wl.build_model().eval()
    assert m(d.test.inputs).shape == (6, 47)


def test_dtd_pretrained_without_weights_offline_says_how_to_provide_them():
    from flatlab.errors import ConfigError

    wl = build_workload("dtd", model="vit_tiny_patch16_224", pretrained=True, image_size=32)
    with pytest.raises(
        ConfigError, match=r"could not load pretrained weights for model='vit_tiny_patch16_224'.*weights_path"
    ):
        wl.build_model()


def test_cifar_data_pickles_compactly():
    d = build_workload("cifar10", data_path="synthetic", synthetic_size=64).load_data(0)
    assert len(pickle.dumps(d)) < 1.3 * (64 + 32) * 3 * 32 * 32  # uint8, not float32
