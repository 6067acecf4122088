"""TSAM paper, Figs. 5-6 on the kink toy: the SAM objective against rho and the tilted objective against t,
at the toy's sharp and flat minima.

Which minimum does each objective prefer? On L(theta) = |theta - 1| - 0.01 for theta <= 2, (theta - 3)^2
otherwise (workload ``toy/tsam_kink``: the global minimum 1 is a kink, the minimum 3 is flat), one study,
``toy_tsam_objectives`` (searcher ``grid``): arm ``sharp_min`` holds theta = 1, arm ``flat_min`` theta = 3.
Both points are stationary (L'(3) = 0, and autograd's subgradient of |x| at 0 is 0), so the trial's one
plain-GD step leaves theta where it starts; the step is only how a study reaches its measures, which then
evaluate, on the final (= starting) point:

* ``sam_objective`` with a sweep over rho (``rhos``): ``flat/sam_objective/rho_<r>`` = max over
  ``|eps| <= r`` of ``L(theta + eps)``. The ascent starts from a random point on the sphere
  (``init_radius=1``: in one dimension, +-r), since SAM's ascent from a stationary point cannot move.
  Closed form (0 < r < 1): ``r - 0.01`` at 1 and ``r^2`` at 3, so SAM's objective prefers the flat minimum
  exactly for r in (0.0101, 0.9899), the roots of ``r^2 - r + 0.01``; smaller or larger radii prefer the
  sharp one.
* ``tilted_objective`` with a sweep over t (``ts``), eps uniform in the ball of radius ``R`` = 0.015 and no
  ascent step (``rho=0``): ``flat/tilted_objective/t_<t>`` = ``(1/t) log mean_j exp(t L(theta + eps_j))``
  over ``s`` draws, the same draws for every t (the TSAM objective with uniform perturbations, ALGORITHMS.md
  section 2: t = 0 the mean, t -> infinity the max over the ball). Closed form at 1: ``-0.01 + (1/t)
  log((e^{tR} - 1)/(tR))`` (``R/2 - 0.01`` at t = 0); at 3: ``(1/t) log((1/2R) int_{-R}^{R} e^{t e^2} de)``
  (``R^2/3`` at t = 0). At R = 0.015 the mean prefers the sharp minimum (-0.0025 against 0.000075) and the
  max the flat one (0.005 against 0.000225): the tilted objective prefers the sharp minimum up to t of
  about 300 (-0.000051 against 0.000076) and the flat one from about 1000 on (0.0023 against 0.000077).

After the study ``flatlab run`` logs the two curves, one line per arm, on the launch run:
``flatness_sweep/sam_objective_vs_rho.{csv,png}`` and ``flatness_sweep/tilted_objective_vs_t.{csv,png}``
(:mod:`flatlab.analysis.flatness_sweep`).

From the paper: the toy loss and the two objectives (SAM's max over the rho-ball, TSAM's tilted objective).
Ours: the two evaluation points (the toy's minima), the rho grid (around the closed form's crossings), the
radius R of the tilted objective and its t grid (the paper's t in {0, 1, 5, 20, 100}, extended to 10,000:
at a radius this small the losses differ by about 0.01, so t must reach hundreds before the tilt moves the
preference), uniform perturbations, s = 2000 draws (the estimate's standard error at t = 0 is about 1e-4).
Deterministic but for the draws: one seed. ``smoke`` scale (``toy_tsam_objectives_smoke``): s = 64 draws and
three values per sweep.
"""

from flatlab import Arm, Resources, Study

SCALES = ("paper", "smoke")
NAME = "toy_tsam_objectives"
RHOS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 0.9, 0.98, 0.99)
TS = (0.0, 1.0, 5.0, 20.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0)
R = 0.015  # the tilted objective's ball: the mean prefers the sharp minimum, the max the flat one
MINIMA = {"sharp_min": 1.0, "flat_min": 3.0}


def build(scale: str):
    paper = scale == "paper"
    rhos, ts = (RHOS, TS) if paper else ((0.005, 0.5, 0.99), (0.0, 20.0, 1000.0))
    plain_gd = {"lr": 0.005, "momentum": 0.0, "weight_decay": 0.0}
    return [
        Study(
            name=NAME if paper else f"{NAME}_smoke",
            description="TSAM Figs. 5-6 on the kink toy: SAM objective against rho, tilted objective against t",
            workload="toy/tsam_kink",
            workload_params={"steps_per_epoch": 1, "tail": 1},
            train={"batch_size": 1, "schedule": "constant"},
            arms=tuple(Arm("sgd", name=name, space={**plain_gd, "theta0": theta}) for name, theta in MINIMA.items()),
            metric="val/loss",
            mode="min",
            searcher="grid",
            scheduler="fifo",
            grace_period=1,
            max_epochs=1,
            seeds=(0,),
            resources=Resources(cpu=1),
            max_concurrent=1,
            measures={
                "sam_objective": {"rho": rhos[len(rhos) // 2], "rhos": list(rhos), "init_radius": 1.0},
                "tilted_objective": {
                    "t": 1.0,
                    "ts": list(ts),
                    "s": 2000 if paper else 64,
                    "rho": 0.0,
                    "noise_radius": R,
                    "noise": "uniform",
                },
            },
            measure_examples=1,
            measure_split="train",
        )
    ]
