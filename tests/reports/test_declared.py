"""Reports a study asks for (``Study.reports``): validation before anything runs, and the runner's
post-study step running each declared report, a failing one reported without costing the others."""

from __future__ import annotations

from pathlib import Path

import pytest

import flatlab.interpolation.report  # noqa: F401 (registers the interpolation report)
from flatlab import Arm, Study
from flatlab.analysis.sample import Sample
from flatlab.errors import ConfigError
from flatlab.reports import declared as reports
from flatlab.reports.declared import REPORTS, StudyReport, resolve_reports, run_reports
from flatlab.study.validate import validate


def toy_study(**reports_):
    return Study(
        name="toy",
        workload="toy/ire_fig1",
        arms=(Arm("sgd", space={"lr": 0.1}),),
        metric="val/loss",
        mode="min",
        searcher="grid",
        scheduler="fifo",
        max_epochs=1,
        reports=reports_,
    )


def test_the_declaration_is_resolved_with_its_defaults():
    assert {"toy_figure", "interpolation"} <= set(REPORTS.names())
    assert resolve_reports({"interpolation": {}}, "s") == {"interpolation": {"split": "ood"}}
    got = resolve_reports({"toy_figure": {"end": "val/abs_u", "flatness": "val/trace_hessian"}}, "s")
    assert got == {"toy_figure": {"end": "val/abs_u", "flatness": "val/trace_hessian"}}


def test_every_problem_is_named_before_anything_runs():
    with pytest.raises(ConfigError) as err:
        validate(toy_study(toy_figur={}, toy_figure={"end": "val/abs_u"}, interpolation={"split": 3, "alpha": 1}))
    lines = str(err.value).splitlines()
    assert lines[0] == "invalid study:"
    assert (
        "  study 'toy': reports: unknown report 'toy_figur' (did you mean 'toy_figure'?); valid reports: "
        in "\n".join(lines)
    )
    assert "  study 'toy': reports: toy_figure needs flatness (the flatness metric, e.g. val/trace_hessian)" in lines
    assert any(
        line.startswith("  study 'toy': reports: interpolation: unknown parameter(s) alpha; accepted: split")
        for line in lines
    )
    assert "  study 'toy': reports: interpolation: split=3 is not allowed; expected any str" in lines
    with pytest.raises(ConfigError, match=r"s: reports must be a mapping \{report name: \{param: value\}\}"):
        resolve_reports(["toy_figure"], "s")
    assert validate(toy_study()).reports == {}


def test_run_reports_runs_each_declared_report_and_survives_a_failing_one(monkeypatch, tmp_path):
    import pandas as pd

    calls = []

    def ok(report, params):
        calls.append(
            (report.tracking_uri, report.study, report.out_dir, report.parent_run_id, report.trials, dict(params))
        )
        return [f"ok: {params['n']} in {report.out_dir.name}"]

    def broken(report, params):
        raise RuntimeError("no trials")

    monkeypatch.setitem(REPORTS._entries, "ok", StudyReport("ok", "test", ok, hparams=(reports.HParam("n", 1, int),)))
    monkeypatch.setitem(REPORTS._entries, "broken", StudyReport("broken", "test", broken))

    class Console:
        lines = []

        def print(self, text):
            self.lines.append(text)

    console = Console()
    study = toy_study(broken={}, ok={"n": 2})
    sample = Sample.of(pd.DataFrame({"arm": ["sgd"], "run_id": ["r1"], "outcome": ["completed"]}))
    assert run_reports(study, "sqlite:///x.db", tmp_path / "report", "p1", sample, console) == ["ok: 2 in report"]
    assert len(calls) == 1 and calls[0][4] is sample.trials  # the sample's trials, as they are: no read
    assert calls[0][:4] + calls[0][5:] == ("sqlite:///x.db", "toy", tmp_path / "report", "p1", {"n": 2})
    assert console.lines == [
        "[yellow]warning:[/yellow] report 'broken' of study 'toy' failed: no trials",
        "ok: 2 in report",
    ]
    assert run_reports(toy_study(), "sqlite:///x.db", Path(tmp_path), "p1", sample, console) == []
    assert run_reports(toy_study(oops={}), "sqlite:///x.db", Path(tmp_path), "p1", sample, console) == []  # unvalidated
    assert console.lines[-1].startswith(
        "[yellow]warning:[/yellow] no reports run: study 'toy': reports: unknown report 'oops'"
    )
