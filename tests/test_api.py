"""flatlab.run / flatlab.results: exported lazily, options checked before anything starts (the runs
themselves: tests/test_readme_snippet.py and tests/tracking/test_results_query.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

import flatlab
from flatlab import Arm, Study
from flatlab.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
STUDY = Study(name="api", workload="digits", arms=(Arm("sgd", space={"lr": 0.1}),), num_trials=1, max_epochs=1)


def test_import_flatlab_stays_light():
    code = "import sys, flatlab; flatlab.run; flatlab.results; print(sorted(m for m in ('ray', 'mlflow', 'pandas', 'optuna') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO / "platform"), "PATH": ""}).stdout
    assert out.strip() == "[]"
    assert {"run", "results"} <= set(flatlab.__all__)
    with pytest.raises(AttributeError, match="module 'flatlab' has no attribute 'nope'"):
        flatlab.nope  # noqa: B018


def test_options_are_checked_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown option 'trails' \(did you mean 'trials'\?\); valid options: studies, scale, trials"):
        flatlab.run(STUDY, trails=2, root=tmp_path)
    with pytest.raises(ConfigError, match=r"scale= and studies= choose among a study file's studies; this is a Study"):
        flatlab.run(STUDY, scale="smoke", root=tmp_path)
    with pytest.raises(ConfigError, match=r"studies=\['nope'\]: not in .*digits_demo.py; studies there: digits_demo"):
        flatlab.run(REPO / "studies" / "digits_demo.py", studies="nope", root=tmp_path)
    with pytest.raises(ConfigError, match=r"does not exist \(a relative path is read from the working directory"):
        flatlab.run("no/such/study.py", root=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written


def test_results_of_a_missing_store_is_an_error_that_creates_nothing(tmp_path):
    with pytest.raises(ConfigError, match="no MLflow store at"):
        flatlab.results("api", root=tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()
