"""IRE paper, Fig. 1 as a study: L(u, v) = (1 + u^2) v^2 / 2, gradient descent (eta = 1) with IRE, kappa sweep.

One study, ``toy_ire_fig1`` (workload ``toy/ire_fig1``, searcher ``grid``): arm ``sgd_ire`` (plain GD as
its base: lr 1, no momentum, no weight decay), gamma 0.5 (the one coordinate with the smaller squared
gradient is "flat"), the mask refreshed every step (``mask_interval=1``), kappa in {0, 1, 2, 5}
(kappa = 0 is GD itself), 200 steps (20 epochs of 10), one seed (the dynamics are deterministic). The
minima are the line v = 0 with Tr(H) = 1 + u^2: the smaller |u| at the end, the flatter. Each trial
logs its trajectory (``val/u``, ``val/v`` every 10 steps) and ``val/trace_hessian``; when the study
ends, ``flatlab run`` logs the figure (end point |u| and Tr(H) against kappa) under ``toy/`` on the
launch run (``toy_figure.png``, ``toy_summary.json``).

Start (u, v) = (0.95, 0.3), ours: the text of the paper we have does not state its figure's start. There
GD with eta = 1 is stable (the sharp curvature 1 + u^2 < 2 = 2/eta), and the end points fall with kappa:
|u| = 0.749 (GD), 0.621 (kappa 1), 0.511 (kappa 2), 0.241 (kappa 5), |v| < 1e-22
(tests/optim/test_ire.py and tests/workloads/test_toys.py). Other starts behave otherwise: from
(1.5, 0.5), where 1 + u^2 = 3.25 > 2, GD's first steps overshoot in v; there GD ends at |u| = 0.302,
kappa 1 at 0.090, kappa 2 at 0.747 (not monotone in kappa) and kappa 5 diverges within 8 steps
(``workload_params={"u0": 1.5, "v0": 0.5}`` reproduces it).
Runs on a laptop CPU in about a minute.
"""

from flatlab import Arm, Resources, Study
from flatlab import space as sp

STUDY = Study(
    name="toy_ire_fig1",
    description="IRE Fig. 1 toy: end point and Tr(H) against kappa",
    workload="toy/ire_fig1",
    workload_params={"u0": 0.95, "v0": 0.3, "steps_per_epoch": 10},
    train={"batch_size": 1, "schedule": "constant"},
    arms=(
        Arm(
            "sgd_ire",
            space={
                "lr": 1.0,
                "momentum": 0.0,
                "weight_decay": 0.0,
                "gamma": 0.5,
                "mask_interval": 1,
                "kappa": sp.grid([0.0, 1.0, 2.0, 5.0]),
            },
        ),
    ),
    metric="val/loss",
    mode="min",
    searcher="grid",
    scheduler="fifo",
    grace_period=1,
    max_epochs=20,
    seeds=(0,),
    checkpoint_every=20,
    resources=Resources(cpu=1),
    max_concurrent=2,
    reports={"toy_figure": {"end": "val/abs_u", "flatness": "val/trace_hessian"}},
)
