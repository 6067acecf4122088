"""TSAM paper, Fig. 1 and its second toy as studies: where TSAM ends on a 1-D loss, against the tilt t.

Studies (workloads ``toy/tsam_wave`` and ``toy/tsam_kink``, searcher ``grid``): arm ``tsam`` over plain
GD (lr 0.005, no momentum, no weight decay), rho 0.2, s = 3 perturbations per step, Gaussian noise
clipped to radius 0.1, t in {0, 1, 5, 20, 100}, 400 steps (100 epochs of 4), seeds 0, 1, 2. Each trial
logs its trajectory (``val/theta`` every 4 steps), the mean of its last 25 epoch-end iterates
(``val/theta_tail``: the iterate keeps bouncing, rho is 40 % of the distance between the wave's
minima) and the minimum gradient descent reaches from that mean with its flatness (``val/basin``,
``val/basin_curvature``, ``val/basin_sharpness`` = mean L(m +- 0.1) - L(m)); when a study ends,
``flatlab run`` logs its figure (tail mean and basin sharpness against t) under ``toy/`` on the launch
run.

1. ``toy_tsam_wave``: L(theta) = 2 sin(4 pi theta) / (2 theta) + 0.005 (theta - 1)^2 from the paper's
   start theta = 0.5 (its minima: 0.358, 0.868, 1.370, 1.872, 2.373 with L'' 431, 181, 115, 84, 67).
   Measured through the trainer (seeds 0-2): t = 0 ends in the sharpest minimum 0.358 (tail means
   0.571, 0.536, 0.532), t = 1 in 0.868 (0.652, 0.636, 0.657), t = 100 in 1.370 for seed 0 and 0.868 for
   seeds 1, 2 (1.122, 1.028, 0.857): larger t, flatter minima, as the paper's figure shows; which basin
   one seed ends in at large t is chaotic (tests/optim/test_tsam.py).
2. ``toy_tsam_kink``: L(theta) = |theta - 1| - 0.01 for theta <= 2, (theta - 3)^2 otherwise: the global
   minimum 1 is a kink (sharpness 0.1 at r = 0.1), the minimum 3 is flat (L'' = 2, sharpness 0.01), and
   L jumps by 0.01 at theta = 2. Start theta = 2.2 (ours; the paper's start is not in the text we have).
   Measured (400 steps, seed 0; seed 1 agrees): from 2.2, t = 0 and 1 reach the flat minimum 3 (tail
   mean 3.0) while t = 20 and 100 stall near the jump, on its flat side (tail means 2.18-2.20): the
   tilted objective weights the perturbations that land left of 2, whose slope pushes back. From 1.9
   and from 2.05 no t reaches either minimum in 400 steps: t = 0 and 1 sit just right of the jump (tail
   means 2.01-2.02, classed basin 3), t = 20 and 100 just left of it (1.99-2.00, classed basin 1). From
   1.5 every t, and plain GD, ends at the sharp minimum 1 (rho = 0.2 never reaches past 2). Here the
   start and the jump at 2 decide the end point more than t does; read ``val/theta_tail`` with
   ``val/basin``, which only says on which side of 2 the tail mean lies.
Runs on a laptop CPU (30 trials of 400 steps; TSAM costs 2s = 6 passes a step).
"""

from flatlab import Arm, Resources, Study
from flatlab import space as sp

TS = [0.0, 1.0, 5.0, 20.0, 100.0]


def _study(name, workload, start, description):
    return Study(
        name=name,
        description=description,
        workload=workload,
        workload_params={"theta0": start, "steps_per_epoch": 4, "tail": 25},
        train={"batch_size": 1, "schedule": "constant"},
        arms=(
            Arm(
                "tsam",
                space={
                    "lr": 0.005,
                    "momentum": 0.0,
                    "weight_decay": 0.0,
                    "rho": 0.2,
                    "s": 3,
                    "noise_radius": 0.1,
                    "noise": "gaussian",
                    "t": sp.grid(TS),
                },
            ),
        ),
        metric="val/loss",
        mode="min",
        searcher="grid",
        scheduler="fifo",
        grace_period=1,
        max_epochs=100,
        seeds=(0, 1, 2),
        checkpoint_every=100,
        resources=Resources(cpu=1),
        max_concurrent=2,
        reports={"toy_figure": {"end": "val/theta_tail", "flatness": "val/basin_sharpness"}},
    )


STUDIES = [
    _study("toy_tsam_wave", "toy/tsam_wave", 0.5, "TSAM Fig. 1 toy: end point and flatness against t"),
    _study(
        "toy_tsam_kink", "toy/tsam_kink", 2.2, "TSAM kink toy (sharp minimum 1, flat minimum 3): end point against t"
    ),
]
