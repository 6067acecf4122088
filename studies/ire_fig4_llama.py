"""IRE paper, Fig. 4: Llama pre-training, AdamW vs AdmIRE, and the "2x speed-up" as a metric.

Studies (``build(scale)``, run in this order; searcher ``grid``), for each model size and each of its two
step budgets (``<size>`` below is ``llama_60m``, ``llama_119m`` or ``llama_229m``, ``<k>`` the budget in
thousands of steps):

1. ``ire_fig4_<size>_<k>k``: arm ``adamw`` over the paper's learning-rate grid {3e-4, 6e-4, 1.2e-3,
   1.8e-3}; 4 x 3 seeds = 12 trials, FIFO.
2. ``ire_fig4_<size>_<k>k_admire`` (a chained study): arm ``adamw`` and arm ``adamw_ire`` (AdmIRE, gamma
   {0.6, 0.8} x kappa {2, 5}, our grid; IRE on from the end of warm-up), both at the best AdamW learning
   rate of study 1 (``sp.best_of``, resolved at launch from study 1's latest finished launch, by
   ``val/loss``). (1 + 4) x 3 = 15 trials, FIFO.

The sizes: Llama 60M (16 layers, width 410, 10 heads, context 150) on wikitext-103, budgets 50k and 100k
steps, batch 240, warm-up 500 steps; Llama 119M (6 layers, 768, 12 heads, context 512) on minipile, 30k
and 60k steps, batch 300, warm-up 300; Llama 229M (16 layers, 768, 12 heads, context 1024) on
openwebtext, 50k and 100k steps, batch 480, warm-up 1000 (all from the paper's appendix). Every study:
AdamW betas (0.9, 0.95), eps 1e-16, weight decay 0.1, gradient clipping 1.0, linear warm-up then cosine
to lr_max/20 (the paper's); 3 seeds (ours: the figure shows one curve per optimizer, but a speed-up
measured on one seed has no error bar; ``seeds=(0,)`` and ``--study`` reproduce the single curves for
less). One GPU and 8 CPUs per trial; 119M and 229M accumulate gradients over micro-batches of 60 / 32
sequences to fit one GPU (ours; the update is the same up to float rounding).

Each budget and warm-up is stated in optimizer steps, as the paper states them: ``Budget(steps=...)`` and
trainer ``warmup_steps`` (:mod:`flatlab.study.budget`); the cosine spans the budget, the last pass over the
corpus ends part-way, and the whole training split is trained on. Metrics are reported once per pass over
it: 60M about 3,300 steps a pass (wikitext-103's about 118M GPT-2 tokens), so 16 / 31 passes; 229M about
18,300 (openwebtext's about 9.0B tokens), so 3 / 6 passes; 119M a few passes over minipile. The speed-up
reads the training loss of every step, not these.

The speed-up metric is automatic (``reference_arm="adamw"`` in study 2): every run records its smoothed
training loss per optimizer step (``train/loss_smoothed``, bias-corrected EMA with factor
``curve_smoothing``, default 0.9), and after the study each finished trial gets ``train/steps_to_target``,
the first step at which its smoothed loss reaches the FINAL smoothed loss of the AdamW trial with the
same seed, and ``train/speedup`` = AdamW's total steps / steps_to_target. The AdmIRE trials'
``train/speedup`` is the paper's "2x speed-up" claim; comparing AdmIRE's 50k-step run with AdamW's
100k-step run of the same size (two studies) is the figure's other reading of it. Resolution: the curve's
stride (one step up to 1024 steps, then doubling), so steps_to_target is an upper bound within one
stride. The target per seed is logged on the study's parent run (``reference/train_loss_smoothed``,
step = seed).
Table 6 (Tr(H) of the AdamW and AdmIRE solutions of Llama 60M): every trial of study 2 measures Tr(H) of
its final model (``hessian_trace``, Hutchinson with 10 Rademacher probes; ours) on 64 training
sequences, the loss averaged per token as the training loss is: ``flat/hessian_trace``.
There is no Optuna variant: the figure compares two optimizers at one fixed recipe.
``smoke`` scale (studies named ``<name>_smoke``, the shorter budget of each size only): tiny Llamas (2
layers; the 60M one has an odd width/heads ratio, as the paper's 410/10, so the head-width rounding runs)
over synthetic token streams of 2,048 tokens (16 steps a pass of 8 sequences of 16), ``Budget(steps=4)``
with a warm-up of 1 step, one learning rate in study 1, the same reference arm, Tr(H) with 2 probes on 4
sequences.
"""

