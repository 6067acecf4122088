"""TSAM paper, GLUE: fine-tuning a pretrained DistilBERT with ERM, SAM and TSAM.

Studies (``build(scale)``, run in this order):

1. ``tsam_glue_<task>`` for task in cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli (searcher
   ``grid``; GLUE's nine tasks): arms ``erm`` (SGD), ``sam``, ``tsam``; lr in {1e-4, 3e-4, 1e-3, 3e-3,
   1e-2, 3e-2, 0.1} (constant), momentum 0.9, batch 64 (the paper's grids, as its image tasks); SAM and
   TSAM x rho in {0.05, 0.1, 0.2}; TSAM x t in {0, 1, 5, 20, 100} x s in {3, 5} (the paper's). No weight
   decay, max 128 tokens and 3 epochs are ours. 3 seeds. Trials per task: (7 + 21 + 210) x 3 = 714, FIFO.
   Budget: equal epochs, the paper's protocol (``Budget(epochs=3)``); a step costs 1 pass for ERM, 2 for
   SAM and 2s for TSAM (s times SAM's cost), as the paper states beside its results.
   Metric: the task's GLUE metric on the validation hold-out (``val/matthews`` for CoLA, ``val/pearson``
   for STS-B, ``val/f1`` for MRPC and QQP, ``val/accuracy`` otherwise); GLUE's dev set is the ``test``
   split, scored once at the end. Paper scale: one GPU and 4 CPUs per trial.
2. ``tsam_glue_optuna`` (searcher ``optuna``): CoLA, the three arms with lr ~ logU(1e-4, 0.1),
   rho ~ U(0.05, 0.2), t in {0, 1, 5, 20, 100}, s in {3, 5}; 12 trials per arm, ASHA (grace 1 epoch).

The table with its AVG column: ``flatlab compare tsam_glue_cola tsam_glue_sst2 ... tsam_glue_wnli`` (the
nine task studies) prints each arm's test metric per task and, under the table, its average over the
tasks (:attr:`flatlab.analysis.compare.multi.MultiSummary.averages`).

``smoke`` scale (studies named ``<name>_smoke``):
CoLA, STS-B (the regression task) and the Optuna study, on a tiny random-weight
DistilBERT (1 layer, width 32) over synthetic token ids, one grid point per arm, ``Budget(epochs=1)``, 1
CPU. The
other tasks differ only in their columns and metric, which the workload tests cover.
"""

from flatlab import Arm, Budget, Resources, Study
from flatlab import space as sp

SCALES = ("paper", "smoke")
TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
SMOKE_TASKS = ("cola", "stsb")
METRIC = {"cola": "val/matthews", "stsb": "val/pearson", "mrpc": "val/f1", "qqp": "val/f1"}
LRS = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1]
TS = [0.0, 1.0, 5.0, 20.0, 100.0]
SS = [3, 5]
TINY = {
    "pretrained": False,
    "data_path": "synthetic",
    "synthetic_size": 64,
    "vocab_size": 512,
    "dim": 32,
    "n_layers": 1,
    "n_heads": 2,
    "hidden_dim": 64,
    "max_length": 32,
}


def build(scale: str):
    paper = scale == "paper"
    suffix = (
        "" if paper else f"_{scale}"
    )  # each scale its own MLflow experiments (paper runs never mix with smoke runs)
    common = dict(
        workload_params={"max_length": 128} if paper else dict(TINY),
        train={"batch_size": 64 if paper else 16, "schedule": "constant"},
        mode="max",
        budget=Budget(epochs=3 if paper else 1),  # equal epochs, the paper's protocol
        seeds=(0, 1, 2) if paper else (0,),
        resources=Resources(cpu=4, gpu=1) if paper else Resources(cpu=1),
        max_concurrent=None if paper else 1,
    )
    base = {"momentum": 0.9, "lr": sp.grid(LRS if paper else [0.01])}
    rho = {"rho": sp.grid([0.05, 0.1, 0.2] if paper else [0.05])}
    arms = (
        Arm("sgd", name="erm", space=base),
        Arm("sam", space={**base, **rho}),
        Arm("tsam", space={**base, **rho, "t": sp.grid(TS if paper else [5.0]), "s": sp.grid(SS if paper else [3])}),
    )
    studies = [
        Study(
            name=f"tsam_glue_{task}" + suffix,
            description=f"ERM vs SAM vs TSAM, DistilBERT on GLUE {task} (TSAM paper)",
            workload=f"glue/{task}",
            arms=arms,
            metric=METRIC.get(task, "val/accuracy"),
            searcher="grid",
            scheduler="fifo",
            grace_period=1,
            **common,
        )
        for task in (TASKS if paper else SMOKE_TASKS)
    ]
    tpe = {"momentum": 0.9, "lr": sp.loguniform(1e-4, 0.1)}
    rho_tpe = {"rho": sp.uniform(0.05, 0.2)}
    studies.append(
        Study(
            name="tsam_glue_optuna" + suffix,
            description="ERM vs SAM vs TSAM on GLUE CoLA, Optuna TPE (smaller budget)",
            workload="glue/cola",
            arms=(
                Arm("sgd", name="erm", space=tpe),
                Arm("sam", space={**tpe, **rho_tpe}),
                Arm("tsam", space={**tpe, **rho_tpe, "t": sp.choice(TS), "s": sp.choice(SS) if paper else 3}),
            ),
            metric="val/matthews",
            searcher="optuna",
            num_trials=12 if paper else 1,
            scheduler="asha" if paper else "fifo",
            grace_period=1,
            reduction_factor=3,
            **common,
        )
    )
    return studies
