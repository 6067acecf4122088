"""What a launch runs, for the command line and the Python API alike: :func:`prepare` turns a study file
(or a :class:`~flatlab.study.spec.Study`) and the options given into validated studies at the budget,
scale and checkpoint cadence the launch runs with. ``flatlab run FILE --resume`` and
``flatlab.run(FILE, resume=True)`` both call it (through :func:`flatlab.study.run_file.run_file`), so they
resume alike: at the scale, budget and cadence the launch recorded (:mod:`flatlab.study.launches`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from flatlab.errors import ConfigError
from flatlab.study.launches import BUDGET_KEYS, Launch, launch_file, resume_budget, resume_checkpoint_every
from flatlab.study.loader import _scales, load_module, load_studies
from flatlab.study.placement import missing_resources
from flatlab.study.spec import Study
from flatlab.study.validate import validate

GIVEN_KEYS = BUDGET_KEYS + ("checkpoint_every",)
"""The options :func:`prepare` takes: the budget (:data:`~flatlab.study.launches.BUDGET_KEYS`) and the
checkpoint cadence."""


@dataclass(frozen=True)
class Prepared:
    """A study ready to launch.

    Attributes:
        study: validated, with the launch's budget and checkpoint cadence applied.
        budget: the budget options the launch runs with and records (``overrides`` in launch.json).
    """

    study: Study
    budget: Dict[str, Any]


def prepare(
    source: Union[Study, str, os.PathLike],
    given: Mapping[str, Any],
    root: Path,
    *,
    resume: bool = False,
    continue_: bool = False,
    only: Sequence[str] = (),
) -> List[Prepared]:
    """The studies a launch runs, in the file's order.

    A new launch (and ``continue_``) runs at ``given``'s budget, the file's default scale made explicit.
    ``resume`` runs each study at what its latest launch recorded: the file loaded at that launch's
    scale (:func:`resume_scale`) unless ``scale`` is given, the recorded budget (an option given with
    another value is refused, :func:`~flatlab.study.launches.resume_budget`) and the recorded checkpoint
    cadence unless ``checkpoint_every`` is given.

    Args:
        source: a study file's path, or a :class:`Study`.
        given: the options given (``None`` or absent: not given), keys :data:`GIVEN_KEYS`.
        root: the output root (``<root>/<study>/launch.json``).
        resume, continue_: ``--resume`` / ``--continue``.
        only: run only these studies of the file (``--study``; all when empty).

    Raises:
        ConfigError: ``resume`` with ``continue_``; an unknown option; ``scale`` or ``only`` with a
            :class:`Study`; names in ``only`` the file does not define (listing those it does); a resume
            option that differs from the launch's; any error of loading or validating the studies.
    """
    unknown = sorted(set(given) - set(GIVEN_KEYS))
    if unknown:
        raise ConfigError(f"unknown launch option(s) {', '.join(unknown)}; expected {', '.join(GIVEN_KEYS)}")
    if resume and continue_:
        raise ConfigError(
            "--resume and --continue exclude each other: --resume finishes the latest launch, "
            "--continue starts a new one that adds trials to its Optuna studies"
        )
    scale, every = given.get("scale"), given.get("checkpoint_every")
    if isinstance(source, Study):
        if scale is not None or only:
            raise ConfigError(
                "a scale and a choice of studies (--scale/--study, scale=/studies=) choose among a study "
                "file's studies; this is a Study"
            )
        path, studies, scales = "", [source], ()
    else:
        path = os.fspath(source)
        scales = file_scales(path)
        studies = load_studies(path, scale=scale or (resume_scale(path, root) if resume else None))
        if only:
            known = [s.name for s in studies]
            missing = [n for n in only if n not in known]
            if missing:
                raise ConfigError(
                    f"study {', '.join(map(repr, missing))} is not in {path}; studies there: {', '.join(sorted(known))}"
                )
            studies = [s for s in studies if s.name in only]
    budget = {k: given.get(k) for k in BUDGET_KEYS}
    budget["scale"] = scale or (scales[0] if scales else None)  # a new launch records the scale it ran at
    out = []
    for s in studies:
        recorded = Launch.read(root, s.name) if resume else None
        mine = resume_budget(recorded, dict(budget, scale=scale), s.name) if resume else dict(budget)
        cadence = every if every is not None else resume_checkpoint_every(recorded, s.checkpoint_every, s.name)
        s = dataclasses.replace(s, checkpoint_every=cadence)
        out.append(
            Prepared(
                validate(s.with_budget(mine["trials"], mine["epochs"], mine["final_seeds"], mine.get("tunings")), path),
                mine,
            )
        )
    return out


def file_scales(path: str) -> Tuple[str, ...]:
    """The scales a study file defines (``SCALES``, the default first; ``()`` for a file without)."""
    return _scales(path, load_module(path))


def scales_that_fit(path: str, current: Optional[str], cluster: Mapping[str, float]) -> List[str]:
    """The scales of study file ``path`` other than ``current`` (``None``: the default) at which every
    study's trial fits on ``cluster`` (``ray.cluster_resources()``), in the file's order; ``[]`` for a file
    without scales, or one that cannot be loaded (the caller's error is about something else)."""
    try:
        scales = file_scales(path)
        current = current or (scales[0] if scales else None)
        return [
            scale
            for scale in scales
            if scale != current
            and not any(missing_resources(s.resources.request(), cluster) for s in load_studies(path, scale=scale))
        ]
    except (ConfigError, OSError):
        return []


def resume_scale(path: str, root: Path) -> Optional[str]:
    """The scale a ``--resume`` without ``--scale`` loads ``path`` at: the one whose latest launch (of any
    of the file's studies at that scale) is the newest; ``None`` (the default) if none ran or the file
    has no scales.

    Raises:
        ConfigError: the study file cannot be loaded at one of its scales.
    """
    scales = file_scales(path)
    best: Tuple[float, Optional[str]] = (-1.0, None)
    for scale in scales:
        for study in load_studies(path, scale=scale):
            record = Launch.read(root, study.name)
            if record is None:
                continue
            ran = (record.overrides or {}).get("scale") or scales[0]
            mtime = launch_file(root, study.name).stat().st_mtime
            if ran == scale and mtime > best[0]:
                best = (mtime, scale)
    return best[1]
