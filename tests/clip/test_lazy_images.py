"""Training images streamed from disk: LazyImages rows equal load_images' tensor, pickling carries no
pixels, prefetch, errors naming the image, and clip_finetune with train_in_memory=False trains
bit-identically to the in-memory path."""

from __future__ import annotations

import pickle
import re
import shutil

import pytest
import torch

from flatlab.errors import ConfigError
from flatlab.workloads.clip_data import lazy_images, load_images, parse_source, pixel_transform, write_synthetic_folders
from flatlab.workloads.clip_model import TINY_MODEL, ClipSpec, load_clip
from flatlab.workloads.lazy_images import LazyImages


@pytest.fixture(scope="module")
def transform():
    return pixel_transform(load_clip(ClipSpec(TINY_MODEL))[1])


@pytest.fixture(scope="module")
def thirty(tmp_path_factory):
    """An image folder of 3 classes x 10 images (40x40 PNGs): blue/000{20..29}.png, green/..., red/..."""
    return write_synthetic_folders(tmp_path_factory.mktemp("thirty"), n_train=10, n_val=1, n_ood=1)["train"]


@pytest.mark.parametrize("per_class", [0, 3])
def test_rows_equal_load_images(thirty, transform, per_class):
    src = parse_source(str(thirty))
    pix, y, names = load_images(src, transform, per_class=per_class, seed=4)
    lazy, ly, lnames = lazy_images(src, transform, per_class=per_class, seed=4, workers=2)
    assert isinstance(lazy, LazyImages) and lazy.shape == pix.shape and len(lazy) == len(pix)
    assert torch.equal(ly, y) and lnames == names
    n = len(pix)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    for idx in (perm[:5], perm[5:], torch.tensor([2, 2, 0]), torch.tensor([-1, 0]), [1, 0], perm[:0]):
        got = lazy[idx]
        assert got.dtype == torch.uint8 and torch.equal(got, pix[torch.as_tensor(idx, dtype=torch.long)])
    for sl in (slice(0, 4), slice(3, None), slice(None, None, 2), slice(n - 2, n + 10), slice(5, 5)):
        assert torch.equal(lazy[sl], pix[sl])
    assert torch.equal(lazy[3], pix[3]) and torch.equal(lazy[torch.tensor(-2)], pix[-2])
    with pytest.raises(IndexError, match=rf"row {n} is out of range for {n} images"):
        lazy[torch.tensor([0, n])]
    with pytest.raises(IndexError, match="1-D integer index"):
        lazy[torch.zeros(n, dtype=torch.bool)]


def test_synthetic_and_hf_sources_stream_the_same_pixels(tmp_path, transform, folders):
    pix, _, _ = load_images(parse_source("synthetic:train"), transform, per_class=3, seed=1)
    lazy, _, _ = lazy_images(parse_source("synthetic:train"), transform, per_class=3, seed=1)
    assert torch.equal(pickle.loads(pickle.dumps(lazy))[:], pix)  # regenerated in the receiving process

    datasets = pytest.importorskip("datasets")
    from PIL import Image

    files = sorted((folders["val"] / "dog").glob("*.png")) + sorted((folders["val"] / "cat").glob("*.png"))
    ds = datasets.Dataset.from_dict(
        {"img": [Image.open(f) for f in files], "label": [1, 1, 0, 0]},
        features=datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"])}),
    )
    ds.save_to_disk(str(tmp_path / "hf"))
    src = parse_source(f"hf:{tmp_path / 'hf'}")
    pix, y, _ = load_images(src, transform)
    lazy, ly, _ = lazy_images(src, transform)
    again = pickle.loads(pickle.dumps(lazy))  # re-opens the saved data set
    assert torch.equal(again[torch.tensor([3, 0, 1])], pix[[3, 0, 1]]) and torch.equal(ly, y)


def test_pickle_carries_items_not_pixels(thirty, transform):
    lazy, _, _ = lazy_images(parse_source(str(thirty)), transform, workers=2)
    expected = lazy[:]
    lazy.prefetch(torch.tensor([1, 2]))  # a pending prefetch and a live thread pool are not pickled
    blob = pickle.dumps(lazy)
    assert len(lazy) == 30 and len(blob) < 10_000, len(blob)  # the pixels alone are 30 * 3 * 32 * 32 = 92 KB
    again = pickle.loads(blob)
    assert again.shape == (30, 3, 32, 32) and torch.equal(again[:], expected)
    again.prefetch([4, 5])
    assert torch.equal(again[[4, 5]], expected[4:6])
    lazy.close()


def test_prefetch_returns_the_batch_without_decoding_again(thirty, transform, tmp_path):
    root = shutil.copytree(thirty, tmp_path / "copy")
    src = parse_source(str(root))
    pix, _, _ = load_images(src, transform)
    lazy, _, _ = lazy_images(src, transform, workers=2)
    idx = torch.tensor([7, 25, 3])
    lazy.prefetch(idx)
    pending = lazy._pending[1]
    assert all(f.result(timeout=30) is not None for f in pending)  # decoded in the background
    for r in idx.tolist():  # gone from disk: only the prefetched pixels can serve this batch
        (root / lazy.items[r].decode()).unlink()
    assert torch.equal(lazy[idx], pix[idx])
    with pytest.raises(ConfigError, match=r"cannot read image '.*/\d{5}\.png'"):  # a second time decodes again
        lazy[idx]
    lazy.prefetch(torch.tensor([0, 1]))  # not taken: indexing other rows decodes those rows
    assert torch.equal(lazy[torch.tensor([1, 2])], pix[[1, 2]])
    assert lazy._pending is None


