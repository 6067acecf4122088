"""A language-model budget stated in optimizer steps, expressed in epochs (the unit a study has).

Not a study file (``flatlab studies`` skips names that start with ``_``); the IRE language-model study
files import :func:`step_budget` from here.

The IRE paper states its language-model budgets and warm-ups in optimizer steps (Fig. 3: 100k steps,
3k warm-up; Fig. 4: 50k/100k, 30k/60k and 50k/100k steps). A study's budget is ``max_epochs``, and an
``lm/*`` epoch is one pass over the training tokens, so the number of steps per epoch follows from the
corpus's token count. To make a step budget exact without knowing that count, the training stream is cut
to exactly ``steps_per_epoch`` batches of windows (workload parameter ``max_train_tokens``): with
``N = steps_per_epoch x batch`` windows of ``context`` tokens, the stream needs ``N x context + 1`` tokens
(the targets are the windows shifted by one token, :class:`flatlab.workloads.lm.TokenWindows`), and the
trainer then runs ``ceil(N / batch) = steps_per_epoch`` steps an epoch. The tokens past the cut are not
trained on; each study file says how much of its corpus that leaves out. A step budget in the study
itself (the compute-budget feature) will replace this arithmetic.
"""

from __future__ import annotations

from typing import Any, Dict


def step_budget(steps: int, warmup_steps: int, batch: int, context: int, epochs: int) -> Dict[str, Any]:
    """``steps`` optimizer steps as ``epochs`` passes over a training stream cut to fit them exactly.

    Args:
        steps: the paper's budget in optimizer steps; must be a multiple of ``epochs``.
        warmup_steps: the paper's linear warm-up in optimizer steps (0 <= warmup_steps < steps).
        batch: sequences per optimizer step.
        context: tokens per sequence.
        epochs: passes over the cut stream.

    Returns:
        ``{"max_epochs": epochs, "max_train_tokens": steps // epochs * batch * context + 1,
        "warmup_epochs": warmup_steps / (steps // epochs), "steps_per_epoch": steps // epochs}``: the first
        is the study's ``max_epochs``, the second a workload parameter, the third a trainer parameter.

    Raises:
        ValueError: ``steps`` is not a positive multiple of ``epochs``, or the warm-up is not shorter than the
            budget.
    """
    if epochs < 1 or steps < epochs or steps % epochs:
        raise ValueError(f"steps={steps} must be a positive multiple of epochs={epochs}")
    if not 0 <= warmup_steps < steps:
        raise ValueError(f"warmup_steps={warmup_steps} must be in [0, steps={steps})")
    per_epoch = steps // epochs
    return {
        "max_epochs": epochs,
        "max_train_tokens": per_epoch * batch * context + 1,
        "warmup_epochs": warmup_steps / per_epoch,
        "steps_per_epoch": per_epoch,
    }
