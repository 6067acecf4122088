"""One-entry listings (`flatlab optimizers tsam`, `flatlab workloads cifar10`) and study paths given
from another working directory."""

import re
from pathlib import Path

from typer.testing import CliRunner

from flatlab.cli.main import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def entries(output):
    """The entry headers of a listing: lines that start with a registered optimizer or workload name."""
    from flatlab.optim.registry import OPTIMIZERS
    from flatlab.workloads.registry import WORKLOADS

    names = set(OPTIMIZERS.names()) | set(WORKLOADS.names())
    return [m.group(1) for m in re.finditer(r"^(\S+)  ", output, re.M) if m.group(1) in names]


def test_one_optimizer():
    everything = runner.invoke(app, ["optimizers"])
    res = runner.invoke(app, ["optimizers", "tsam"])
    assert res.exit_code == 0, res.output
    from flatlab.optim.registry import OPTIMIZERS

    assert entries(res.output) == ["tsam"] and entries(everything.output) == sorted(OPTIMIZERS.names())
    assert "rho" in res.output and "kappa" not in res.output  # TSAM's table, not IRE's
    res = runner.invoke(app, ["optimizers", "tsm"])
    assert res.exit_code == 2 and re.search(
        r"unknown optimizer 'tsm' \(did you mean 'tsam'.*valid optimizers: adamw,", res.output
    )


def test_one_workload_a_family_and_the_trainer():
    everything = runner.invoke(app, ["workloads"])
    res = runner.invoke(app, ["workloads", "cifar10"])
    assert res.exit_code == 0, res.output
    assert entries(res.output) == ["cifar10"] and "label_noise" in res.output
    assert "micro_batch_size" not in res.output and "flatlab workloads trainer" in res.output  # no trainer table
    assert len(res.output.splitlines()) < len(everything.output.splitlines()) / 10
    res = runner.invoke(app, ["workloads", "glue"])
    assert entries(res.output) == [
        f"glue/{t}" for t in ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb", "wnli")
    ]
    res = runner.invoke(app, ["workloads", "trainer"])
    assert res.exit_code == 0 and "micro_batch_size" in res.output and entries(res.output) == []
    res = runner.invoke(app, ["workloads", "cifar"])
    assert res.exit_code == 2 and re.search(
        r"unknown workload 'cifar' \(did you mean 'cifar10' or 'cifar100'\?\)", res.output
    )


def test_a_study_file_outside_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["run", str(REPO / "studies/digits_demo.py"), "--dry-run"])  # absolute: works
    assert res.exit_code == 0 and "digits_demo" in res.output
    relative = Path("..") / Path(*[".."] * (len(tmp_path.parts) - 2)) / REPO.relative_to("/") / "studies/digits_demo.py"
    res = runner.invoke(app, ["run", str(relative), "--dry-run"])  # relative to another folder: works too
    assert res.exit_code == 0 and "digits_demo" in res.output
    res = runner.invoke(app, ["run", "studies/digits_demo.py", "--dry-run"])  # relative to the checkout, not here
    text = " ".join(res.output.split())
    assert res.exit_code == 2
    assert (
        "study file 'studies/digits_demo.py' does not exist "
        f"(a relative path is read from the working directory {tmp_path})" in text
    )
    assert f"did you mean {REPO / 'studies' / 'digits_demo.py'}?" in text
    res = runner.invoke(app, ["run", "nowhere.py", "--dry-run"])
    assert res.exit_code == 2 and "give its absolute path, or run from the folder it is relative to" in " ".join(
        res.output.split()
    )


def test_a_misspelt_study_file_gets_the_closest_name(tmp_path, monkeypatch):
    def error(path):
        res = runner.invoke(app, ["run", path, "--dry-run"])
        assert res.exit_code == 2
        return " ".join(res.output.split())

    monkeypatch.chdir(REPO)
    assert error("studies/digit_demo.py") == (
        "error: study file 'studies/digit_demo.py' does not exist; did you mean studies/digits_demo.py?"
    )
    assert error(str(REPO / "studies/digit_demo.py")).endswith(f"; did you mean {REPO / 'studies/digits_demo.py'}?")
    monkeypatch.chdir(tmp_path)  # the project's studies/ answer a path that is not here
    assert error("studies/digit_demo.py") == (
        f"error: study file 'studies/digit_demo.py' does not exist (a relative path is read from the working directory "
        f"{tmp_path}); did you mean {REPO / 'studies/digits_demo.py'}?"
    )
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "alpha_sweep.py").write_text("STUDY = None\n")
    assert error("mine/alpa_sweep.py").endswith("; did you mean mine/alpha_sweep.py?")  # the given folder first
    assert error("mine/zzz.py").endswith(
        "give its absolute path, or run from the folder it is relative to"
    )  # nothing close
