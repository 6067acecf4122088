"""Robust fine-tuning of CLIP and its WiSE-FT alpha search, with sharpness and straggler pruning (seed "In
Search of the Successful Interpolation").

``build(scale)`` returns TWO studies, in this order (``flatlab run`` runs them in file order):

1. ``<prefix>_finetune`` (workload ``clip_finetune``): end-to-end fine-tuning of CLIP from its
   zero-shot classifier, a grid of 3 learning rates x 3 augmentation settings (none, flip-crop,
   randaug = flip-crop + RandAugment(2, 9)) = the seed paper's 9 fine-tuned models (the paper varies
   the fine-tuning hyperparameters; this exact grid is our choice), AdamW (weight decay 0.1), cosine
   schedule with warm-up. Every trial uploads ``model/model.safetensors`` to MLflow.
2. ``<prefix>_alpha`` (workload ``clip_interpolate``, no training): a grid over the 9 models x alpha
   in 0, 0.05, ..., 1 (alpha = weight on the FINE-TUNED model, WiSE-FT's convention; the paper plots
   its 1 - alpha). Arm ``unpruned`` measures ID/OOD loss and accuracy, adaptive average sharpness
   (rho = 1.0, 20 draws, on a fixed OOD subset; general, and per layer as §3.1 defines it: the
   fine-tuned model's layer perturbed, then interpolated, ``layer_sharpness="finetuned"``; the other
   definition, theta_alpha's own layer perturbed, is ``"interpolated"``), and ID/OOD accuracy with one
   layer group interpolated at a time (Def. 1.1, Fig. 2; ``layers``: ``"all"`` groups of the clip
   grouping, or a comma-separated list of them, ``""`` = off); arm ``pruned`` first finds
   the straggler layers of the fine-tuned model (layer-wise sharpness, 5 draws) and zeroes a random
   half of their entries (Algorithm 1). Each fine-tuned model is named by the first study's NAME, arm
   and params (``mlflow:<prefix>_finetune/adamw?lr=...&augment=...``): when the alpha study is launched,
   each such reference becomes the run of that trial in the fine-tune study's latest FINISHED launch
   (``run:<run_id>``; the fine-tune study must have run to the end first), and each trial fetches its
   model from MLflow before it starts. That is the launch rule of chained studies (``sp.best_of``);
   ``best_of`` itself is not used here because this study interpolates every fine-tuned model, not only
   the best one (for the best one, ``"finetuned": sp.best_of("<prefix>_finetune", arm="adamw")``
   resolves to its ``run:<run_id>``).

When the alpha study finishes, ``flatlab run`` draws Figs. 1 (OOD accuracy/loss vs alpha per
model), 2 (ID/OOD accuracy vs alpha with one layer group interpolated, per model), 3 (sharpness vs
alpha), 4 (layer-wise sharpness heat maps) and 5 (pruned vs unpruned), writes Kendall's tau between each
sharpness measure (``flat/*``) and OOD accuracy, pooled and per model over its alpha grid
(``sharpness_correlation.md``), and logs them with ``summary.json`` (instability, gain, failure mode and
tau per model) on the alpha study's launch run (the alpha study's ``reports={"interpolation": {}}``;
``flatlab interpolation-report <prefix>_alpha`` rebuilds them on demand). The launch's ``correlation/``
holds the same tau pooled and per arm, as for every study that measures flatness.

Scales:

* ``paper``: OpenAI CLIP ViT-B/32 (``pretrained="openai"``, quick-GELU; downloaded by open_clip, or
  from a filled HF cache with HF_HUB_OFFLINE=1), ImageNet as ID and ImageNet-A as OOD, from image
  folders with WordNet-id class folders: ``$FLATLAB_IMAGENET/{train,val}`` and ``$FLATLAB_IMAGENET_A``
  (defaults ``/data/imagenet``, ``/data/imagenet-a``; ``hf:<name>@<split>`` sources work too).
  ImageNet-A is scored on its 200 classes (matched by folder name). Fine-tuning uses the full ImageNet
  training set (1.28M images), streamed from disk (``train_in_memory=False``: each trial decodes its
  mini-batches on the fly, one ahead, with ``load_workers`` threads, default min(8, CPUs)), so
  ``$FLATLAB_IMAGENET`` must be on a filesystem every node sees. Simplifications, because the
  evaluation sets live in memory as uint8 tensors (150 KB per image): ID accuracy on 10 validation
  images per class (10k), sharpness on a fixed subset of 1,000 ImageNet-A images. One GPU per trial.
* ``smoke``: the same two studies on a tiny random-weight ViT and generated image folders (3 classes;
  the OOD folder holds 2 of them, exercising the class subset) written under ``$FLATLAB_CACHE``
  (default ``~/.cache/flatlab``) at load time, training images streamed from them as at paper scale;
  2 learning rates x 3 augmentations, 3 alphas; runs offline on CPU:
  ``flatlab run studies/rft_clip.py --scale smoke``.
"""

