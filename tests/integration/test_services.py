"""The same commands against real services on 127.0.0.1: an MLflow tracking server and a Ray head."""

import json
import os
import signal
import subprocess
import time

import pytest

from flatlab.tracking import runs, ui
from flatlab.tracking.logged_model import run_model_id
from flatlab_testing import BIN, env, flatlab, free_port, ray_head, run_epoch_hook, wait_http, write_study

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = """
STUDY = Study(
    name="{name}",
    workload="digits",
    workload_params={{"width": 16}},
    arms=(Arm("sgd", space={{"lr": sp.loguniform(0.01, 0.3)}}), Arm("adamw", space={{"lr": 3e-3}})),
    num_trials=1,
    max_epochs=2,
    scheduler="fifo",
)
"""


@pytest.fixture
def mlflow_server(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            str(BIN / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'server.db'}",
            "--artifacts-destination",
            str(tmp_path / "server-art"),
        ],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=240)  # minutes on a loaded machine
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_study_logs_to_a_tracking_server_workers_included(tmp_path, mlflow_server):
    study = write_study(tmp_path / "srv.py", SMALL.format(name="srv"))
    res = flatlab(
        "run", str(study), "--tracking-uri", mlflow_server, "--root", str(tmp_path / "root"), "--num-cpus", "2"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (tmp_path / "root" / "mlflow.db").exists()  # nothing went to the local default
    c = runs.client(mlflow_server)
    exp = c.get_experiment_by_name("srv")
    children = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)
    for r in children:
        assert len(c.get_metric_history(r.info.run_id, "val/accuracy")) == 2
        model_id = run_model_id(c, r.info.run_id)  # the final model: a logged model on the server's store
        tags = r.data.tags
        assert model_id and c.get_logged_model(model_id).name == ui.model_name(
            tags[runs.TAG_ARM], "search", 0, tags[runs.TAG_TRIAL]
        )
    assert "View run" not in res.stdout + res.stderr  # MLflow's per-run URL lines are off
    assert c.get_experiment(exp.experiment_id).tags[runs.TAG_EXPERIMENT_KIND] == "custom_model_development"
    res = flatlab("results", "srv", "--tracking-uri", mlflow_server)
    assert res.returncode == 0 and res.stdout.count("FINISHED") == 2


def test_submit_to_a_local_ray_head(tmp_path):
    dash = free_port()
    # the dashboard agent (which starts submitted jobs) on a free port: Ray's default, 52365, may be another
    # Ray instance's on this machine, and then no job can start ("No available agent to submit job")
    dashboard = ["--num-cpus", "2", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash)]
    dashboard += ["--include-dashboard", "true", "--dashboard-agent-listen-port", str(free_port())]
    with ray_head(*dashboard):
        wait_http(f"http://127.0.0.1:{dash}/api/version", timeout=120)
        work = tmp_path / "work"
        work.mkdir()
        write_study(work / "job.py", SMALL.format(name="job"))
        root = tmp_path / "root"
        res = flatlab(
            "submit",
            "job.py",
            "--address",
            f"http://127.0.0.1:{dash}",
            "--working-dir",
            str(work),
            f"--arg=--root={root}",
            "--follow",
            timeout=600,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        job_id = res.stdout.strip().splitlines()[-1]
        assert job_id.startswith("raysubmit_")
        # --follow exits non-zero unless the job SUCCEEDED
        c = runs.client(runs.default_tracking_uri(root))
        exp = c.get_experiment_by_name("job")
        children = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
        assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)


