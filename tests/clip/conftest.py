"""Shared fixtures for the CLIP tests: tiny image folders written with PIL, the tiny open_clip model's
parameters, one fine-tuned checkpoint. Everything is offline (random weights, generated images)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import numpy as np
import pytest

pytest.importorskip("open_clip")

CLASSES = ("cat", "dog", "frog")
COLOURS = {"cat": (200, 60, 40), "dog": (50, 180, 70), "frog": (40, 60, 210)}


def write_folder(root: Path, classes, per_class: int, seed: int, size: int = 36) -> Path:
    """``<root>/<class>/<i>.png``: a noisy grey background with a class-coloured square (PIL PNGs)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            img = rng.normal(100, 20, size=(size, size, 3))
            y, x = rng.integers(4, size - 16, size=2)
            img[y : y + 12, x : x + 12] = COLOURS[c]
            Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(root / c / f"img{i}.png")
    return root


@pytest.fixture(scope="session")
def folders(tmp_path_factory) -> Dict[str, Path]:
    """``train`` (3 classes x 4), ``val`` (3 x 2) and ``ood`` (2 classes: cat, frog; x 3) image folders."""
    root = tmp_path_factory.mktemp("images")
    return {
        "train": write_folder(root / "train", CLASSES, 4, seed=0),
        "val": write_folder(root / "val", CLASSES, 2, seed=1),
        "ood": write_folder(root / "ood", ("cat", "frog"), 3, seed=2),
    }


@pytest.fixture(scope="session")
def params(folders) -> Dict[str, object]:
    """Workload params of the tiny model on the test folders (shared by clip_finetune and clip_interpolate)."""
    return {
        "model_name": "flatlab-tiny-vit",
        "templates": "simple",
        "id_data": str(folders["val"]),
        "ood_data": str(folders["ood"]),
        "load_workers": 1,
    }


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="session")
def finetuned(params, folders, tmp_path_factory):
    """``(workload, data, trainer)`` after one fine-tuning epoch (AdamW, randaug), and its state dict
    saved as ``model.safetensors``."""
    from safetensors.torch import save_file

    from flatlab.train.trainer import Trainer, TrialSpec
    from flatlab.workloads import build_workload

    wp = {**params, "train_data": str(folders["train"]), "augment": "randaug"}
    wl = build_workload("clip_finetune", **wp)
    data = wl.load_data(0)
    spec = TrialSpec(
        workload="clip_finetune",
        optimizer="adamw",
        epochs=1,
        seed=0,
        workload_params=wp,
        optimizer_params={"lr": 3e-3, "weight_decay": 0.1},
        trainer_params={"batch_size": 4, "warmup_epochs": 0.5},
    )
    trainer = Trainer(spec, data, workload=wl)
    metrics = trainer.run_epoch()
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    save_file({k: v.detach().contiguous() for k, v in trainer.model.state_dict().items()}, str(path))
    return {"workload": wl, "data": data, "trainer": trainer, "metrics": metrics, "path": path, "params": wp}
