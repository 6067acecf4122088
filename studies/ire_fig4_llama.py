"""IRE paper, Fig. 4: Llama pre-training, AdamW vs AdmIRE, and the "2x speed-up" as a metric.

Studies (``build(scale)``, one per model size, run in this order; searcher ``grid``):

1. ``ire_fig4_llama_60m``: Llama 60M (16 layers, width 410, 10 heads, context 150) on wikitext-103.
2. ``ire_fig4_llama_119m``: Llama 119M (6 layers, 768, 12 heads, context 512) on minipile.
3. ``ire_fig4_llama_229m``: Llama 229M (16 layers, 768, 12 heads, context 1024) on openwebtext.

Each: arm ``adamw`` and arm ``adamw_ire`` (AdmIRE, gamma {0.6, 0.8} x kappa {2, 5}, our grid; IRE on
from the end of warm-up), both at lr_max 6e-4 with betas (0.9, 0.95), eps 1e-16, weight decay 0.1,
gradient clipping 1.0, linear warm-up (2% of the run) then cosine to lr_max/20; 3 seeds, as every
paper grid here: the figure shows one curve per optimizer, but a speed-up measured on one seed has no
error bar, and with three each AdmIRE seed is measured against the AdamW run of the same seed (same
initialisation and data order), so ``flatlab compare`` gives the speed-up's mean, interval and paired
test. (1 + 4) x 3 = 15 trials per size, FIFO, one GPU and 8 CPUs per trial (119M and 229M accumulate
gradients over micro-batches of 64 / 32 sequences to fit one GPU); three times the GPU hours of one
seed: ``seeds=(0,)`` here (and ``--study`` for one size) reproduces the figure's single curves for less.

The speed-up metric is automatic (``reference_arm="adamw"``): every run records its smoothed training
loss per optimizer step (``train/loss_smoothed``, bias-corrected EMA with factor ``curve_smoothing``,
default 0.9), and after the study each finished trial gets ``train/steps_to_target``, the first step at
which its smoothed loss reaches the FINAL smoothed loss of the AdamW trial with the same seed, and
``train/speedup`` = AdamW's total steps / steps_to_target. The AdmIRE trials' ``train/speedup`` is the
paper's "2x speed-up" claim (about 2; AdamW's own is 1, or a little above if its smoothed loss dipped
below its final value earlier). Resolution: the curve's stride (one step up to 1024 steps, then
doubling: 32 steps for a 20k-30k-step run), so steps_to_target is an upper bound within one stride
(about 0.3% of a 10k-15k-step steps_to_target). The target per seed is logged on the study's parent
run (``reference/train_loss_smoothed``, step = seed). Budgets are ours: wikitext-103 4 epochs
(batch 128), minipile 1 epoch (batch 128), openwebtext the first 2.6B tokens (batch 256), i.e. roughly
20k-30k steps each; an LM epoch is one pass over the training tokens, so metrics are reported once
per pass.
Table 6 (Tr(H) of the AdamW and AdmIRE solutions of Llama 60M): every trial measures Tr(H) of its final
model (``hessian_trace``, Hutchinson with 10 Rademacher probes; ours) on 64 training sequences, the
loss averaged per token as the training loss is: ``flat/hessian_trace``.
There is no Optuna variant: the figure compares two optimizers at one fixed recipe.
``smoke`` scale (studies named ``<name>_smoke``):
the three studies on tiny Llamas (2 layers; the 60M one has an odd width/heads ratio,
as the paper's 410/10, so the head-width rounding runs) over synthetic token streams, 1 epoch, with the
same reference arm, Tr(H) with 2 probes on 4 sequences.
"""

from flatlab import Arm, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
BASE = {"lr": 6e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-16, "weight_decay": 0.1}

# Gradient accumulation at paper scale (trainer micro_batch_size): a whole 256 x 1024-token batch of the
# 229M model needs over 100 GB of activations and logits (50,257-way), more than one GPU holds; the
# update is the same up to float rounding. Ours; the paper does not say how it fit its batches.
MICRO_BATCH = {"llama_60m": None, "llama_119m": 64, "llama_229m": 32}

SIZES = (
    # size, workload, batch, epochs, extra workload params at paper scale, tiny shape for smoke
    ("llama_60m", "lm/wikitext103", 128, 4, {}, {"width": 30, "n_heads": 2, "intermediate": 48, "context": 16}),
    ("llama_119m", "lm/minipile", 128, 1, {}, {"width": 32, "n_heads": 2, "intermediate": 64, "context": 32}),
    (
        "llama_229m",
        "lm/openwebtext",
        256,
        1,
        {"max_train_tokens": 2_600_000_000},
        {"width": 48, "n_heads": 4, "intermediate": 96, "context": 32},
    ),
)


def build(scale: str):
    paper = scale == "paper"
    suffix = (
        "" if paper else f"_{scale}"
    )  # each scale its own MLflow experiments (paper runs never mix with smoke runs)
    studies = []
    for size, workload, batch, epochs, extra, tiny in SIZES:
        if paper:
            wp = {"model": size, **extra}
        else:
            wp = {"model": size, "n_layers": 2, **tiny, "data_path": "synthetic", "synthetic_tokens": 2048}
        studies.append(
            Study(
                name=f"ire_fig4_{size}" + suffix,
                description=f"AdamW vs AdmIRE, {size} on {workload.split('/')[1]} (IRE Fig. 4)",
                workload=workload,
                workload_params=wp,
                train={
                    "batch_size": batch if paper else 16,
                    "schedule": "cosine",
                    "warmup_epochs": 0.02 * epochs if paper else 0.25,
                    "final_lr_factor": 0.05,
                    "clip_norm": 1.0,
                    **({"micro_batch_size": MICRO_BATCH[size]} if paper and MICRO_BATCH[size] else {}),
                },
                arms=(
                    Arm("adamw", space=dict(BASE)),
                    Arm(
                        "adamw_ire",
                        space={
                            **BASE,
                            "gamma": sp.grid([0.6, 0.8] if paper else [0.8]),
                            "kappa": sp.grid([2.0, 5.0] if paper else [2.0]),
                            "switch_at_warmup_end": True,
                        },
                    ),
                ),
                metric="val/loss",
                mode="min",
                searcher="grid",
                scheduler="fifo",
                grace_period=1,
                max_epochs=epochs if paper else 1,
                seeds=(0, 1, 2) if paper else (0,),
                resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
                max_concurrent=None if paper else 1,
                reference_arm="adamw",
                measures={"hessian_trace": {"probes": 10 if paper else 2}},  # Table 6: Tr(H) at the end
                measure_examples=64 if paper else 4,
            )
        )
    return studies
