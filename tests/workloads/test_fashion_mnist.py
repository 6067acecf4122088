"""The ``fashion_mnist`` workload: the IDX reader, its sources, its splits, DeepOBS's models.

Everything but the ``real`` tests runs on IDX files that the tests write (``tmp_path``). The ``real``
tests read Debian's folder (package ``dataset-fashion-mnist``, ``make data``); they skip when it is
missing, except under ``FLATLAB_REQUIRE_FMNIST=1`` (``.ci/run``), where a missing folder fails.
"""

import gzip
import math
import os
import re
import struct
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from flatlab.errors import ConfigError
from flatlab.workloads import build_workload
from flatlab.workloads import fashion_mnist as fm
from flatlab.workloads.fmnist_nets import DeepOBS2C2D, DeepOBSMLP, SmallCNN
from flatlab.workloads.idx import IdxFormatError, read_idx, read_idx_pair
from flatlab.workloads.sources import DataUnavailable

# ---------------------------------------------------------------- IDX files written by hand


def idx_bytes(arr: np.ndarray, type_code: int = 0x08) -> bytes:
    """An IDX file's bytes: magic 0x0000 <type> <ndim>, big-endian uint32 sizes, then the data."""
    header = bytes([0, 0, type_code, arr.ndim]) + b"".join(struct.pack(">I", s) for s in arr.shape)
    return header + arr.astype(">u1" if type_code == 0x08 else arr.dtype).tobytes()