def test_errors_name_the_image(thirty, transform, tmp_path):
    root = shutil.copytree(thirty, tmp_path / "copy")
    lazy, _, _ = lazy_images(parse_source(str(root)), transform)
    victim = root / "green" / "00013.png"
    row = [r for r in range(len(lazy)) if lazy.items[r] == b"green/00013.png"][0]
    victim.unlink()
    assert torch.equal(lazy[[0, 1]], load_images(parse_source(str(thirty)), transform)[0][:2])  # others still read
    with pytest.raises(ConfigError, match=f"cannot read image {re.escape(repr(str(victim)))}"):
        lazy[torch.tensor([0, row])]
    victim.write_bytes(b"not a png")
    with pytest.raises(ConfigError, match=r"cannot read image '.*green/00013.png'"):
        lazy[row]
    (root / "blue" / "00020.png").write_bytes(b"")  # the first image is decoded at construction (for the shape)
    with pytest.raises(ConfigError, match=r"cannot read image '.*blue/00020.png'"):
        lazy_images(parse_source(str(root)), transform)

    class Reader:  # item 2 comes out 16x16
        def __call__(self, item):
            return torch.zeros((3, 16, 16) if item == 2 else (3, 8, 8), dtype=torch.uint8)

        def describe(self, item):
            return f"item-{item}"

    odd = LazyImages([0, 1, 2], Reader())
    assert odd.shape == (3, 3, 8, 8) and odd[:2].shape == (2, 3, 8, 8)
    with pytest.raises(
        ConfigError, match=r"image item-2 has shape \(3, 16, 16\) after preprocessing, expected \(3, 8, 8\)"
    ):
        odd[:]
    with pytest.raises(ConfigError, match="no images selected"):
        LazyImages([], Reader())


def test_streamed_training_is_bit_identical_to_in_memory(params, folders, monkeypatch):
    from flatlab.train.trainer import Trainer, TrialSpec
    from flatlab.workloads import build_workload
    from flatlab.workloads.clip import ClipFinetune

    assert "train_in_memory" in ClipFinetune.data_hparams
    calls = []
    original = LazyImages.prefetch
    monkeypatch.setattr(LazyImages, "prefetch", lambda self, idx: (calls.append(idx.tolist()), original(self, idx))[1])
    runs = {}
    for in_memory in (True, False):
        wp = {**params, "train_data": str(folders["train"]), "augment": "flip-crop", "train_in_memory": in_memory}
        wl = build_workload("clip_finetune", **wp)
        data = wl.load_data(0)
        assert isinstance(data.train.inputs, torch.Tensor) is in_memory
        spec = TrialSpec(
            workload="clip_finetune",
            optimizer="adamw",
            epochs=1,
            seed=3,
            workload_params=wp,
            optimizer_params={"lr": 3e-3, "weight_decay": 0.1},
            trainer_params={"batch_size": 5},
        )
        trainer = Trainer(spec, data, workload=wl)
        metrics = trainer.run_epoch()
        # wall-clock figures differ between any two runs: the time and the compute's seconds
        metrics = {k: v for k, v in metrics.items() if k != "time/epoch_s" and not k.endswith("_s")}
        runs[in_memory] = (metrics, trainer.model.state_dict(), data)
    (m_mem, w_mem, d_mem), (m_lazy, w_lazy, d_lazy) = runs[True], runs[False]
    assert torch.equal(d_lazy.train.inputs[:], d_mem.train.inputs) and torch.equal(
        d_lazy.train.targets, d_mem.train.targets
    )
    assert torch.equal(d_lazy.val.inputs, d_mem.val.inputs)  # evaluation stays in memory
    assert m_lazy == m_mem
    assert w_lazy.keys() == w_mem.keys() and all(torch.equal(w_lazy[k], w_mem[k]) for k in w_mem)
    # 12 images in batches of 5: the trainer asked for batches 2 and 3 ahead of time, in its shuffled order
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(3)).tolist()
    assert calls == [perm[5:10], perm[10:]]
    zero_shot = build_workload("clip_finetune", **params).build_model().state_dict()
    assert not torch.equal(w_lazy["visual.conv1.weight"], zero_shot["visual.conv1.weight"])  # it did train


def test_rft_clip_paper_scale_streams_the_full_training_set():
    from pathlib import Path

    from flatlab.study.loader import load_studies

    path = Path(__file__).resolve().parents[2] / "studies" / "rft_clip.py"
    paper = load_studies(str(path), "paper")[0]
    assert paper.workload == "clip_finetune"
    assert paper.workload_params["train_in_memory"] is False and paper.workload_params["train_per_class"] == 0
    assert paper.workload_params["id_per_class"] == 10  # evaluation subsets unchanged


def test_a_relative_folder_still_reads_after_the_trial_changes_directory(thirty, transform, tmp_path, monkeypatch):
    """Tune runs each trial in its own working directory: relative sources are made absolute at parse time."""
    monkeypatch.chdir(thirty.parent)
    src = parse_source(thirty.name)  # relative to the driver's directory
    lazy, _, _ = lazy_images(src, transform, workers=1)
    blob = pickle.dumps(lazy)
    elsewhere = tmp_path / "trial_dir"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    moved = pickle.loads(blob)
    assert torch.equal(moved[[1, 2]], lazy[[1, 2]])


def test_default_decoders_follow_the_processs_cpu_share():
    from flatlab.workloads.lazy_images import default_workers

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # what a 1-CPU trial sets
        assert default_workers(0) == 1 and default_workers(3) == 3
        torch.set_num_threads(2)
        assert default_workers(0) == 2
    finally:
        torch.set_num_threads(before)
    assert default_workers(0) == min(8, before)
