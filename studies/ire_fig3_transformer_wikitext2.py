"""IRE paper, Fig. 3 and Fig. 5 (left): a 2-layer decoder-only transformer (about 8M) on wikitext-2, AdamW vs
AdmIRE.

Studies (``build(scale)``, run in this order; ``flatlab run`` runs them in file order):

1. ``ire_fig3_transformer_wikitext2`` (searcher ``grid``): arm ``adamw`` over the paper's learning-rate
   grid {1.5e-4, 3e-4, 6e-4, 1.2e-3, 1.8e-3, 3e-3}. 6 x 3 seeds = 18 trials, FIFO.
2. ``ire_fig3_transformer_wikitext2_admire`` (searcher ``grid``, a chained study): AdmIRE at the best
   AdamW learning rate of study 1, as the paper does, over gamma {0.7, 0.8, 0.9} x kappa {2, 5, 10}
   (grid values ours), IRE on from the end of warm-up; and arm ``adamw`` at that same learning rate, the
   reference arm (``reference_arm="adamw"``): every trial gets ``train/steps_to_target``, the first step
   at which its smoothed training loss reaches the final smoothed loss of the AdamW trial of its seed, and
   ``train/speedup`` = AdamW's steps / steps_to_target, the figure's speed-up, paired by seed.
   ``lr = sp.best_of("ire_fig3_transformer_wikitext2", arm="adamw", param="lr")``: resolved when this
   study is launched, from study 1's latest finished launch (its best completed trial by ``val/loss``),
   and logged as param ``lr`` with ``lr.source`` = ``<study>/<run_id>`` on the launch and every trial.
   Launching it before study 1 has finished is an error that starts nothing; ``flatlab run --dry-run``
   shows the value it would use now. (1 + 9) x 3 seeds = 30 trials, FIFO.
3. ``ire_fig3_transformer_wikitext2_optuna`` (searcher ``optuna``): both arms with
   lr ~ logU(1.5e-4, 3e-3) and gamma ~ U(0.6, 0.95), kappa ~ logU(1, 20); 10 trials per arm, ASHA; the
   speed-up against the best AdamW trial of each seed, as in study 2.

From the paper: the model, the lr grid, AdamW betas (0.9, 0.95), eps 1e-16, weight decay 0.1, gradient
clipping 1.0, cosine to lr_max/20, a budget of 100k optimizer steps with a linear warm-up of 3k steps,
stated as the paper states them: ``budget=Budget(steps=100_000)`` and trainer ``warmup_steps=3000``
(:mod:`flatlab.study.budget`; the cosine spans the 100k steps, the last epoch ends part-way). The whole of
wikitext-2's training split is trained on. Ours: batch 32 windows of 512 tokens (not in our notes of the
paper); 3 seeds. Metric: ``val/loss`` (min), measured once per pass over the training split (about 146
steps at batch 32, so about 690 times); ``val/perplexity`` = exp(val/loss) is reported too. Study 2's
AdamW arm re-runs study 1's best configuration on the same seeds (3 trials, 10 % of the study): the price
of a paired comparison in one launch. Study 3's ASHA rungs count passes over the training split (first at
10), at the same steps for both arms (the same batch).
Paper scale: one GPU and 4 CPUs per trial (GPT-2 BPE, 50,257 tokens: 6.9M parameters with tied
embeddings). ``smoke`` scale (studies named ``<name>_smoke``; study 2 chains to study 1's smoke run): a
2-layer width-32 model, context 32, batch 16, on a synthetic Markov stream of 4,096 tokens (8 steps a
pass), ``Budget(steps=6)`` with a warm-up of 2 steps, 2 learning rates, one AdmIRE point, 1 CPU.
"""

from flatlab import Arm, Budget, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
BASE = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-16, "weight_decay": 0.1}
LRS = [1.5e-4, 3e-4, 6e-4, 1.2e-3, 1.8e-3, 3e-3]  # IRE paper, Fig. 3: AdamW's learning-rate grid
# per scale: the budget and the warm-up in optimizer steps (the paper's), the batch in windows (ours)
RECIPE = {"paper": (100_000, 3_000, 32), "smoke": (6, 2, 16)}


def build(scale: str):
    paper = scale == "paper"
    suffix = "" if paper else f"_{scale}"  # each scale its own MLflow experiments
    steps, warmup_steps, batch = RECIPE[scale]
    workload_params = {"model": "transformer_2l"}
    if not paper:
        workload_params.update(data_path="synthetic", synthetic_tokens=4096, width=32, n_heads=2, context=32)
    common = dict(
        workload="lm/wikitext2",
        workload_params=workload_params,
        train={
            "batch_size": batch,
            "schedule": "cosine",
            "warmup_steps": warmup_steps,
            "final_lr_factor": 0.05,
            "clip_norm": 1.0,
        },
        metric="val/loss",
        mode="min",
        budget=Budget(steps=steps),
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=4, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
    )
    lrs = LRS if paper else [1e-3, 3e-3]
    grid = Study(
        name="ire_fig3_transformer_wikitext2" + suffix,
        description="AdamW learning-rate grid, 2-layer transformer on wikitext-2 (IRE Fig. 3)",
        arms=(Arm("adamw", space={**BASE, "lr": sp.grid(lrs)}),),
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        **common,
    )
    best_lr = sp.best_of(grid.name, arm="adamw", param="lr")  # resolved at launch from the grid's results
    admire = Study(
        name="ire_fig3_transformer_wikitext2_admire" + suffix,
        description="AdmIRE gamma x kappa at AdamW's best learning rate, and AdamW there (IRE Fig. 3)",
        arms=(
            Arm("adamw", space={**BASE, "lr": best_lr}),
            Arm(
                "adamw_ire",
                space={
                    **BASE,
                    "lr": best_lr,
                    "gamma": sp.grid([0.7, 0.8, 0.9] if paper else [0.8]),
                    "kappa": sp.grid([2.0, 5.0, 10.0] if paper else [2.0]),
                    "switch_at_warmup_end": True,
                },
            ),
        ),
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        reference_arm="adamw",
        **common,
    )
    lr = sp.loguniform(1.5e-4, 3e-3)
    optuna = Study(
        name="ire_fig3_transformer_wikitext2_optuna" + suffix,
        description="AdamW vs AdmIRE on wikitext-2, Optuna TPE over lr, gamma, kappa (smaller budget)",
        arms=(
            Arm("adamw", space={**BASE, "lr": lr}),
            Arm(
                "adamw_ire",
                space={
                    **BASE,
                    "lr": lr,
                    "gamma": sp.uniform(0.6, 0.95),
                    "kappa": sp.loguniform(1.0, 20.0),
                    "switch_at_warmup_end": True,
                },
            ),
        ),
        searcher="optuna",
        num_trials=10 if paper else 1,
        scheduler="asha" if paper else "fifo",
        grace_period=10 if paper else 1,
        reduction_factor=3,
        reference_arm="adamw",
        **common,
    )
    return [grid, admire, optuna]