from flatlab import Arm, Budget, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
BASE = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-16, "weight_decay": 0.1}
LRS = [3e-4, 6e-4, 1.2e-3, 1.8e-3]  # IRE paper, Fig. 4: AdamW's learning-rate grid
SMOKE_LR = 6e-4

# Gradient accumulation at paper scale (trainer micro_batch_size): a whole 480 x 1024-token batch of the
# 229M model needs far more activation and logit (50,257-way) memory than one GPU holds.
MICRO_BATCH = {"llama_60m": None, "llama_119m": 60, "llama_229m": 32}

# size, workload, batch, warm-up steps, budgets in steps (the paper's appendix), tiny shape for smoke
SIZES = (
    ("llama_60m", "lm/wikitext103", 240, 500, (50_000, 100_000), dict(width=30, n_heads=2, intermediate=48)),
    ("llama_119m", "lm/minipile", 300, 300, (30_000, 60_000), dict(width=32, n_heads=2, intermediate=64)),
    ("llama_229m", "lm/openwebtext", 480, 1000, (50_000, 100_000), dict(width=48, n_heads=4, intermediate=96)),
)
SMOKE = dict(steps=4, warmup_steps=1, batch=8, context=16)


def _arms(lr, paper: bool):
    ire = {
        "gamma": sp.grid([0.6, 0.8] if paper else [0.8]),
        "kappa": sp.grid([2.0, 5.0] if paper else [2.0]),
        "switch_at_warmup_end": True,
    }
    return Arm("adamw", space={**BASE, "lr": lr}), Arm("adamw_ire", space={**BASE, "lr": lr, **ire})


def _pair(size, workload, batch, steps, warmup_steps, tiny, paper, name):
    """Study 1 (AdamW's lr grid) and study 2 (AdamW and AdmIRE at its best lr) of one size and budget: ``steps``
    optimizer steps of ``batch`` sequences, the first ``warmup_steps`` of them warming up."""
    wp = {"model": size}
    if not paper:
        wp.update(n_layers=2, **tiny, context=SMOKE["context"], data_path="synthetic", synthetic_tokens=2048)
    micro = MICRO_BATCH[size] if paper else None
    common = dict(
        workload=workload,
        workload_params=wp,
        train={
            "batch_size": batch,
            "schedule": "cosine",
            "warmup_steps": warmup_steps,
            "final_lr_factor": 0.05,
            "clip_norm": 1.0,
            **({"micro_batch_size": micro} if micro else {}),
        },
        metric="val/loss",
        mode="min",
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        budget=Budget(steps=steps),
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=8, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
    )
    suffix = "" if paper else "_smoke"  # each scale its own MLflow experiments
    data = workload.split("/")[1]
    grid = Study(
        name=name + suffix,
        description=f"AdamW learning-rate grid, {size} on {data} (IRE Fig. 4)",
        arms=(Arm("adamw", space={**BASE, "lr": sp.grid(LRS if paper else [SMOKE_LR])}),),
        **common,
    )
    admire = Study(
        name=f"{name}_admire" + suffix,
        description=f"AdamW vs AdmIRE at AdamW's best lr, {size} on {data} (IRE Fig. 4, Table 6)",
        arms=_arms(sp.best_of(grid.name, arm="adamw", param="lr"), paper),
        reference_arm="adamw",
        measures={"hessian_trace": {"probes": 10 if paper else 2}},  # Table 6: Tr(H) at the end
        measure_examples=64 if paper else 4,
        **common,
    )
    return [grid, admire]


def build(scale: str):
    paper = scale == "paper"
    studies = []
    for size, workload, batch, warmup, budgets, tiny in SIZES:
        for steps in budgets if paper else budgets[:1]:
            name = f"ire_fig4_{size}_{steps // 1000}k"
            recipe = (batch, steps, warmup) if paper else (SMOKE["batch"], SMOKE["steps"], SMOKE["warmup_steps"])
            studies += _pair(size, workload, *recipe, tiny, paper, name)
    return studies
