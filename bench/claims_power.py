"""The error rates and power of ``flatlab compare``'s tuning-level claim, by simulation (docs/comparing.md).

Prints two markdown tables: the rate of directional claims between identical arms, per number of tunings S and
tuning/seed SD ratio, and the power against a uniform real effect in SDs of d_k, per S. Both come from
:mod:`flatlab.analysis.calibration`, which labels simulated studies with the functions ``flatlab compare`` uses.

Usage: ``python bench/claims_power.py [--reps 20000]`` (about a minute on one core).
"""

from __future__ import annotations

import argparse

from flatlab.analysis.calibration import directional_rate, power_curve

RATIOS = (0.0, 0.5, 1.0, 3.0, 10.0)
EFFECTS = (0.5, 1.0, 1.5, 2.0, 3.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20000, help="simulated studies per cell")
    args = parser.parse_args()
    print("A/A: directional claims between identical arms (alpha 0.05, 4 final seeds)\n")
    print("| tunings S | " + " | ".join(f"ratio {r:g}" for r in RATIOS) + " |")
    print("|---|" + "---:|" * len(RATIOS))
    for s in (3, 5, 10):
        rates = [directional_rate(tunings=s, seeds=4, ratio=r, effect=0.0, reps=args.reps, seed=s * 97 + i)
                 for i, r in enumerate(RATIOS)]  # fmt: skip
        print(f"| {s} | " + " | ".join(f"{v:.3f}" for v in rates) + " |")
    print("\npower against a uniform effect delta (SDs of d_k; alpha 0.05, one arm, 2 final seeds)\n")
    print("| tunings S | " + " | ".join(f"δ = {e:g} SD" for e in EFFECTS) + " |")
    print("|---|" + "---:|" * len(EFFECTS))
    for s in (3, 6, 10):
        curve = power_curve(tunings=s, seeds=2, ratio=1.0, effects=EFFECTS, reps=args.reps, seed=s * 31)
        print(f"| {s} | " + " | ".join(f"{curve[e]:.2f}" for e in EFFECTS) + " |")


if __name__ == "__main__":
    main()
