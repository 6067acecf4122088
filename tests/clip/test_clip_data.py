"""Image sources, one-off preprocessing to uint8 tensors, label spaces and class subsets."""

from __future__ import annotations

import sys

import pytest
import torch

from flatlab.errors import ConfigError
from flatlab.workloads.base import Split
from flatlab.workloads.clip_data import (
    SubsetSplit,
    into_label_space,
    label_names,
    load_images,
    parse_index_list,
    parse_ood_sources,
    parse_source,
    pixel_transform,
    write_synthetic_folders,
)
from flatlab.workloads.clip_model import TINY_MODEL, ClipSpec, load_clip


@pytest.fixture(scope="module")
def transform():
    return pixel_transform(load_clip(ClipSpec(TINY_MODEL))[1])


def test_parse_source():
    assert parse_source("/data/x") == parse_source("folder:/data/x")
    assert parse_source("/data/x").kind == "folder"
    s = parse_source("hf:org/imagenet-a@test")
    assert (s.kind, s.location, s.split) == ("hf", "org/imagenet-a", "test")
    assert parse_source("hf:cifar10").split == "train"
    assert parse_source("synthetic:ood").location == "ood"
    with pytest.raises(ConfigError, match=r"variant must be one of train, val, ood"):
        parse_source("synthetic:test")
    with pytest.raises(ConfigError, match=r"non-empty string"):
        parse_source("")
    keys = [k for k, _ in parse_ood_sources("/a;imagenet_r=/b;/c")]
    assert keys == ["ood", "ood_imagenet_r", "ood_3"]
    with pytest.raises(ConfigError, match=r"unique"):
        parse_ood_sources("/a;x=/b;x=/c")
    assert parse_index_list("auto", "w") is None and parse_index_list("3, 1,2", "w") == [3, 1, 2]
    with pytest.raises(ConfigError, match=r"ood_classes: expected 'auto' or comma-separated"):
        parse_index_list("1,b", "ood_classes")


def test_image_folder_is_preprocessed_once_to_uint8(folders, transform):
    src = parse_source(str(folders["train"]))
    assert label_names(src) == ["cat", "dog", "frog"]
    pix, y, names = load_images(src, transform, workers=2)
    assert pix.dtype == torch.uint8 and pix.shape == (12, 3, 32, 32)  # 36x36 PNGs resized + centre-cropped
    assert names == ["cat", "dog", "frog"] and y.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    a, ya, _ = load_images(src, transform, per_class=2, seed=5)
    b, yb, _ = load_images(src, transform, per_class=2, seed=5)
    assert a.shape[0] == 6 and torch.equal(a, b) and ya.tolist() == [0, 0, 1, 1, 2, 2]


def test_ood_subset_of_classes_is_matched_by_name(folders, transform):
    pix, y, names = load_images(parse_source(str(folders["ood"])), transform)
    split = into_label_space(pix, y, names, ["cat", "dog", "frog"], "ood")
    assert isinstance(split, SubsetSplit) and split.classes.tolist() == [0, 2]
    assert y.tolist() == [0, 0, 0, 1, 1, 1]  # targets index into the subset
    same = into_label_space(pix, y, names, ["cat", "frog"], "ood")
    assert type(same) is Split
    explicit = into_label_space(pix, y, names, ["a", "b", "c", "d"], "ood", classes=[3, 1])
    assert explicit.classes.tolist() == [3, 1]
    with pytest.raises(ConfigError, match=r"ood: 1 label\(s\) are not among the ID set's labels, e.g. 'frog'"):
        into_label_space(pix, y, names, ["cat", "dog"], "ood")
    with pytest.raises(ConfigError, match=r"ood: class indices must lie in \[0, 2\); got 0\.\.5"):
        into_label_space(pix, y, names, ["a", "b"], "ood", classes=[0, 5])
    with pytest.raises(ConfigError, match=r"ood: 1 class indices given for 2 labels"):
        into_label_space(pix, y, names, ["a", "b"], "ood", classes=[0])


def test_hf_dataset_saved_to_disk(tmp_path, transform, folders):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    files = sorted((folders["val"] / "dog").glob("*.png")) + sorted((folders["val"] / "cat").glob("*.png"))
    ds = datasets.Dataset.from_dict(
        {"img": [Image.open(f) for f in files], "label": [1, 1, 0, 0]},
        features=datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"])}),
    )
    datasets.DatasetDict({"validation": ds}).save_to_disk(str(tmp_path / "hf"))
    src = parse_source(f"hf:{tmp_path / 'hf'}@validation")
    assert label_names(src) == ["cat", "dog"]
    pix, y, names = load_images(src, transform)
    assert pix.shape == (4, 3, 32, 32) and y.tolist() == [1, 1, 0, 0] and names == ["cat", "dog"]
    with pytest.raises(ConfigError, match=r"split 'train' not found; splits: validation"):
        load_images(parse_source(f"hf:{tmp_path / 'hf'}@train"), transform)


def test_missing_or_empty_folder(tmp_path, transform):
    with pytest.raises(ConfigError, match=r"does not exist or is not a directory"):
        label_names(parse_source(str(tmp_path / "nope")))
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"has no class sub-folders with images"):
        load_images(parse_source(str(tmp_path / "empty")), transform)


def test_synthetic_folders_are_written_once(tmp_path):
    paths = write_synthetic_folders(tmp_path, n_train=2, n_val=1, n_ood=1, ood_classes=2)
    assert label_names(parse_source(str(paths["train"]))) == ["blue", "green", "red"]
    assert label_names(parse_source(str(paths["ood"]))) == ["green", "red"]
    assert len(list(paths["train"].rglob("*.png"))) == 6
    stamp = (paths["train"] / "red" / "00000.png").stat().st_mtime_ns
    write_synthetic_folders(tmp_path, n_train=2)
    assert (paths["train"] / "red" / "00000.png").stat().st_mtime_ns == stamp


def test_a_missing_library_is_one_error_that_says_how_to_install_it(monkeypatch, tmp_path):
    from flatlab.workloads.clip_model import _require_open_clip

    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` now fails as if not installed
    monkeypatch.setitem(sys.modules, "open_clip", None)
    hf = r"^hf: sources need the `datasets` package \(pip install 'flatlab\[clip\]'\): import of datasets halted"
    with pytest.raises(ConfigError, match=hf):
        label_names(parse_source(f"hf:{tmp_path}@validation"))
    clip = r"^the clip workloads need open_clip; install it with .*: import of open_clip halted"
    with pytest.raises(ConfigError, match=clip) as err:
        _require_open_clip()
    assert "is needed here" not in str(err.value)  # the import's own error, not the stand-in's wording
