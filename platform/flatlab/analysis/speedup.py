"""Steps to a target training loss, and the speed-up over a reference arm (IRE paper, Fig. 4: "AdmIRE
reaches AdamW's final loss in about half the steps"), from each trial's smoothed training-loss curve.

With a reference arm, the target of a seed is the final smoothed loss of the reference arm's trial with
that seed in its best-ranked configuration that completed the seed
(:func:`flatlab.analysis.selection.trial_for_seed`; search and final-stage trials ranked apart, each
stage's trials measured against its own reference); with a fixed ``target_loss`` it is that number. A
trial's steps to the target are the first recorded step whose smoothed loss is <= the target (an upper
bound within one curve stride of the exact step); the speed-up is the reference trial's total steps over
them (> 1: faster than the reference). :func:`flatlab.reports.speedup.log_steps_to_target` reads the
curves from MLflow and logs the results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from flatlab.analysis import selection
from flatlab.analysis.curve_points import Point, first_step_at_or_below
from flatlab.analysis.sample import STAGE_FINAL


@dataclass
class CurveTrial:
    """A completed trial with its smoothed training-loss curve.

    Attributes:
        run_id, arm, seed, stage: the trial's.
        candidate: the trial as the selection rules see it (config, final value of the study metric).
        curve: ``(optimizer step, smoothed loss)`` pairs, by step.
    """

    run_id: str
    arm: str
    seed: int
    stage: str
    candidate: selection.Trial
    curve: List[Point] = field(default_factory=list)


Goal = Dict[str, Any]
"""``{"target": loss, "reference_run": run id or None, "reference_steps": int or None}``."""


def goals(
    trials: List[CurveTrial], reference_arm: Optional[str], target_loss: Optional[float], mode: str
) -> Dict[Tuple[str, int], Goal]:
    """The target of each (stage, seed): ``target_loss`` where given, else the reference arm's trial of
    that seed (module docstring). A seed without a completed reference trial has none."""
    out: Dict[Tuple[str, int], Goal] = {}
    if target_loss is not None:
        for t in trials:
            out[(t.stage, t.seed)] = {"target": float(target_loss), "reference_run": None, "reference_steps": None}
        return out
    by_run = {t.run_id: t for t in trials}
    for stage in sorted({t.stage for t in trials}):
        mine = [t.candidate for t in trials if t.stage == stage and t.arm == reference_arm]
        ranked = selection.rank_configurations(mine, mode).get(reference_arm, [])
        for seed in sorted({t.seed for t in trials if t.stage == stage}):
            pick = selection.trial_for_seed(ranked, seed)
            if pick is not None:
                last_step, last_value = by_run[pick.ref].curve[-1]
                out[(stage, seed)] = {"target": last_value, "reference_run": pick.ref, "reference_steps": last_step}
    return out


def seed_targets(by_stage: Dict[Tuple[str, int], Goal]) -> Dict[int, Goal]:
    """One target per seed: the final stage's where a seed ran in both stages."""
    ordered = sorted(by_stage.items(), key=lambda kv: (kv[0][0] == STAGE_FINAL, kv[0][1]))
    return {seed: goal for (_stage, seed), goal in ordered}


def steps_and_speedup(trial: CurveTrial, goal: Goal) -> Tuple[Optional[int], Optional[float]]:
    """``trial``'s steps to ``goal``'s target (``None``: never reached) and its speed-up over the
    reference trial (``None`` without a reference or a step count)."""
    steps = first_step_at_or_below(trial.curve, goal["target"])
    speedup = goal["reference_steps"] / steps if (steps and goal["reference_steps"]) else None
    return steps, speedup
