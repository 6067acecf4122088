"""A study file's studies launched one after the other, for ``flatlab run`` and :func:`flatlab.run` alike
(:func:`run_file`): one sequence, so the command line and the Python API prepare, check, launch and resume
the same way."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, List, Mapping, Optional

from flatlab.lazy import lazy
from flatlab.study.options import RunOptions, StudyOutcome
from flatlab.study.prepare import prepare
from flatlab.study.spec import Study

# Ray, MLflow and Optuna load with the runner, once the checks passed: a dry run starts without them
runner = lazy("flatlab.study.runner")


def run_file(
    source: Any,
    given: Mapping[str, Any],
    opts: RunOptions,
    *,
    only: Iterable[str] = (),
    console: Any = None,
    check: Optional[Callable[[List[Study]], bool]] = None,
    report: Optional[Callable[[Study, StudyOutcome], None]] = None,
) -> List[StudyOutcome]:
    """Launch the studies of a study file (or one :class:`Study`), one after the other, as ``flatlab run``
    and :func:`flatlab.run` do: each prepared at its budget (:func:`~flatlab.study.prepare.prepare`; for
    ``opts.resume``, the launch's recorded scale, budget and checkpoint cadence), then run
    (:func:`flatlab.study.runner.run_study`) with its budget as ``opts.overrides``; stops after an
    interrupted launch.

    Args:
        source: a study file's path, or a :class:`Study`.
        given: the budget options given (``trials``, ``epochs``, ``final_seeds``, ``tunings``, ``scale``,
            ``checkpoint_every``; ``None`` where not given).
        opts: how to run them (``opts.root``, ``opts.resume`` and ``opts.continue_`` steer the preparation too).
        only: run only these studies of the file.
        check: called with the prepared studies before any launch; ``False`` launches none (a dry run).
        report: called with each study and its outcome once its launch ended.

    Returns:
        The outcomes of the launches run, in the file's order.

    Raises:
        ConfigError: as :func:`~flatlab.study.prepare.prepare` and
            :meth:`~flatlab.study.runner.StudyLaunch.run`, and whatever ``check`` raises.
    """
    prepared = prepare(source, dict(given), opts.root, resume=opts.resume, continue_=opts.continue_, only=list(only))
    if check is not None and check([p.study for p in prepared]) is False:
        return []
    outcomes: List[StudyOutcome] = []
    for p in prepared:
        outcome = runner.run_study(p.study, dataclasses.replace(opts, overrides=p.budget), console=console)
        outcomes.append(outcome)
        if report is not None:
            report(p.study, outcome)
        if outcome.interrupted:
            break
    return outcomes
