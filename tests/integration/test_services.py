"""The same commands against real services on 127.0.0.1: an MLflow tracking server and a Ray head."""

import json
import os
import signal
import subprocess
import time

import pytest

from flatlab.tracking import runs

from flatlab_testing import BIN, env, flatlab, free_port, wait_http, write_study

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
        [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}", "--artifacts-destination", str(tmp_path / "server-art")],
        env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=90)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_study_logs_to_a_tracking_server_workers_included(tmp_path, mlflow_server):
    study = write_study(tmp_path / "srv.py", SMALL.format(name="srv"))
    res = flatlab("run", str(study), "--tracking-uri", mlflow_server, "--root", str(tmp_path / "root"), "--num-cpus", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (tmp_path / "root" / "mlflow.db").exists()  # nothing went to the local default
    c = runs.client(mlflow_server)
    exp = c.get_experiment_by_name("srv")
    children = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)
    for r in children:
        assert len(c.get_metric_history(r.info.run_id, "val/accuracy")) == 2
        assert [a.path for a in c.list_artifacts(r.info.run_id, "model")] == ["model/model.safetensors"]
    res = flatlab("results", "srv", "--tracking-uri", mlflow_server)
    assert res.returncode == 0 and res.stdout.count("FINISHED") == 2


def test_submit_to_a_local_ray_head(tmp_path):
    gcs, dash = free_port(), free_port()
    e = env()
    start = subprocess.run(
        [str(BIN / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(gcs), "--num-cpus", "2",
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--include-dashboard", "true", "--disable-usage-stats"],
        capture_output=True, text=True, env=e, timeout=180,
    )
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        wait_http(f"http://127.0.0.1:{dash}/api/version", timeout=120)
        work = tmp_path / "work"
        work.mkdir()
        write_study(work / "job.py", SMALL.format(name="job"))
        root = tmp_path / "root"
        res = flatlab("submit", "job.py", "--address", f"http://127.0.0.1:{dash}", "--working-dir", str(work),
                      f"--arg=--root={root}", "--follow", timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr
        job_id = res.stdout.strip().splitlines()[-1]
        assert job_id.startswith("raysubmit_")
        # --follow exits non-zero unless the job SUCCEEDED
        c = runs.client(runs.default_tracking_uri(root))
        exp = c.get_experiment_by_name("job")
        children = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
        assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], capture_output=True, env=e, timeout=120)


def test_interrupted_study_resumes_without_rerunning_finished_trials(tmp_path):
    epochs, n = 10, 3
    study = write_study(tmp_path / "res.py", f"""
STUDY = Study(
    name="res",
    workload="digits",
    workload_params={{"model": "cnn", "width": 24}},
    arms=(Arm("sgd", space={{"lr": sp.loguniform(0.01, 0.2)}}),),
    num_trials={n},
    max_epochs={epochs},
    scheduler="fifo",
    max_concurrent=1,
)
""")
    root = tmp_path / "root"
    uri = runs.default_tracking_uri(root)
    proc = subprocess.Popen([str(BIN / "flatlab"), "run", str(study), "--root", str(root), "--num-cpus", "2"],
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
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
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "--resume" in out, out
    c = runs.client(uri)
    exp = c.get_experiment_by_name("res")
    before = {r.data.tags[runs.TAG_TRIAL]: r for r in c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")}
    assert all(r.info.status != "RUNNING" for r in before.values())
    done_ids = {t for t, r in before.items() if r.info.status == "FINISHED"}

    res = flatlab("run", str(study), "--root", str(root), "--resume", "--num-cpus", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    after = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
    assert len(after) == n and all(r.info.status == "FINISHED" for r in after)
    parents = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'study'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    for r in after:
        steps = [m.step for m in c.get_metric_history(r.info.run_id, "epoch")]
        assert sorted(set(steps)) == list(range(1, epochs + 1))
        if r.data.tags[runs.TAG_TRIAL] in done_ids:
            assert len(steps) == epochs  # finished before the interrupt: not run again

    again = flatlab("run", str(study), "--root", str(root), "--resume", "--num-cpus", "2")  # the launch has finished now
    assert again.returncode == 0 and "already finished; nothing to resume" in again.stdout, again.stdout + again.stderr
    assert len(c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")) == n


# Imported by every Python process of the test's flatlab run (sitecustomize on PYTHONPATH, inherited by
# Ray's workers): while the marker file exists, every trial raises after its first epoch.
FAIL_AFTER_FIRST_EPOCH = '''
import importlib.abc, importlib.util, os, sys

MARK = os.environ.get("FLATLAB_TEST_FAIL_MARK")


class _PatchTrainer(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "flatlab.train.trainer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            original = module.Trainer.run_epoch

            def run_epoch(self):
                if self.epoch >= 1 and os.path.exists(MARK):
                    raise RuntimeError("injected trial failure")
                return original(self)

            module.Trainer.run_epoch = run_epoch

        spec.loader.exec_module = exec_module
        return spec


if MARK:
    sys.meta_path.insert(0, _PatchTrainer())
'''


def test_resume_retries_errored_trials_from_their_checkpoints(tmp_path):
    epochs = 3
    study = write_study(tmp_path / "err.py", f"""
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
""")
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
    assert first.returncode == 0, first.stdout + first.stderr
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