import os

from flatlab import Arm, Resources, Study
from flatlab import space as sp
from flatlab.interpolation import alpha_grid

SCALES = ("paper", "smoke")
AUGMENTATIONS = ("none", "flip-crop", "randaug")


def _studies(
    prefix, model, data, train_data, lrs, alphas, *, train, epochs, resources, concurrent, eval_extra, layers="all"
):
    common = {**model, **data}
    finetune = Study(
        name=f"{prefix}_finetune",
        description="fine-tuned CLIP models: learning rate x augmentation grid",
        workload="clip_finetune",
        workload_params={**common, **train_data},
        train=train,
        arms=(
            Arm(
                "adamw", space={"lr": sp.grid(list(lrs)), "augment": sp.grid(list(AUGMENTATIONS)), "weight_decay": 0.1}
            ),
        ),
        metric="val/accuracy",
        mode="max",
        searcher="grid",
        scheduler="fifo",
        max_epochs=epochs,
        resources=resources,
        max_concurrent=concurrent,
    )
    refs = [f"mlflow:{finetune.name}/adamw?lr={lr}&augment={aug}" for lr in lrs for aug in AUGMENTATIONS]
    shared = {"finetuned": sp.grid(refs), "alpha": sp.grid(list(alphas))}
    alpha = Study(
        name=f"{prefix}_alpha",
        description="WiSE-FT alpha search of the fine-tuned models: loss, accuracy, sharpness, straggler pruning",
        workload="clip_interpolate",
        workload_params={**common, **eval_extra},
        arms=(
            # the optimizer is never used: clip_interpolate declares trains=False
            Arm(
                "adamw",
                name="unpruned",
                space={
                    **shared,
                    "prune": False,
                    "sharpness_draws": 20,
                    "sharpness_rho": 1.0,
                    "sharpness_layerwise": True,
                    "layer_sharpness": "finetuned",
                    "layerwise_interpolation": layers,
                },
            ),
            Arm("adamw", name="pruned", space={**shared, "prune": True, "straggler_draws": 5, "sharpness_draws": 0}),
        ),
        metric="ood/accuracy",
        mode="max",
        searcher="grid",
        scheduler="fifo",
        max_epochs=1,
        grace_period=1,
        resources=resources,
        max_concurrent=concurrent,
        reports={"interpolation": {}},  # the paper's figures when the alpha study ends
    )
    return [finetune, alpha]


def build(scale):
    if scale == "paper":
        imagenet = os.environ.get("FLATLAB_IMAGENET", "/data/imagenet")
        imagenet_a = os.environ.get("FLATLAB_IMAGENET_A", "/data/imagenet-a")
        return _studies(
            "rft_clip",
            model={
                "model_name": "ViT-B-32",
                "pretrained": "openai",
                "quick_gelu": True,
                "classnames": "imagenet",
                "templates": "openai",
            },
            data={
                "id_data": os.path.join(imagenet, "val"),
                "id_per_class": 10,
                "ood_data": imagenet_a,
                "eval_batch_size": 512,
            },
            train_data={"train_data": os.path.join(imagenet, "train"), "train_per_class": 0, "train_in_memory": False},
            lrs=(1e-5, 3e-5, 1e-4),
            alphas=alpha_grid(0.05),
            # 0.1 epoch of full ImageNet at batch 256 = 500 warm-up steps (WiSE-FT's warm-up length)
            train={"batch_size": 256, "schedule": "cosine", "warmup_epochs": 0.1, "label_smoothing": 0.0},
            epochs=10,
            resources=Resources(cpu=8, gpu=1),
            concurrent=None,
            eval_extra={"sharpness_examples": 1000},
        )
    from flatlab.cache import cache_root
    from flatlab.workloads.clip_data import write_synthetic_folders

    folders = write_synthetic_folders(
        cache_root() / "rft_clip_smoke" / "data", n_train=8, n_val=4, n_ood=4, ood_classes=2
    )
    return _studies(
        "rft_clip_smoke",
        model={"model_name": "flatlab-tiny-vit", "pretrained": "", "templates": "simple"},
        data={"id_data": str(folders["val"]), "ood_data": str(folders["ood"]), "load_workers": 1},
        train_data={"train_data": str(folders["train"]), "train_in_memory": False},
        lrs=(1e-3, 1e-2),
        alphas=(0.0, 0.5, 1.0),
        train={"batch_size": 8, "schedule": "cosine", "warmup_epochs": 0.5},
        epochs=2,
        resources=Resources(cpu=1, gpu=0),
        concurrent=2,
        eval_extra={"sharpness_examples": 0},
    )
