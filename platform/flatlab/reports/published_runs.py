"""flatlab's side of a published-curve comparison, read from MLflow (``flatlab curves``).

Per arm, the runs ``flatlab compare`` is over (:func:`flatlab.analysis.compare.select_sample`: the
final-stage trials, else each arm's best configuration with all its seeds), their per-epoch history of
each compared metric (MLflow step = epoch), as the long table :func:`flatlab.analysis.published.compare_curves`
takes. The study's declared reference (``Study(published=...)``) is recorded on its launch run as the
param ``published`` (:func:`launch_param`), so ``flatlab curves STUDY`` finds it without the study file,
also once the recorded file has moved (:func:`reference_curves`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from flatlab.analysis.compare import select_sample
from flatlab.analysis.curve_sets import CurveSet, Published, load_curves
from flatlab.analysis.published import (
    CONFIDENCE,
    CurveComparison,
    checkout_path,
    compare_curves,
    summary_lines,
    to_markdown,
)
from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.ranges import NO_RANGES, Ranges
from flatlab.tracking import runs
from flatlab.tracking.trials import parent_runs, trials_frame

pd = lazy("pandas")

PARAM = "published"


def launch_param(published: Optional[Published]) -> Dict[str, str]:
    """The launch run's param recording a study's published reference (``{}`` when it has none): the JSON
    of ``{"path", "arms", "citation"}``, the path made absolute (a study built in Python may give one
    relative to the working directory), the citation read from the file (the reference's identity,
    :func:`reference_curves`).

    Raises:
        ConfigError: the file is missing or invalid (a validated study's is neither).
    """
    if published is None:
        return {}
    path = str(Path(published.path).expanduser().resolve())
    record = {**Published(path, published.arms).as_dict(), "citation": load_curves(path).citation}
    return {PARAM: json.dumps(record, sort_keys=True)}


def launch_record(tracking_uri: str, study: str) -> Optional[Dict[str, Any]]:
    """What the latest launch of ``study`` recorded of its published reference (:func:`launch_param`):
    ``{"path": str, "arms": {arm: curve}, "citation": str or None}`` (launches before the citation was
    recorded: ``None``), or ``None`` when it declared none.

    Raises:
        ConfigError: unknown study; a recorded value that is not the JSON :func:`launch_param` writes.
    """
    parents = parent_runs(tracking_uri, study)
    raw = parents[0].data.params.get(PARAM) if parents else None
    if not raw:
        return None
    try:
        d = json.loads(raw)
        citation = d.get("citation")
        return {
            "path": str(d["path"]),
            "arms": dict(d["arms"]),
            "citation": None if citation is None else str(citation),
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"study {study!r}: its launch's param {PARAM!r}={raw!r} is not a recorded reference ({exc})"
        ) from None


def declared_reference(tracking_uri: str, study: str) -> Optional[Published]:
    """The published reference the latest launch of ``study`` declared (its recorded path), or ``None``.

    Raises:
        ConfigError: as :func:`launch_record`.
    """
    record = launch_record(tracking_uri, study)
    return None if record is None else Published(record["path"], record["arms"])


def reference_curves(record: Mapping[str, Any], study: str, cwd: Any = None) -> Tuple[CurveSet, Optional[str]]:
    """The curve-set file a launch ``record`` (:func:`launch_record`) names, read; also after it moved.

    The recorded path is absolute, a folder of the checkout the study ran from, which may since be gone.
    If it does not exist, the same file is looked for in the checkout at the working directory ``cwd``
    (default: the current one): ``cwd / checkout_path(recorded)``, e.g.
    ``studies/published/deepobs_fmnist_2c2d.json`` (:func:`flatlab.analysis.published.checkout_path`).
    That file is used only if it is the same reference: it holds every curve the launch's arms were
    mapped to and, where the launch recorded the citation, cites the same work.

    Returns:
        ``(curves, note)``: the file read, and ``None``, or when the fallback is used a one-line note
        naming both paths.
    Raises:
        ConfigError: neither file exists (naming both and ``--published FILE``); the fallback is another
            reference (naming what differs); the file is invalid (:func:`~flatlab.analysis.curve_sets.load_curves`).
    """
    recorded = Path(record["path"]).expanduser()
    if recorded.is_file():
        return load_curves(str(recorded)), None
    fallback = Path(cwd if cwd is not None else os.getcwd()).expanduser().resolve() / checkout_path(recorded)
    gone = f"study {study!r}: the curve-set file its launch recorded, {recorded}, does not exist"
    if not fallback.is_file():
        raise ConfigError(
            f"{gone}, nor does {fallback} (the same file under the working directory); "
            "give the file with --published FILE"
        )
    curves = load_curves(str(fallback))
    differs = []
    if record.get("citation") is not None and curves.citation != record["citation"]:
        differs.append(f"it cites {curves.citation!r}, the launch's file {record['citation']!r}")
    missing = sorted(set(record["arms"].values()) - set(curves.curves))
    if missing:
        differs.append(f"it has no curve {', '.join(missing)} (curves: {', '.join(curves.curves)})")
    if differs:
        raise ConfigError(
            f"{gone}, and {fallback} is another reference: {'; '.join(differs)}; give the file with --published FILE"
        )
    return curves, f"note: the curve-set file recorded at launch, {recorded}, is missing; using {fallback} instead"


def epoch_values(
    tracking_uri: str, trials: Any, metrics: Sequence[str], arms: Optional[Sequence[str]] = None
) -> Tuple[Any, List[str]]:
    """Per-epoch values of ``metrics`` of the compared runs among ``trials`` (a
    :func:`~flatlab.tracking.trials.trials_frame` table of the runs in ``tracking_uri``).

    Returns:
        ``(frame, notes)``: a DataFrame with columns ``arm``, ``seed``, ``metric``, ``epoch``, ``value``
        (the last value logged at each step, finite values only; a summary value, which MLflow holds at
        step 0, at the run's last epoch) over the completed runs of
        :func:`~flatlab.analysis.compare.select_sample` (only ``arms`` if given), and notes on runs left out.
    Raises:
        ConfigError: no trials.
    """
    sample, source, notes = select_sample(trials)
    if arms is not None:
        sample = sample[sample["arm"].isin(list(arms))]
    done = sample["outcome"] == "completed" if "outcome" in sample else pd.Series(True, index=sample.index)
    left = sample[~done]
    if len(left):
        notes.append(
            "not completed, left out: "
            + ", ".join(f"{a} seed {s} ({o})" for a, s, o in left[["arm", "seed", "outcome"]].itertuples(index=False))
            + "."
        )
    client = runs.client(tracking_uri)
    rows = []
    for r in sample[done].itertuples(index=False):
        for metric in metrics:
            history = sorted(client.get_metric_history(r.run_id, metric), key=lambda m: m.timestamp)
            last = {m.step: m.value for m in history}  # a re-run epoch (resumed trial): its last value
            if set(last) == {0} and getattr(r, "epochs", 0):  # a summary value (step 0): the final model's
                last = {int(r.epochs): last[0]}
            rows += [
                {"arm": r.arm, "seed": r.seed, "metric": metric, "epoch": int(step), "value": float(v)}
                for step, v in sorted(last.items())
                if math.isfinite(v)
            ]
    notes.insert(0, f"flatlab: the {source} runs of each arm ({int(done.sum())} completed).")
    return pd.DataFrame(rows, columns=["arm", "seed", "metric", "epoch", "value"]), notes


def resolve_arms(
    published: Optional[Published],
    curve_names: Sequence[str],
    study_arms: Sequence[str],
    given: Optional[Mapping[str, str]] = None,
) -> Dict[str, str]:
    """The arm -> curve mapping to compare: ``given`` (``--map``), else the declared one (its arms that
    ran and whose curves the file holds), else every arm whose name is also a curve name.

    Raises:
        ConfigError: no arm maps to a curve of the file (the message lists both and the fix).
    """
    if given:
        return dict(given)
    declared = dict(published.arms) if published is not None else {}
    mapping = {a: c for a, c in declared.items() if a in study_arms and c in curve_names}
    if not mapping:
        mapping = {a: a for a in study_arms if a in curve_names}
    if not mapping:
        raise ConfigError(
            f"no arm of the study maps to a curve of the file; arms: {', '.join(study_arms) or '(none)'}; curves: "
            f"{', '.join(curve_names)}; name them with --map ARM=CURVE (or Study(published=Published(path, "
            "arms={...})))"
        )
    return mapping


def compare_study(
    tracking_uri: str,
    study: str,
    *,
    path: Optional[str] = None,
    arms: Optional[Mapping[str, str]] = None,
    metrics: Optional[Sequence[str]] = None,
    epochs: Optional[Sequence[int]] = None,
    confidence: float = CONFIDENCE,
    ranges_of: Callable[[Optional[str]], Ranges] = lambda workload: NO_RANGES,
    trials: Any = None,
) -> CurveComparison:
    """``flatlab curves``: the latest launch of ``study`` beside its published reference.

    Args:
        path: a curve-set file (default: the one the study's launch recorded, :func:`reference_curves`;
            its note, when the recorded file has moved, goes to stderr).
        arms: arm -> curve (default: :func:`resolve_arms`).
        metrics, epochs, confidence: as :func:`~flatlab.analysis.published.compare_curves`.
        ranges_of: the study's workload name -> the values its metrics can take
            (:func:`flatlab.workloads.ranges.ranges_of`; default: losses unbounded).
        trials: the latest launch's trials table when the caller has read them (the post-study pipeline);
            else read here (:func:`~flatlab.tracking.trials.trials_frame`).
    Raises:
        ConfigError: no reference declared and no ``path``; the recorded file gone and no same one under
            the working directory; an invalid file; no arm that maps to a curve; an unknown metric;
            unknown study.
    """
    record = launch_record(tracking_uri, study)
    declared = None if record is None else Published(record["path"], record["arms"])
    if path is not None:
        curves = load_curves(path)
    elif record is None:
        raise ConfigError(
            f"study {study!r} declares no published reference (Study(published=...)); give one with --published FILE"
        )
    else:
        curves, note = reference_curves(record, study)
        if note:
            print(note, file=sys.stderr)
    compared = list(metrics) if metrics else list(curves.compared())
    unknown = [m for m in compared if m not in curves.compared()]
    if unknown:
        raise ConfigError(
            f"metric(s) {', '.join(unknown)} not in {curves.path}; it maps {', '.join(curves.compared())}"
        )
    trials = trials if trials is not None else trials_frame(tracking_uri, study)
    mapping = resolve_arms(declared, list(curves.curves), sorted(set(trials["arm"])), arms)
    values, notes = epoch_values(tracking_uri, trials, compared, arms=list(mapping))
    result = compare_curves(
        curves,
        values,
        mapping,
        metrics=compared,
        epochs=epochs,
        confidence=confidence,
        ranges=ranges_of(trials.attrs.get("workload")),
    )
    return CurveComparison(result.rows, result.summary, tuple(notes) + result.notes, result.curves, result.confidence)


def log_curves(
    tracking_uri: str,
    parent_run_id: str,
    study: Any,
    console: Any = None,
    ranges: Ranges = NO_RANGES,
    trials: Any = None,
) -> List[str]:
    """After a launch of a study that declares a published reference: :func:`compare_study` (over
    ``trials``, the launch's trials as the caller read them) logged to the launch run as
    ``published/curves.md`` and ``published/curves.csv``, and its summary printed to ``console``. Never
    raises: a failure is one warning (every trial is already in MLflow).

    Returns:
        The artifact paths logged.
    """
    logger = logging.getLogger(__name__)
    logged: List[str] = []
    try:
        comparison = compare_study(tracking_uri, study.name, ranges_of=lambda workload: ranges, trials=trials)
        client = runs.client(tracking_uri)
        for name, text in (("curves.md", to_markdown(comparison)), ("curves.csv", comparison.rows.to_csv(index=False))):
            client.log_text(parent_run_id, text, f"published/{name}")
            logged.append(f"published/{name}")
    except Exception as exc:  # noqa: BLE001 - the study's results stand; `flatlab curves` retries
        logger.warning("no published-curve comparison for %s: %s", study.name, exc)
        if console is not None:
            console.print(f"[yellow]warning:[/yellow] no published-curve comparison: {exc}")
        return logged
    if console is not None:
        console.print(f"beside {comparison.curves.title} (`flatlab curves {study.name}` for every epoch):")
        for line in summary_lines(comparison):
            console.print(f"  {line}", soft_wrap=True)
    return logged
