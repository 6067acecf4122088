"""IRE paper, Table 4: ViT-S/16 on ImageNet-1k, AdamW against AdmIRE (IRE over AdamW).

One study, ``ire_table4_vit_imagenet`` (searcher ``grid``): arms ``adamw`` and ``adamw_ire`` (AdmIRE);
the IRE arm x gamma in {0.99, 0.9, 0.8} x kappa in {20, 50}; 3 seeds each (the table reports means).
(1 + 6) x 3 = 21 trials, FIFO. Workload ``imagenet`` with ``model="vit_small_patch16_224"`` (timm's
ViT-S/16, random init, ``pretrained=False``: nothing is downloaded), RandomResizedCrop 224 + flip and
then RandAugment for training (``augment="randaug"``), Mixup of every training mini-batch
(``mixup_alpha``; soft targets), resize 256 + centre crop 224 for evaluation (never augmented or mixed);
``val/accuracy`` is a 10,000-image hold-out of the training set, ``test/accuracy`` the official 50,000-image
validation set (the number the paper reports). See ``flatlab.workloads.imagenet`` and
``flatlab.workloads.mixup``.

From the paper (ALGORITHMS.md section 3): the model (ViT-S/16) and data (ImageNet-1k), the arms (AdamW,
AdmIRE: IRE over the whole AdamW step, the mask from the sampled-label Fisher, refreshed every 10 steps),
IRE switched on when the training loss first falls below 1.5 (the paper's ImageNet threshold; under
Mixup the training loss is measured against the mixed targets, so it falls later than without Mixup).

Ours (ALGORITHMS.md gives no other value for Table 4): a plain-ViT ImageNet recipe in the manner of
Beyer, Zhai and Kolesnikov 2022 ("Better plain ViT baselines for ImageNet-1k"): 90 epochs, batch 1024,
AdamW with peak lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.1 in torch's convention (the decay
per step is lr x 0.1, i.e. 1e-4 at the peak), linear warm-up over 8 epochs (about 10,000 steps) then
cosine decay to 0, gradient clipping at global norm 1.0, RandAugment with 2 operations at magnitude 10
(of 30), Mixup alpha = 0.2, no label smoothing; the IRE grid is Table 3's ViT grid (gamma in {0.99, 0.9,
0.8}, kappa in {20, 50}, AdmIRE on ViT-T/S over CIFAR-100). A batch of 1024 ViT-S images runs in
micro-batches of 256 with accumulated gradients (``micro_batch_size``: the same update up to float
rounding; ViT-S has LayerNorm only, so no batch statistics change).

Cost: one GPU and 16 CPUs per trial, 16 decoding threads (``workers``); 21 trials x 90 epochs of
ViT-S / ImageNet, i.e. many GPU-days: run it on a cluster, with the data on a filesystem every node sees
(``workload_params={"data_path": "/shared/imagenet", ...}``: ``train/`` and ``val/`` ImageFolders, or a
filled Hugging Face cache for the gated ``ILSVRC/imagenet-1k``).

``smoke`` scale: ``ire_table4_vit_imagenet_smoke`` (its own MLflow experiment): the same two arms on
synthetic data in ImageNet's schema (16 training images of 40 px, 4 classes, stored at 36 px, cropped to
32), timm's tiny ``test_vit`` (width 64, 16-pixel patches: 4 patches), RandAugment and Mixup as at paper
scale, batch 8 in micro-batches of 4, gamma {0.9} x kappa {20}, one seed, 2 epochs with a switch threshold
the first epoch always meets (so the loss-triggered switch-on runs in the second), no warm-up, 1 CPU.
"""

from flatlab import Arm, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
NAME = "ire_table4_vit_imagenet"
SWITCH_LOSS = 1.5  # IRE paper, ImageNet: IRE starts when the training loss first falls below 1.5
# ours (module docstring): the recipe
LR, BATCH, EPOCHS, WARMUP_EPOCHS, CLIP = 1e-3, 1024, 90, 8.0, 1.0
MICRO_BATCH = 256  # ours: a 1024-image ViT-S batch does not fit one GPU
AUGMENT = {"augment": "randaug", "randaug_ops": 2, "randaug_magnitude": 10, "mixup_alpha": 0.2}
SMOKE_DATA = {
    "data_path": "synthetic",
    "model": "test_vit",
    "num_classes": 4,
    "synthetic_size": 16,
    "val_size": 4,
    "synthetic_image_size": 40,
    "resize_size": 36,
    "crop_size": 32,
}


def _arms(paper: bool):
    base = {"lr": LR, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1}
    ire = {
        "gamma": sp.grid([0.99, 0.9, 0.8] if paper else [0.9]),
        "kappa": sp.grid([20.0, 50.0] if paper else [20.0]),
        "switch_loss": SWITCH_LOSS if paper else 100.0,
    }
    return (Arm("adamw", space=base), Arm("adamw_ire", space={**base, **ire}))


def build(scale: str):
    paper = scale == "paper"
    data = {"model": "vit_small_patch16_224", "workers": 16} if paper else dict(SMOKE_DATA)
    return [
        Study(
            name=NAME if paper else f"{NAME}_smoke",
            description="AdamW vs AdmIRE on ViT-S/16, ImageNet-1k with RandAugment and Mixup (IRE Table 4)",
            workload="imagenet",
            workload_params={**data, **AUGMENT},
            arms=_arms(paper),
            train={
                "batch_size": BATCH if paper else 8,
                "micro_batch_size": MICRO_BATCH if paper else 4,
                "schedule": "cosine",
                "warmup_epochs": WARMUP_EPOCHS if paper else 0.0,
                "label_smoothing": 0.0,
                "clip_norm": CLIP,
            },
            metric="val/accuracy",
            mode="max",
            searcher="grid",
            scheduler="fifo",
            max_epochs=EPOCHS if paper else 2,
            seeds=(0, 1, 2) if paper else (0,),
            resources=Resources(cpu=16, gpu=1) if paper else Resources(cpu=1),
            max_concurrent=None if paper else 1,
            grace_period=1,
        )
    ]