def test_interrupted_study_resumes_without_rerunning_finished_trials(tmp_path):
    """Ctrl-C (SIGINT to the process group) of a launch with budget overrides, then `--resume` without
    them: the launch's budget is reused (an explicit different one is refused), the rest of the search
    and the final stage run, no epoch is logged twice, and a second `--resume` has nothing left."""
    epochs, n = 10, 3
    study = write_study(
        tmp_path / "res.py",
        """
STUDY = Study(
    name="res",
    workload="digits",
    workload_params={"model": "cnn", "width": 24},
    arms=(Arm("sgd", space={"lr": sp.loguniform(0.01, 0.2)}),),
    num_trials=8,
    max_epochs=40,
    final_seeds=(1, 2, 3),
    scheduler="fifo",
    max_concurrent=1,
)
""",
    )
    root = tmp_path / "root"
    uri = runs.default_tracking_uri(root)
    budget = ["--trials", str(n), "--epochs", str(epochs), "--final-seeds", "1"]
    proc = subprocess.Popen(
        [
            str(BIN / "flatlab"),
            "run",
            str(study),
            "--root",
            str(root),
            "--num-cpus",
            "2",
            *budget,
            "--checkpoint-every",
            "3",
        ],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    finished = []
    while time.monotonic() < deadline:
        time.sleep(1.0)
        if proc.poll() is not None:
            pytest.fail(f"flatlab run exited early ({proc.returncode}):\n{proc.stdout.read()}")
        if (root / "mlflow.db").exists():
            try:
                c = runs.client(uri)
                exp = c.get_experiment_by_name("res")
                if exp:
                    rs = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
                    finished = [r for r in rs if r.info.status == "FINISHED"]
                    if finished:  # the next trial (max_concurrent=1) is mid-way now
                        break
            except Exception:
                pass
    assert finished, "no trial finished before the deadline"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground process group
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "--resume" in out, out
    launch = json.loads((root / "res" / "launch.json").read_text())
    assert launch["status"] == "killed"
    assert launch["overrides"] == {"trials": n, "epochs": epochs, "final_seeds": 1, "tunings": None, "scale": None}
    assert launch["checkpoint_every"] == 3
    c = runs.client(uri)
    exp = c.get_experiment_by_name("res")
    before = {
        r.data.tags[runs.TAG_TRIAL]: r
        for r in c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
    }
    assert all(r.info.status != "RUNNING" for r in before.values())
    done_ids = {t for t, r in before.items() if r.info.status == "FINISHED"}

    refused = flatlab("run", str(study), "--root", str(root), "--resume", "--epochs", "12", timeout=120)
    assert (
        refused.returncode == 2
        and "--epochs 12 differs from the launch being resumed, which ran with --epochs 10" in refused.stderr
    )

    res = flatlab("run", str(study), "--root", str(root), "--resume", "--num-cpus", "2")  # no overrides: the launch's
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"study res: {n} trials, then 1 final-seed trials" in res.stdout, res.stdout
    status_lines = [line for line in res.stdout.splitlines() if " done / " in line]
    assert status_lines and int(status_lines[0].split("trials: ")[1].split(" done")[0]) >= len(done_ids), res.stdout
    assert "already reported" not in res.stdout + res.stderr and "A worker died" not in res.stdout + res.stderr
    after = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
    stages = sorted(r.data.tags[runs.TAG_STAGE] for r in after)
    assert stages == ["final"] + ["search"] * n and all(
        r.info.status == "FINISHED" for r in after
    )  # --final-seeds 1 kept
    parents = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'study'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    for r in after:  # every epoch exactly once, also for the trial interrupted mid-way and resumed
        steps = [m.step for m in c.get_metric_history(r.info.run_id, "epoch")]
        assert steps == list(range(1, epochs + 1)), (r.data.tags[runs.TAG_TRIAL], steps)
        assert [m.step for m in c.get_metric_history(r.info.run_id, "val/accuracy")] == steps
    assert done_ids <= {r.data.tags[runs.TAG_TRIAL] for r in after}  # finished before the interrupt: the same runs
    assert json.loads((root / "res" / "launch.json").read_text())["checkpoint_every"] == 3  # kept by --resume

    again = flatlab(
        "run", str(study), "--root", str(root), "--resume", "--num-cpus", "2"
    )  # the launch has finished now
    assert again.returncode == 0 and "already finished; nothing to resume" in again.stdout, again.stdout + again.stderr
    assert len(c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")) == n + 1


def test_continue_grows_the_previous_launchs_optuna_studies(tmp_path):
    import optuna

    n = 2
    body = """
STUDY = Study(
    name="cont",
    workload="digits",
    workload_params={{"width": 16}},
    arms=(Arm("sgd", space={{"lr": sp.loguniform({low}, 0.3)}}),),
    num_trials={n},
    max_epochs=2,
    scheduler="fifo",
)
"""
    study = write_study(tmp_path / "cont.py", body.format(low=0.01, n=n))
    root = tmp_path / "root"
    cmd = ("run", str(study), "--root", str(root), "--num-cpus", "2")
    missing = flatlab(*cmd, "--continue", timeout=120)
    assert missing.returncode == 2 and "--continue: study 'cont' has no previous launch to continue" in missing.stderr
    first = flatlab(*cmd)
    assert first.returncode == 0, first.stdout + first.stderr
    one = json.loads((root / "cont" / "launch.json").read_text())
    second = flatlab(*cmd, "--continue")
    assert second.returncode == 0, second.stdout + second.stderr
    two = json.loads((root / "cont" / "launch.json").read_text())
    name = f"{one['experiment_name']}.sgd"
    assert two["experiment_name"] != one["experiment_name"] and two["parent_run_id"] != one["parent_run_id"]
    assert two["optuna_studies"] == {"sgd": name} and two["continues"]["experiment_name"] == one["experiment_name"]
    storage = f"sqlite:///{root / 'cont' / 'optuna.db'}"
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == [name]
    trials = optuna.load_study(study_name=name, storage=storage).trials
    assert len(trials) == 2 * n and all(t.state.name == "COMPLETE" for t in trials)
    assert len({t.params["lr"] for t in trials}) == 2 * n  # the continued search drew new points
    parent = runs.client(runs.default_tracking_uri(root)).get_run(two["parent_run_id"])
    assert (
        parent.data.tags["flatlab.optuna_studies"] == name
        and parent.data.tags["flatlab.continues"] == one["parent_run_id"]
    )

    write_study(study, body.format(low=0.001, n=n))  # a changed space cannot continue that study
    changed = flatlab(*cmd, "--continue", timeout=120)
    assert (
        changed.returncode == 2
        and f"arm 'sgd' of study 'cont' searches a different space than the Optuna study '{name}'" in changed.stderr
    )
    assert len(optuna.load_study(study_name=name, storage=storage).trials) == 2 * n


# Imported by every Python process of the test's flatlab run (sitecustomize on PYTHONPATH, inherited by
# Ray's workers): while the marker file exists, every trial raises after its first epoch.
FAIL_AFTER_FIRST_EPOCH = run_epoch_hook(
    "FLATLAB_TEST_FAIL_MARK",
    """
    if self.epoch >= 1 and os.path.exists(VALUE):
        raise RuntimeError("injected trial failure")
    return original(self)
""",
)


def test_resume_retries_errored_trials_from_their_checkpoints(tmp_path):
    epochs = 3
    study = write_study(
        tmp_path / "err.py",
        f"""
STUDY = Study(
    name="err",
    workload="digits",
    workload_params={{"width": 16}},
    arms=(Arm("sgd", space={{"lr": sp.grid([0.05, 0.1])}}),),
    searcher="grid",
    max_epochs={epochs},
    scheduler="fifo",
    max_concurrent=2,
    checkpoint_every=1,  # epoch 1's checkpoint is what the resume starts from
)
""",
    )
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAIL_AFTER_FIRST_EPOCH)
    mark = tmp_path / "fail-now"
    mark.touch()
    e = env()
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), e.get("PYTHONPATH", "")) if p)
    e["FLATLAB_TEST_FAIL_MARK"] = str(mark)
    root = tmp_path / "root"
    cmd = [str(BIN / "flatlab"), "run", str(study), "--root", str(root), "--num-cpus", "2"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600)
    assert first.returncode == 1, first.stdout + first.stderr  # every trial failed: the launch did too
    log = root.resolve() / "err" / "logs" / "flatlab.log"  # the study's log, wherever the command ran
    assert (
        first.stdout.strip().splitlines()[-1]
        == f"every trial of err failed (2 of 2); see {log} and `flatlab results err`"
    )
    assert log.is_file()  # the printed path is the file the launch wrote
    c = runs.client(runs.default_tracking_uri(root))
    exp = c.get_experiment_by_name("err")
    trial_filter = f"tags.`{runs.TAG_ROLE}` = 'trial'"
    failed = c.search_runs([exp.experiment_id], filter_string=trial_filter)
    assert len(failed) == 2 and all(r.info.status == "FAILED" for r in failed)
    assert all(r.data.tags.get(runs.TAG_OUTCOME) == "error" for r in failed)
    launch = json.loads((root / "err" / "launch.json").read_text())
    assert launch["status"] == "finished" and launch["num_errors"] == 2

    mark.unlink()  # the cause is fixed: --resume retries the errored trials from their last checkpoint
    second = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=e, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    after = c.search_runs([exp.experiment_id], filter_string=trial_filter)
    assert {r.info.run_id for r in after} == {r.info.run_id for r in failed}  # the same MLflow runs, reopened
    assert all(r.info.status == "FINISHED" and r.data.tags.get(runs.TAG_OUTCOME) == "completed" for r in after)
    for r in after:  # epoch 1 ran once (restored from its checkpoint), epochs 2..3 after the resume
        assert [m.step for m in c.get_metric_history(r.info.run_id, "epoch")] == list(range(1, epochs + 1))
    launch = json.loads((root / "err" / "launch.json").read_text())
    assert launch["status"] == "finished" and launch["num_errors"] == 0


