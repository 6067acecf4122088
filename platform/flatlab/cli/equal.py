"""``flatlab compare --time-to-target``, ``--at-equal passes|seconds`` and ``flatlab curves --cost``: the
compute-based comparisons of one study's final trials, read from MLflow (:mod:`flatlab.tracking.histories`)
and computed by :mod:`flatlab.analysis.time_to_target`, :mod:`flatlab.analysis.equal_compute` and
:mod:`flatlab.analysis.cost_curves`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Mapping, Optional

from flatlab.analysis.compare.profiles import performance_ratios, plot_profiles
from flatlab.analysis.compare.text import markdown_table
from flatlab.analysis.compute_text import at_equal_cells, cell, time_to_target_cells
from flatlab.analysis.console_table import make_table, print_table
from flatlab.analysis.equal_compute import at_equal
from flatlab.analysis.selection import reference_arm
from flatlab.analysis.time_to_target import cost_matrix, time_to_target
from flatlab.cli.app import console
from flatlab.errors import FlatlabError
from flatlab.lazy import lazy
from flatlab.tracking.histories import read_histories
from flatlab.tracking.histories import write_cost_curves as write_curves

pd = lazy("pandas")

UNITS = ("passes", "seconds")


def print_time_to_target(uri: str, study: str, *, reference, target, confidence: float, fmt: str) -> None:
    """The time-to-target table of ``study`` in ``fmt`` (csv: one row per arm)."""
    h, info = read_histories(uri, study)
    ref = reference_arm(h["arm"], reference or info.reference_arm)
    source = "given" if target is not None else "study"
    target = target if target is not None else info.target_metric
    r = time_to_target(
        h, metric=info.metric, reference=ref, target=target, higher_is_better=info.mode != "min",
        confidence=confidence, target_source=source,
    )  # fmt: skip
    if fmt == "csv":
        sys.stdout.write(r.frame().to_csv(index=False))
        return
    _show(f"{study}: time to target", *time_to_target_cells(r), fmt)


def time_profiles(
    uri: str, studies: List[str], *, reference, target, confidence: float, fmt: str, folder: Path
) -> List[Path]:
    """Several studies: each arm's median passes and training seconds to each study's own target (its
    ``target_metric``, else the reference arm's median final value; ``target`` for every study), printed
    as one table per unit, and the performance profiles in each unit saved as PNGs under ``folder``."""
    results = {}
    for study in studies:
        h, info = read_histories(uri, study)
        given = target if target is not None else info.target_metric
        results[study] = time_to_target(
            h, metric=info.metric, reference=reference_arm(h["arm"], reference or info.reference_arm),
            target=given, higher_is_better=info.mode != "min", confidence=confidence,
            target_source="given" if target is not None else "study",
        )  # fmt: skip
    paths = []
    for unit in UNITS:
        m = cost_matrix(results, unit)
        ratios = performance_ratios(m)
        if fmt == "csv":
            both = pd.concat({"median": m, "ratio": ratios}, axis=1)
            sys.stdout.write(f"# {unit}\n" + both.to_csv())
        else:
            body = [[a, *(f"{cell(m.loc[a, w])} ({cell(ratios.loc[a, w])}×)" for w in m.columns)] for a in m.index]
            caption = [f"{w}: {r.metric} target {cell(r.target)} ({r.target_source})" for w, r in results.items()]
            _show(f"median {unit} to target (ratio to the best arm)", ["arm", *m.columns], body, caption, fmt)
        paths.append(plot_profiles(ratios, folder / f"time_profiles_{unit}.png", title=f"time to target in {unit}"))
    return paths


def print_at_equal(
    uri: str, study: str, unit: str, *, reference, confidence: float, margins: Mapping[str, float], fmt: str
) -> None:
    """The equal-compute table of ``study`` in ``unit`` (``passes`` or ``seconds``) in ``fmt``."""
    check_unit(unit, "--at-equal")
    h, info = read_histories(uri, study)
    ref = reference_arm(h["arm"], reference or info.reference_arm)
    r = at_equal(
        h, unit=unit, metric=info.metric, mode=info.mode, reference=ref, margins=margins, confidence=confidence
    )
    if fmt == "csv":
        sys.stdout.write(r.frame().to_csv(index=False))
        return
    _show(f"{study}: at equal {unit}", *at_equal_cells(r), fmt)


def write_cost_curves(
    uri: str, study: str, unit: str, metrics: Optional[List[str]], folder: Path, points: int
) -> List[Path]:
    """Each arm's metric against ``unit``: a CSV and a PNG per metric under ``folder`` (default metrics:
    the study's, the test metrics logged every epoch, the measures over training)."""
    check_unit(unit, "--cost")
    h, info = read_histories(uri, study)
    return write_curves(h, info.metric, folder, units=(unit,), metrics=metrics, points=points, title=study)


def check_unit(unit: str, option: str) -> None:
    """Raises FlatlabError for a unit other than ``passes`` or ``seconds``."""
    if unit not in UNITS:
        raise FlatlabError(f"{option} {unit!r}: expected one of {', '.join(UNITS)}")


def _show(title: str, head: List[str], body: List[List[str]], caption: List[str], fmt: str) -> None:
    if fmt == "table":
        print_table(console, make_table(head, body, title=title, title_justify="left"), "use --format markdown")
        for line in caption:
            console.print(line, soft_wrap=True, markup=False)
        return
    if fmt != "markdown":
        raise FlatlabError(f"--format {fmt!r}: these tables are written as table, markdown or csv")
    sys.stdout.write(f"### {title}\n\n{markdown_table(head, body, left=2)}\n\n")
    sys.stdout.write("".join(f"- {line}\n" for line in caption))
