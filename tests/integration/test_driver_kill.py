"""`flatlab run` killed with SIGKILL (a dead head node, an out-of-memory kill, a closed laptop) at several
moments, each time resumed with `--resume`: in the end MLflow holds exactly one run per trial and none
RUNNING, Optuna exactly `num_trials` trials per arm and none RUNNING, no epoch is logged twice, and a trial
that finished before a kill is left as it was."""

import json
import os
import signal
import subprocess
import time

import pytest

from flatlab.tracking import runs
from flatlab_testing import BIN, assert_final_stage_ran_the_best_search_trial, env, write_study

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRIALS = f"tags.`{runs.TAG_ROLE}` = 'trial'"
N, EPOCHS, FINAL = 6, 6, 2


def records(root):
    """``(client, experiment, trial runs)`` of study ``kill9`` (``(None, None, [])`` before it exists)."""
    try:
        c = runs.client(runs.default_tracking_uri(root))
        exp = c.get_experiment_by_name("kill9")
        return c, exp, (c.search_runs([exp.experiment_id], filter_string=TRIALS) if exp else [])
    except Exception:  # the store is being created
        return None, None, []


def killed_env():
    """Tune saves its experiment only when it must (a trial's second checkpoint): what MLflow and Optuna
    record runs well ahead of it, as after a kill at the worst moment."""
    return {**env(), "TUNE_GLOBAL_CHECKPOINT_S": "3600"}


def launch_until(cmd, root, moment, what, timeout=400):
    """Start ``cmd``; SIGKILL it (and the Ray processes of its session, as a dead machine would take
    them) as soon as ``moment(root)`` holds. Returns the output."""
    proc = subprocess.Popen(
        cmd, env=killed_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    deadline = time.monotonic() + timeout
    while not moment(root):
        if proc.poll() is not None:
            pytest.fail(f"flatlab run ended ({proc.returncode}) before {what}:\n{proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever Ray left of that session
    except ProcessLookupError:
        pass
    assert proc.returncode == -signal.SIGKILL
    return out


def at_start_up(root):
    return (root / "kill9" / "launch.json").exists()


def with_trials_running(root):
    _, _, rs = records(root)
    return any(r.info.status == "RUNNING" and r.data.metrics.get("epoch", 0) >= 2 for r in rs)


def between_trials(root):
    _, _, rs = records(root)  # the moment a trial ends, the next one is being asked for and started
    return sum(r.info.status == "FINISHED" for r in rs) >= 3


def in_the_final_stage(root):
    _, _, rs = records(root)
    return any(r.data.tags.get(runs.TAG_STAGE) == "final" for r in rs)


def snapshot(root):
    """Each finished trial run: its end time and epoch history (what must stay as it was)."""
    c, _, rs = records(root)
    return {
        r.info.run_id: (
            r.info.end_time,
            [(m.step, m.value) for m in c.get_metric_history(r.info.run_id, "val/accuracy")],
        )
        for r in rs
        if r.info.status == "FINISHED"
    }


def test_sigkill_at_four_moments_then_resume_leaves_exact_records(tmp_path):
    import optuna

    study = write_study(
        tmp_path / "kill9.py",
        f"""
import time

from flatlab.workloads.digits import Digits
from flatlab.workloads.registry import register_workload


@register_workload
class SlowDigits(Digits):
    \"\"\"Digits whose every evaluation takes 0.3 s more: a trial stays RUNNING for seconds after its
    second epoch reaches MLflow, so the kill "with a trial mid-way" finds one however fast the machine
    (plain digits trials of width 16 finished the whole launch in 14 s before the test looked).\"\"\"

    name = "slow_digits"

    def evaluate(self, model, split, batch_size=512):
        time.sleep(0.3)
        return super().evaluate(model, split, batch_size)


STUDY = Study(
    name="kill9",
    workload="slow_digits",
    workload_params={{"width": 16}},
    arms=(Arm("sgd", space={{"lr": sp.loguniform(0.02, 0.3)}}),),
    num_trials={N},
    max_epochs={EPOCHS},
    final_seeds=tuple(range(1, {FINAL} + 1)),
    scheduler="fifo",
    max_concurrent=2,
)
""",
    )
    root = tmp_path / "root"
    run = [str(BIN / "flatlab"), "run", str(study), "--root", str(root), "--num-cpus", "2"]
    finished = {}
    for moment, what, resume in (
        (at_start_up, "start-up", False),
        (with_trials_running, "a trial mid-way", True),
        (between_trials, "a third finished trial", True),
        (in_the_final_stage, "the final stage", True),
    ):
        launch_until(run + (["--resume"] if resume else []), root, moment, what)
        before = snapshot(root)
        for run_id, kept in finished.items():  # finished before an earlier kill: as it was
            assert before[run_id] == kept, run_id
        finished.update(before)
    res = subprocess.run(run + ["--resume"], capture_output=True, text=True, env=env(), timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]

    c, exp, trials = records(root)
    stages = sorted(r.data.tags[runs.TAG_STAGE] for r in trials)
    assert stages == ["final"] * FINAL + ["search"] * N, stages  # one run per trial
    assert all(r.info.status == "FINISHED" for r in trials), [
        (r.data.tags[runs.TAG_TRIAL], r.info.status) for r in trials
    ]
    assert len({r.data.tags[runs.TAG_TRIAL] for r in trials}) == N + FINAL
    for r in trials:  # every epoch once
        assert [m.step for m in c.get_metric_history(r.info.run_id, "epoch")] == list(range(1, EPOCHS + 1)), r.data.tags
    after = snapshot(root)
    for run_id, kept in finished.items():  # finished before a kill: untouched by the resumes
        assert after[run_id] == kept, run_id
    assert_final_stage_ran_the_best_search_trial(trials)
    parents = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'study'")
    assert [p.info.status for p in parents] == ["FINISHED"]
    launch = json.loads((root / "kill9" / "launch.json").read_text())
    optuna_trials = optuna.load_study(
        study_name=launch["optuna_studies"]["sgd"], storage=f"sqlite:///{root / 'kill9' / 'optuna.db'}"
    ).trials
    assert len(optuna_trials) == N and all(t.state.name == "COMPLETE" for t in optuna_trials), [
        (t.number, t.state.name) for t in optuna_trials
    ]
    search_runs = {r.info.run_id for r in trials if r.data.tags[runs.TAG_STAGE] == "search"}
    assert {t.user_attrs["mlflow_run_id"] for t in optuna_trials} == search_runs
