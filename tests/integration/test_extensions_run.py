"""The example of a study's own workload, optimizer and flatness measure (studies/examples/extensions.py)
through the commands a user runs on a local Ray: --dry-run, run (killed mid-way), --resume. Its trials run
in Ray workers that never imported the study file or the module next to it."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from flatlab.tracking import runs
from flatlab_testing import BIN, EXAMPLES, check_extensions_run, env, flatlab

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def finished_trials(root: Path) -> int:
    try:
        c = runs.client(runs.default_tracking_uri(root))
        exp = c.get_experiment_by_name("extensions_demo")
        return (
            len(
                c.search_runs(
                    [exp.experiment_id],
                    filter_string=f"attributes.status = 'FINISHED' and tags.`{runs.TAG_ROLE}` = 'trial'",
                )
            )
            if exp
            else 0
        )
    except Exception:  # the store is being created
        return 0


def test_the_extension_example_runs_dry_runs_and_resumes(tmp_path):
    work = tmp_path / "work"  # the study file and the module next to it, as a user keeps them
    shutil.copytree(EXAMPLES, work, ignore=shutil.ignore_patterns("__pycache__"))
    study, root = str(work / "extensions.py"), tmp_path / "root"

    dry = flatlab("run", study, "--dry-run", "--root", str(root))
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "workload two_moons" in dry.stdout and "lr ~ loguniform(0.0001, 0.003)" in dry.stdout
    assert not root.exists()

    # killed once a trial has finished; the resume runs the rest (the study file is loaded again)
    cmd = [str(BIN / "flatlab"), "run", study, "--root", str(root), "--num-cpus", "2"]
    proc = subprocess.Popen(
        cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 400
    while not finished_trials(root):
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "no trial finished"
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    res = flatlab("run", study, "--root", str(root), "--resume", "--num-cpus", "2")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "failed" not in res.stdout.splitlines()[-1]
    check_extensions_run(root, tmp_path)

    again = flatlab("run", study, "--root", str(root), "--resume", "--num-cpus", "2")
    assert again.returncode == 0 and "already finished; nothing to resume" in again.stdout, again.stdout + again.stderr
    assert json.loads((root / "extensions_demo" / "launch.json").read_text())["status"] == "finished"