def test_no_view_run_lines_from_flatlab_clients(mlflow_server, capfd, monkeypatch):
    """MLflow prints "🏃 View run ..." whenever a run on an HTTP server ends; flatlab's clients do not."""
    monkeypatch.delenv(runs.SUPPRESS_URL_ENV, raising=False)
    c = runs.client(mlflow_server)
    exp = runs.get_or_create_experiment(mlflow_server, "quiet")
    c.set_terminated(c.create_run(exp).info.run_id)
    assert "View run" not in capfd.readouterr().out
    monkeypatch.setenv(runs.SUPPRESS_URL_ENV, "false")  # the control: MLflow's own behaviour
    c.set_terminated(c.create_run(exp).info.run_id)
    assert "View run" in capfd.readouterr().out


def test_a_killed_trial_worker_is_one_progress_line(tmp_path):
    """SIGKILL of a trial's worker process (a system failure, as a lost node): the progress line says in one
    line that the trial failed and resumes from its last checkpoint, which Tune does at once; Ray's
    multi-line "A worker died" message stays in logs/flatlab.log."""
    study = write_study(
        tmp_path / "kill.py",
        """
STUDY = Study(
    name="kill",
    workload="digits",
    workload_params={"width": 16},
    arms=(Arm("sgd", space={"lr": sp.loguniform(0.01, 0.3)}),),
    num_trials=2,
    max_epochs=30,
    scheduler="fifo",
    max_concurrent=1,
)
""",
    )
    root = tmp_path / "root"
    proc = subprocess.Popen(
        [str(BIN / "flatlab"), "run", str(study), "--root", str(root), "--num-cpus", "2"],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline, killed = time.monotonic() + 300, None
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1.0)
        ps = subprocess.run(["ps", "-eo", "pid,sid,args"], capture_output=True, text=True).stdout.splitlines()
        for line in ps:  # the trial's actor, in the session of this flatlab run only
            pid, sid, args = (line.split(None, 2) + ["", ""])[:3]
            if sid == str(proc.pid) and args.startswith("ray::run_trial"):
                os.kill(int(pid), signal.SIGKILL)
                killed = pid
                break
    assert killed, "no trial worker found"
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    failed = [line for line in out.splitlines() if line.strip().startswith("failed")]
    assert len(failed) == 1 and "will resume from its last checkpoint" in failed[0], out
    assert "A worker died" not in out and "actor died" in failed[0].lower(), out
    assert "WARNING ray: A worker died or was killed" in (root / "kill" / "logs" / "flatlab.log").read_text()
    c = runs.client(runs.default_tracking_uri(root))
    trials = c.search_runs(
        [c.get_experiment_by_name("kill").experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'"
    )
    assert len(trials) == 2 and all(r.info.status == "FINISHED" for r in trials)  # retried, not failed
    for r in trials:
        assert [m.step for m in c.get_metric_history(r.info.run_id, "epoch")] == list(range(1, 31))