def write_idx(path, arr, gz=True, type_code=0x08):
    data = idx_bytes(arr, type_code)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def synthetic_split(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    y = (np.arange(n) % 10).astype(np.uint8)
    rng.shuffle(y)
    return x, y


def write_folder(folder, n_train=200, n_test=50, gz=True):
    """The four IDX files of a small Fashion-MNIST look-alike; returns the arrays written."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for split, n, seed in (("train", n_train, 1), ("test", n_test, 2)):
        x, y = synthetic_split(n, seed)
        images, labels = fm.IDX_FILES[split]
        suffix = ".gz" if gz else ""
        write_idx(folder / (images + suffix), x, gz)
        write_idx(folder / (labels + suffix), y, gz)
        arrays[split] = (x, y)
    return arrays


# ---------------------------------------------------------------- the reader


@pytest.mark.parametrize("gz", [True, False])
def test_idx_files_round_trip(tmp_path, gz):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(7, 5, 4), dtype=np.uint8)  # rows != cols: the order of the sizes shows
    y = np.array([9, 0, 0, 3, 0, 2, 7], dtype=np.uint8)
    xi = write_idx(tmp_path / "img", x, gz)  # no .gz suffix: gzip is recognised by its magic bytes
    yi = write_idx(tmp_path / "lab.gz" if gz else tmp_path / "lab", y, gz)
    got = read_idx(xi, ndim=3)
    assert got.dtype == np.uint8 and got.shape == (7, 5, 4) and np.array_equal(got, x)
    gx, gy = read_idx_pair(xi, yi, image_shape=(5, 4), num_classes=10)
    assert np.array_equal(gx, x) and gy.dtype == np.int64 and gy.tolist() == [9, 0, 0, 3, 0, 2, 7]
    # other element types: big-endian int32 becomes native
    z = np.array([[1, -2], [70000, 3]], dtype=np.int32)
    zi = write_idx(tmp_path / "z", z.astype(">i4"), gz, type_code=0x0C)
    got = read_idx(zi, ndim=2, type_code=0x0C)
    assert got.dtype == np.dtype("int32") and got.tolist() == [[1, -2], [70000, 3]]


def _corrupt(tmp_path, kind):
    x, y = synthetic_split(7, 0)
    img, lab = tmp_path / "train-images-idx3-ubyte", tmp_path / "train-labels-idx1-ubyte"
    write_idx(img, x, gz=False)
    write_idx(lab, y, gz=False)
    if kind == "magic":
        raw = bytearray(img.read_bytes())
        raw[3] = 4  # 4 dimensions announced
        img.write_bytes(bytes(raw))
        return img, r"wrong magic number 0x00000804, expected 0x00000803"
    if kind == "labels_as_images":
        img.write_bytes(lab.read_bytes())
        return img, r"wrong magic number 0x00000801, expected 0x00000803"
    if kind == "not_idx":
        img.write_bytes(b"<html>not found</html>")
        return img, r"wrong magic number 0x3C68746D"
    if kind == "truncated_body":
        img.write_bytes(img.read_bytes()[:-100])
        return (
            img,
            rf"truncated, {7 * 784 - 100} bytes of data after the header, {7 * 784} announced by its sizes 7x28x28",
        )
    if kind == "too_long":
        lab.write_bytes(lab.read_bytes() + b"\0")
        return lab, r"too long, 8 bytes of data after the header, 7 announced"
    if kind == "truncated_header":
        img.write_bytes(img.read_bytes()[:10])
        return img, r"truncated header, 10 bytes, 16 needed"
    if kind == "truncated_gzip":
        img.write_bytes(gzip.compress(img.read_bytes())[:-20])
        return img, r"broken gzip stream"
    if kind == "counts":
        write_idx(lab, y[:6], gz=False)
        return img, rf"IDX files disagree: {re.escape(str(img))} holds 7 images, {re.escape(str(lab))} holds 6 labels"
    if kind == "dims":
        write_idx(img, np.zeros((7, 27, 28), np.uint8), gz=False)
        return img, r"images of 27x28 pixels, expected 28x28"
    if kind == "label_range":
        write_idx(lab, np.full(7, 10, np.uint8), gz=False)
        return lab, r"label 10 outside \[0, 10\)"
    raise AssertionError(kind)


CORRUPTIONS = (
    "magic",
    "labels_as_images",
    "not_idx",
    "truncated_body",
    "too_long",
    "truncated_header",
    "truncated_gzip",
    "counts",
    "dims",
    "label_range",
)


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_a_corrupt_file_is_one_error_naming_it(tmp_path, kind):
    bad, msg = _corrupt(tmp_path, kind)
    with pytest.raises(IdxFormatError, match=re.escape(str(bad))) as info:
        read_idx_pair(tmp_path / "train-images-idx3-ubyte", tmp_path / "train-labels-idx1-ubyte", (28, 28), 10)
    assert re.search(msg, str(info.value)), str(info.value)
    assert isinstance(info.value, DataUnavailable) and isinstance(
        info.value, ConfigError
    )  # flatlab run prints it in one line


def test_a_corrupt_file_in_a_folder_fails_load_data_naming_it(tmp_path):
    write_folder(tmp_path / "d")
    bad = tmp_path / "d" / "t10k-labels-idx1-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:-5])
    wl = build_workload("fashion_mnist", data_path=str(tmp_path / "d"), val_size=20)
    with pytest.raises(IdxFormatError, match=rf"IDX file {re.escape(str(bad))}: broken gzip stream"):
        wl.load_data(0)


# ---------------------------------------------------------------- sources


def test_debians_folder_is_found_by_default(tmp_path, monkeypatch):
    arrays = write_folder(tmp_path / "debian")
    monkeypatch.setattr(fm, "DEBIAN_DIR", tmp_path / "debian")
    wl = build_workload("fashion_mnist", val_size=20)
    wl.check_data()
    data = wl.load_data(0)
    assert data.meta["source"] == str(tmp_path / "debian")
    assert (len(data.train), len(data.val), len(data.test)) == (180, 20, 50)
    x_te, y_te = arrays["test"]  # the official test split, in its order, as (N, 1, 28, 28) uint8
    assert data.test.inputs.dtype == torch.uint8 and data.test.inputs.shape == (50, 1, 28, 28)
    assert np.array_equal(data.test.inputs[:, 0].numpy(), x_te) and data.test.targets.tolist() == y_te.tolist()


@pytest.mark.parametrize("gz", [True, False])
def test_a_folder_of_idx_files_plain_or_gz(tmp_path, gz):
    arrays = write_folder(tmp_path / "f", gz=gz)
    data = build_workload("fashion_mnist", data_path=str(tmp_path / "f"), val_size=0).load_data(3)
    x, y = arrays["train"]  # val_size=0: all of the training split, and val is the test split
    assert len(data.train) == 200 and data.val is data.test
    assert np.array_equal(data.train.inputs[:, 0].numpy(), x) and data.train.targets.tolist() == y.tolist()


def test_a_folder_missing_some_idx_files_names_them(tmp_path):
    write_folder(tmp_path / "f")
    (tmp_path / "f" / "t10k-images-idx3-ubyte.gz").unlink()
    wl = build_workload("fashion_mnist", data_path=str(tmp_path / "f"))
    with pytest.raises(
        DataUnavailable, match=r"holds 3 of the 4 IDX files; missing t10k-images-idx3-ubyte \(.gz or not\)"
    ):
        wl.check_data()


def test_a_save_to_disk_folder(tmp_path):
    import datasets
    from PIL import Image

    splits = {}
    for split, n, seed in (("train", 60, 1), ("test", 20, 2)):
        x, y = synthetic_split(n, seed)
        features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
        splits[split] = datasets.Dataset.from_dict(
            {"image": [Image.fromarray(im, mode="L") for im in x], "label": y.tolist()}, features=features
        )
        splits[split + "_arrays"] = (x, y)
    datasets.DatasetDict({k: v for k, v in splits.items() if not k.endswith("_arrays")}).save_to_disk(
        str(tmp_path / "hf")
    )
    wl = build_workload("fashion_mnist", data_path=str(tmp_path / "hf"), val_size=10)
    wl.check_data()
    data = wl.load_data(0)
    x_te, y_te = splits["test_arrays"]
    assert (len(data.train), len(data.val)) == (50, 10)
    assert np.array_equal(data.test.inputs[:, 0].numpy(), x_te) and data.test.targets.tolist() == y_te.tolist()


HOW_TO = (
    r"sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist",
    "zalando-datasets/fashion_mnist",
    "save_to_disk(DIR)",
    "workload_params={'data_path': DIR}",
    "t10k-labels-idx1-ubyte",
)


def test_an_empty_folder_or_one_without_data_says_how_to_get_the_data(tmp_path):
    (tmp_path / "empty").mkdir()
    wl = build_workload("fashion_mnist", data_path=str(tmp_path / "empty"))
    with pytest.raises(DataUnavailable) as info:
        wl.check_data()
    msg = str(info.value)
    assert f"data_path='{tmp_path / 'empty'}' is an empty folder. Get Fashion-MNIST in one of three ways" in msg
    assert all(h in msg for h in HOW_TO), msg
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "README").write_text("not Fashion-MNIST")
    with pytest.raises(DataUnavailable) as info:
        build_workload("fashion_mnist", data_path=str(tmp_path / "other")).check_data()
    msg = str(info.value)
    assert (
        f"could not read data_path='{tmp_path / 'other'}'" in msg
        and f"{tmp_path / 'other'} holds none of the four IDX files either" in msg
    )
    assert all(h in msg for h in HOW_TO), msg
    with pytest.raises(
        DataUnavailable,
        match=r"data_path='/nonexistent/fmnist' does not exist\. Get Fashion-MNIST in one of three ways",
    ):
        build_workload("fashion_mnist", data_path="/nonexistent/fmnist").check_data()


def test_no_debian_folder_and_no_hub_says_how_to_get_the_data(tmp_path, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'zalando-datasets/fashion_mnist' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(fm, "DEBIAN_DIR", tmp_path / "absent")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    wl = build_workload("fashion_mnist")
    with pytest.raises(DataUnavailable) as info:
        wl.check_data()
    msg = str(info.value)
    assert (
        "data_path is not set and the hub dataset 'zalando-datasets/fashion_mnist' could not be loaded (ConnectionError"
        in msg
    )
    assert f"Debian's folder {tmp_path / 'absent'} does not exist either" in msg
    assert all(h in msg for h in HOW_TO), msg
    with pytest.raises(DataUnavailable, match="does not exist either"):  # load_data fails the same way
        wl.load_data(0)


def _tiny_study(tmp_path, data_path):
    f = tmp_path / "fm_study.py"
    f.write_text(
        "from flatlab import Arm, Study\nfrom flatlab import space as sp\n"
        f"STUDY = Study(name='fm_missing', workload='fashion_mnist', workload_params={{'data_path': {data_path!r}}},\n"
        "    arms=(Arm('sgd', space={'lr': sp.loguniform(1e-3, 1.0)}),), metric='val/accuracy', mode='max',\n"
        "    num_trials=1, max_epochs=1, seed=0)\n"
    )
    return f


def test_flatlab_run_with_missing_data_fails_in_one_line_before_ray_starts(tmp_path, monkeypatch):
    import flatlab.study.runner as runner
    from flatlab.cli.main import app

    def not_reached(*args, **kwargs):
        raise AssertionError("the CLI checks the data before it calls run_study")

    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "run_study", not_reached)
    res = CliRunner().invoke(
        app, ["run", str(_tiny_study(tmp_path, str(tmp_path / "empty"))), "--root", str(tmp_path / "runs")]
    )
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: workload 'fashion_mnist'"), res.output
    assert "apt-get install -y dataset-fashion-mnist" in lines[0] and "Traceback" not in res.output
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()
    assert (
        not (tmp_path / "runs" / "mlflow.db").exists()
        and not (tmp_path / "runs" / "fm_missing" / "launch.json").exists()
    )


def test_run_study_with_missing_data_fails_before_ray_and_mlflow_start(tmp_path):
    from flatlab.study.loader import load_studies
    from flatlab.study.runner import RunOptions, run_study

    (tmp_path / "empty").mkdir()
    (study,) = load_studies(str(_tiny_study(tmp_path, str(tmp_path / "empty"))))
    with pytest.raises(DataUnavailable, match=r"is an empty folder\. Get Fashion-MNIST in one of three ways"):
        run_study(study, RunOptions(root=tmp_path / "runs", num_cpus=1))
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()
    assert (
        not (tmp_path / "runs" / "mlflow.db").exists()
        and not (tmp_path / "runs" / "fm_missing" / "launch.json").exists()
    )


def test_the_cli_lists_the_models():
    from flatlab.cli.main import app

    res = CliRunner().invoke(app, ["workloads", "fashion_mnist"])
    assert res.exit_code == 0, res.output
    assert "one of '2c2d', 'mlp', 'small_cnn'" in res.output and "val_size" in res.output and "train_size" in res.output


# ---------------------------------------------------------------- splits


def test_the_hold_out_is_stratified_disjoint_and_set_by_the_seed():
    y = np.repeat(np.arange(3), [600, 300, 100])  # unequal classes: proportions show
    tr, va = fm.split_train(y, 100, None, seed=0)
    assert np.bincount(y[va]).tolist() == [60, 30, 10]
    assert not set(tr) & set(va) and len(tr) + len(va) == 1000
    tr2, va2 = fm.split_train(y, 100, None, seed=0)
    assert np.array_equal(va, va2) and np.array_equal(tr, tr2)
    _, va3 = fm.split_train(y, 100, None, seed=1)
    assert not np.array_equal(va, va3) and np.bincount(y[va3]).tolist() == [60, 30, 10]
    # a stratified subset of what is left (900 = 540 + 270 + 90): 90 = 54 + 27 + 9
    sub, va4 = fm.split_train(y, 100, 90, seed=0)
    assert np.array_equal(va4, va) and set(sub) <= set(tr) and np.bincount(y[sub]).tolist() == [54, 27, 9]
    assert np.array_equal(sub, fm.split_train(y, 100, 90, seed=0)[0])
    assert not np.array_equal(sub, fm.split_train(y, 100, 90, seed=1)[0])
    with pytest.raises(ConfigError, match=r"train_size=901 exceeds the 900 training images left after val_size=100"):
        fm.split_train(y, 100, 901, seed=0)
    with pytest.raises(ConfigError, match=r"val_size=1000 leaves no training image of the 1000"):
        fm.split_train(y, 1000, None, seed=0)


def test_load_data_holds_out_and_subsets(tmp_path):
    write_folder(tmp_path / "f", n_train=400)
    wl = build_workload("fashion_mnist", data_path=str(tmp_path / "f"), val_size=100, train_size=50)
    data = wl.load_data(5)
    assert (len(data.train), len(data.val), len(data.test)) == (50, 100, 50)
    assert np.bincount(data.val.targets.numpy(), minlength=10).tolist() == [10] * 10
    assert np.bincount(data.train.targets.numpy(), minlength=10).tolist() == [5] * 10
    train_rows = {bytes(r) for r in data.train.inputs.numpy()}  # random images: rows identify examples
    assert not train_rows & {bytes(r) for r in data.val.inputs.numpy()}
    assert data.meta["train_size"] == 50 and data.meta["val_size"] == 100 and data.meta["train_pool"] == 400


def test_synthetic_data_is_small_deterministic_and_in_the_schema():
    wl = build_workload("fashion_mnist", data_path="synthetic", synthetic_size=100)
    a, b = wl.load_data(0), wl.load_data(0)
    assert a.train.inputs.dtype == torch.uint8 and a.train.inputs.shape[1:] == (1, 28, 28)
    assert (len(a.train), len(a.val), len(a.test)) == (75, 25, 25)  # the hold-out is capped at a quarter
    assert torch.equal(a.train.inputs, b.train.inputs) and torch.equal(a.val.targets, b.val.targets)
    assert set(a.train.targets.tolist()) == set(range(10))


# ---------------------------------------------------------------- models

#: the standard deviation of a normal truncated at +-2 standard deviations, in units of the untruncated one:
#: var = 1 - 2 * 2 phi(2) / (Phi(2) - Phi(-2)), phi the standard normal density
TRUNC2_STD = math.sqrt(1 - 2 * 2 * math.exp(-2) / math.sqrt(2 * math.pi) / math.erf(2 / math.sqrt(2)))


def test_the_truncated_std_by_hand():
    assert TRUNC2_STD == pytest.approx(0.879626, abs=1e-6)


def n_params(net):
    return sum(p.numel() for p in net.parameters())


def test_deepobs_parameter_counts():
    # 2c2d: conv 5x5 1->32: 5*5*1*32 + 32 = 832; conv 5x5 32->64: 5*5*32*64 + 64 = 51,264;
    # dense 7*7*64 = 3,136 -> 1,024: 3,136*1,024 + 1,024 = 3,212,288; dense 1,024 -> 10: 10,240 + 10 = 10,250
    assert n_params(DeepOBS2C2D()) == 832 + 51_264 + 3_212_288 + 10_250 == 3_274_634
    # mlp: 784*1,000 + 1,000 = 785,000; 1,000*500 + 500 = 500,500; 500*100 + 100 = 50,100; 100*10 + 10 = 1,010
    assert n_params(DeepOBSMLP()) == 785_000 + 500_500 + 50_100 + 1_010 == 1_336_610
    # small_cnn, width w = 16: 5*5*1*w + w = 416; 3*3*w*2w + 2w = 4,640; 2w*7*7*10 + 10 = 15,690; BatchNorm adds 2w + 4w
    assert n_params(SmallCNN(16)) == 416 + 4_640 + 15_690 == 20_746
    assert n_params(SmallCNN(16, batchnorm=True)) == 20_746 + 96
    assert n_params(SmallCNN(4)) == 26 * 4 + 18 * 16 + 2 * 4 + 980 * 4 + 10


@pytest.mark.parametrize("model", ["2c2d", "mlp", "small_cnn"])
def test_forward_shapes_and_uint8_equals_unit_range(model):
    torch.manual_seed(0)
    net = build_workload("fashion_mnist", model=model).build_model()
    x = torch.randint(0, 256, (3, 1, 28, 28), dtype=torch.uint8)
    out = net(x)
    assert out.shape == (3, 10)
    assert torch.allclose(out, net(x.float() / 255.0), atol=1e-6)  # DeepOBS's ToTensor: pixels / 255, no normalisation


@pytest.mark.parametrize("cls, std, bias", [(DeepOBS2C2D, 0.05, 0.05), (DeepOBSMLP, 0.03, 0.0)])
def test_deepobs_initialisation(cls, std, bias):
    torch.manual_seed(0)
    net = cls()
    layers = [m for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert len(layers) == 4
    for m in layers:
        w = m.weight.detach()
        assert torch.all(m.bias == bias), m
        assert float(w.abs().max()) <= 2 * std  # truncated at 2 standard deviations
        if w.numel() >= 50_000:  # enough draws for a 1.5 % check of the spread (relative s.e. ~ 0.4 % at 50k)
            assert float(w.std()) == pytest.approx(std * TRUNC2_STD, rel=0.015), m
            assert abs(float(w.mean())) < 4 * std / math.sqrt(w.numel())


# ---------------------------------------------------------------- the real files (Debian's package)


@pytest.fixture(scope="module")
def real_folder():
    missing = fm.find_idx_files(fm.DEBIAN_DIR)[1]
    if missing:
        why = f"{fm.DEBIAN_DIR} lacks {', '.join(missing)} (`make data` installs Debian's dataset-fashion-mnist)"
        if os.environ.get("FLATLAB_REQUIRE_FMNIST") == "1":
            pytest.fail(f"FLATLAB_REQUIRE_FMNIST=1 but {why}")
        pytest.skip(why)
    return fm.DEBIAN_DIR


def test_real_files_have_6000_and_1000_images_per_class(real_folder):
    x, y, x_te, y_te = fm.read_idx_folder(real_folder)
    assert (
        x.shape == (60_000, 28, 28)
        and x.dtype == np.uint8
        and x_te.shape == (10_000, 28, 28)
        and x_te.dtype == np.uint8
    )
    assert np.bincount(y).tolist() == [6_000] * 10 and np.bincount(y_te).tolist() == [1_000] * 10
    assert y[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]  # the first labels as Zalando's files hold them
    assert x.mean() / 255 == pytest.approx(0.2860, abs=5e-5)  # the widely used training-set mean


def test_real_data_by_default_splits_as_deepobs(real_folder):
    data = build_workload("fashion_mnist", model="2c2d").load_data(0)
    assert data.meta["source"] == str(real_folder)
    assert (len(data.train), len(data.val), len(data.test)) == (50_000, 10_000, 10_000)  # DeepOBS's PyTorch sizes
    assert np.bincount(data.val.targets.numpy()).tolist() == [1_000] * 10
