"""IRE paper, Fig. 3: a 2-layer decoder-only transformer (about 8M) on wikitext-2, AdamW vs AdmIRE.

Studies (``build(scale)``, run in this order):

1. ``ire_fig3_transformer_wikitext2`` (searcher ``grid``): arm ``adamw`` over the learning-rate grid
   {1.5e-4, 3e-4, 6e-4, 1e-3, 1.5e-3, 3e-3} (the figure's range; the intermediate points are our
   reading), then arm ``adamw_ire`` (AdmIRE) at ``ADMIRE_LR`` over gamma {0.7, 0.8, 0.9} x kappa
   {2, 5, 10} (grid values ours), IRE on from the end of warm-up. Both: betas (0.9, 0.95),
   eps 1e-16, weight decay 0.1, gradient clipping 1.0, warm-up 2 epochs then cosine to lr_max/20,
   batch 32 windows of 512 tokens, 40 epochs (ours); 3 seeds. (6 + 9) x 3 = 45 trials, FIFO.
   Metric: ``val/loss`` (min); ``val/perplexity`` = exp(val/loss) is reported too.
2. ``ire_fig3_transformer_wikitext2_optuna`` (searcher ``optuna``): both arms with
   lr ~ logU(1.5e-4, 3e-3) and gamma ~ U(0.6, 0.95), kappa ~ logU(1, 20); 10 trials per arm, ASHA.

``ADMIRE_LR``: AdmIRE runs at the best AdamW learning rate, which the first arm finds; 6e-4 (the IRE
paper's lr_max for its Llama runs) until you set it from that arm's result.
Paper scale: one GPU and 4 CPUs per trial (GPT-2 BPE, 50,257 tokens: 6.9M parameters with tied
embeddings). ``smoke`` scale: a 2-layer width-32 model, context 32, on a synthetic 256-token
Markov stream, 1 epoch, 2 learning rates, one AdmIRE point, 1 CPU.
"""

from flatlab import Arm, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
ADMIRE_LR = 6e-4
BASE = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-16, "weight_decay": 0.1}


def build(scale: str):
    paper = scale == "paper"
    workload_params = {"model": "transformer_2l"}
    if not paper:
        workload_params.update(data_path="synthetic", synthetic_tokens=4096, width=32, n_heads=2, context=32)
    common = dict(
        workload="lm/wikitext2",
        workload_params=workload_params,
        train={
            "batch_size": 32 if paper else 16,
            "schedule": "cosine",
            "warmup_epochs": 2.0 if paper else 0.25,
            "final_lr_factor": 0.05,
            "clip_norm": 1.0,
        },
        metric="val/loss",
        mode="min",
        max_epochs=40 if paper else 1,
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=4, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
    )
    lrs = [1.5e-4, 3e-4, 6e-4, 1e-3, 1.5e-3, 3e-3] if paper else [1e-3, 3e-3]
    grid = Study(
        name="ire_fig3_transformer_wikitext2",
        description="AdamW lr grid, then AdmIRE gamma x kappa, 2-layer transformer on wikitext-2 (IRE Fig. 3)",
        arms=(
            Arm("adamw", space={**BASE, "lr": sp.grid(lrs)}),
            Arm(
                "adamw_ire",
                space={
                    **BASE,
                    "lr": ADMIRE_LR if paper else 3e-3,
                    "gamma": sp.grid([0.7, 0.8, 0.9] if paper else [0.8]),
                    "kappa": sp.grid([2.0, 5.0, 10.0] if paper else [2.0]),
                    "switch_at_warmup_end": True,
                },
            ),
        ),
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        **common,
    )
    lr = sp.loguniform(1.5e-4, 3e-3)
    optuna = Study(
        name="ire_fig3_transformer_wikitext2_optuna",
        description="AdamW vs AdmIRE on wikitext-2, Optuna TPE over lr, gamma, kappa (smaller budget)",
        arms=(
            Arm("adamw", space={**BASE, "lr": lr}),
            Arm(
                "adamw_ire",
                space={**BASE, "lr": lr, "gamma": sp.uniform(0.6, 0.95), "kappa": sp.loguniform(1.0, 20.0), "switch_at_warmup_end": True},
            ),
        ),
        searcher="optuna",
        num_trials=10 if paper else 1,
        scheduler="asha" if paper else "fifo",
        grace_period=10 if paper else 1,
        reduction_factor=3,
        **common,
    )
    return [grid, optuna]
