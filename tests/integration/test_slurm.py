"""deploy/slurm/flatlab.sbatch on a real SLURM (:mod:`local_slurm`: slurmctld, slurmd and munged on
127.0.0.1): a small digits study is submitted and cancelled with ``scancel`` in the middle of its
search; resubmitted with ``--resume`` and stopped by USR1 (what ``--signal=B:USR1@300`` sends before the
time limit); and resubmitted with ``--resume`` again. The MLflow store then holds every trial once, none
RUNNING, the Optuna studies their budget, and no process of any of the jobs is left.

Without SLURM the test skips, saying why; with ``FLATLAB_REQUIRE_SLURM=1`` (``.ci/run``) it fails
instead."""

import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from flatlab_testing import env, write_study
from local_slurm import LocalSlurm, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "slurm" / "flatlab.sbatch"
REQUIRE = "FLATLAB_REQUIRE_SLURM"
ARMS = ("sgd", "adamw")
NUM_TRIALS, EPOCHS, FINAL_SEEDS = 3, 2, (1, 2)
FREE = 2  # trials that run through before the gate holds the others

GATED = '''
import os
import time

from flatlab.workloads.digits import Digits
from flatlab.workloads.registry import register_workload

GATE = {gate!r}


def _ticket():
    """The order in which this trial started, among every trial of the study (a file per ticket)."""
    i = 0
    while True:
        try:
            os.close(os.open(os.path.join(GATE, f"ticket-{{i}}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return i
        except FileExistsError:
            i += 1


@register_workload
class GatedDigits(Digits):
    """Digits whose trials, from the {free}th to start on, wait in their second evaluation (their first
    epoch checkpointed) while GATE/hold exists, each saying so by a file GATE/held-N: the test cancels the
    job with {free} trials done and the next ones held mid-way, however fast or loaded the machine."""

    name = "gated_digits"

    def evaluate(self, model, split, batch_size=512):
        if not hasattr(model, "gate_ticket"):
            model.gate_ticket, model.gate_calls = _ticket(), 0
        model.gate_calls += 1
        hold = os.path.join(GATE, "hold")
        if model.gate_calls == 2 and model.gate_ticket >= {free} and os.path.exists(hold):
            open(os.path.join(GATE, f"held-{{model.gate_ticket}}"), "w").close()
            while os.path.exists(hold):
                time.sleep(0.2)
        return super().evaluate(model, split, batch_size)
'''

STUDY = """
STUDY = Study(
    name="on_slurm",
    workload="gated_digits",
    workload_params={{"width": 8}},
    arms=(
        Arm("sgd", space={{"lr": sp.loguniform(0.02, 0.3)}}),
        Arm("adamw", space={{"lr": sp.loguniform(1e-3, 3e-2)}}),
    ),
    num_trials={trials},
    max_epochs={epochs},
    scheduler="fifo",
    checkpoint_every=1,
    final_seeds={seeds},
)
"""


@pytest.fixture(scope="module")
def slurm():
    why = unavailable()
    if why is not None:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1, but {why}")
        pytest.skip(why)
    cluster = LocalSlurm()
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def job_env(slurm: LocalSlurm, root: Path) -> dict:
    """What sbatch passes on: this venv, this checkout, a root; nothing of Ray's own, and no ports (each job
    probes its own)."""
    e = env()
    for key in (
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN",
        "RAY_AUTH_TOKEN_PATH",
        "FLATLAB_ROOT",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
        "FLATLAB_RAY_PORT",
        "FLATLAB_DASHBOARD_PORT",
        "FLATLAB_MLFLOW_PORT",
    ):
        e.pop(key, None)
    e.update(
        FLATLAB_VENV=sys.prefix,
        FLATLAB_HOME=str(REPO),
        FLATLAB_ROOT=str(root),
        FLATLAB_RAY_TMPDIR=str(slurm.dir / "ray"),
    )
    return e


def submit(slurm: LocalSlurm, work: Path, e: dict, *args: str) -> str:
    return slurm.sbatch(
        "--nodes=1",
        f"--cpus-per-task={slurm.cpus}",
        "--gres=none",
        "--time=30",
        "--job-name=flatlab-test",
        f"--output={work}/job-%j.out",
        f"--chdir={work}",
        str(SCRIPT),
        "study.py",
        *args,
        env=e,
    )


def mlflow_port(work: Path, job: str):
    """The MLflow port job ``job`` chose (its output's ports line), or None before it says."""
    out = work / f"job-{job}.out"
    found = (
        re.search(r"ports: Ray \d+, dashboard \d+ \(head loopback\), MLflow (\d+)", out.read_text())
        if out.exists()
        else None
    )
    return int(found.group(1)) if found else None


def wait_for(what: str, check, timeout: float, slurm: LocalSlurm, job: str, work: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if slurm.state(job) is None or time.monotonic() > deadline:
            out = (work / f"job-{job}.out").read_text(errors="replace") if (work / f"job-{job}.out").exists() else ""
            raise AssertionError(
                f"{what}: not within {timeout:g} s (job {job}: {slurm.state(job)})\n{out[-5000:]}\n{slurm.logs()}"
            )
        time.sleep(1)


def wait_no_processes(slurm: LocalSlurm, job: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while slurm.processes(job) and time.monotonic() < deadline:
        time.sleep(1)
    assert slurm.processes(job) == [], f"processes of job {job} outlived it: {describe(slurm.processes(job))}"


def describe(pids) -> list:
    out = []
    for pid in pids:
        try:
            out.append((pid, Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120].decode()))
        except OSError:
            pass
    return out


def listening_addresses(pids) -> set:
    import ray  # noqa: F401  (its bundled psutil goes on sys.path)

    # isort: split
    import psutil  # after ray, which puts the psutil it bundles on sys.path

    found = set()
    for pid in pids:
        try:
            for c in psutil.Process(pid).net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    found.add((c.laddr.ip, c.laddr.port))
        except psutil.Error:
            pass
    return found


def trial_runs(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    from flatlab.tracking import runs

    c = MlflowClient(tracking_uri=tracking_uri)
    exp = c.get_experiment_by_name("on_slurm")
    found = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'") if exp else []
    return c, found


def tally(found) -> Counter:
    from flatlab.tracking import runs

    return Counter((r.data.tags[runs.TAG_ARM], r.data.tags[runs.TAG_STAGE], r.info.status) for r in found)


def test_a_study_cancelled_by_scancel_is_finished_by_resubmitting_with_resume(slurm, tmp_path):
    import optuna

    from flatlab.tracking import runs

    work, root, gate = tmp_path / "work", tmp_path / "root", tmp_path / "gate"
    for folder in (work, root, gate):
        folder.mkdir()
    (gate / "hold").touch()
    write_study(
        work / "study.py",
        GATED.format(gate=str(gate), free=FREE) + STUDY.format(trials=NUM_TRIALS, epochs=EPOCHS, seeds=FINAL_SEEDS),
    )
    store = f"sqlite:///{root / 'mlflow.db'}"  # the jobs' MLflow servers' store, read here without them
    launch_file = root / "on_slurm" / "launch.json"
    t0 = time.monotonic()

    # 1. submit; once FREE trials are done and the next two are held mid-way, a plain scancel: SLURM sends
    #    every process of the job TERM (the driver dies at once), KILL after KillWait
    job1 = submit(slurm, work, job_env(slurm, root))

    def held(n, job):
        def check():  # the gate's files, and the job's MLflow server while it runs
            if len(list(gate.glob("held-*"))) < n:
                return False
            _, found = trial_runs(f"http://127.0.0.1:{mlflow_port(work, job)}")
            return sum(r.info.status == "FINISHED" for r in found) >= FREE

        return check

    wait_for(f"{FREE} trials done and two held by the gate", held(2, job1), 600, slurm, job1, work)
    sockets = listening_addresses(slurm.processes(job1))
    assert len(sockets) >= 4 and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for ip, _ in sockets), sockets
    assert (
        "127.0.0.1",
        mlflow_port(work, job1),
    ) in sockets  # MLflow, on the head's (loopback) address
    slurm.scancel(job1)
    slurm.wait_gone(job1, timeout=120)
    wait_no_processes(slurm, job1)  # the trap stopped Ray and MLflow; nothing of the job is left
    t1 = time.monotonic()
    out1 = (work / f"job-{job1}.out").read_text()
    assert "TERM (scancel, or the time limit)" in out1 and "flatlab.sbatch: stopped" in out1, out1[-3000:]
    assert not (root / "slurm" / job1 / "ray_auth_token").exists()  # the job's token went with it
    c, after1 = trial_runs(store)
    done_before = {r.info.run_id: r.info.end_time for r in after1 if r.info.status == "FINISHED"}
    assert len(done_before) == FREE and len(after1) <= FREE + slurm.cpus, tally(after1)
    assert all(r.data.tags[runs.TAG_STAGE] == "search" for r in after1)

    # 2. --resume, its MLflow server at another address (as on another head node); with the gate still
    #    there, its trials are held again, and USR1 to the batch script (what --signal=B:USR1@300 sends
    #    before the time limit) stops the study cleanly: the driver ends its runs, the launch is "killed"
    job2 = submit(slurm, work, job_env(slurm, root), "--resume")
    wait_for("two resumed trials held by the gate", held(4, job2), 600, slurm, job2, work)
    slurm.scancel(job2, "--batch", "--signal=USR1")
    slurm.wait_gone(job2, timeout=300)
    wait_no_processes(slurm, job2)
    t2 = time.monotonic()
    out2 = (work / f"job-{job2}.out").read_text()
    assert "USR1: stopping the study cleanly" in out2 and "flatlab run exited 130" in out2, out2[-5000:]
    assert "(resumed)" in out2, out2[-5000:]
    c, after2 = trial_runs(store)
    assert json.loads(launch_file.read_text())["status"] == "killed"
    assert "RUNNING" not in {r.info.status for r in after2}, tally(after2)  # the driver ended them
    assert {r.info.run_id: r.info.end_time for r in after2 if r.info.run_id in done_before} == done_before
    gate.joinpath("hold").unlink()  # let the next job's trials run through

    # 3. --resume again: the launch ends
    job3 = submit(slurm, work, job_env(slurm, root), "--resume")
    wait_for(f"job {job3} (--resume) to end", lambda: slurm.state(job3) is None, 900, slurm, job3, work)
    wait_no_processes(slurm, job3)
    t3 = time.monotonic()
    out3 = (work / f"job-{job3}.out").read_text()
    assert "flatlab run exited 0" in out3 and "(resumed)" in out3, out3[-5000:]

    c, after = trial_runs(store)
    count = tally(after)
    expected = Counter(
        {
            **{(arm, "search", "FINISHED"): NUM_TRIALS for arm in ARMS},
            **{(arm, "final", "FINISHED"): len(FINAL_SEEDS) for arm in ARMS},
        }
    )
    assert count == expected, count  # nothing lost, nothing twice, nothing RUNNING
    for r in after:
        assert [m.step for m in c.get_metric_history(r.info.run_id, "epoch")] == list(range(1, EPOCHS + 1))
    assert {r.info.run_id: r.info.end_time for r in after if r.info.run_id in done_before} == done_before  # not re-run
    for arm in ARMS:  # the final stage re-ran each arm's best search configuration on its seeds
        final = sorted(
            int(r.data.tags[runs.TAG_SEED])
            for r in after
            if r.data.tags[runs.TAG_ARM] == arm and r.data.tags[runs.TAG_STAGE] == "final"
        )
        assert final == list(FINAL_SEEDS)
    launch = json.loads(launch_file.read_text())
    assert launch["status"] == "finished" and launch["tracking_uri"] == f"http://127.0.0.1:{mlflow_port(work, job3)}"
    for arm in ARMS:
        study = optuna.load_study(
            study_name=launch["optuna_studies"][arm], storage=f"sqlite:///{root / 'on_slurm' / 'optuna.db'}"
        )
        assert [t.state.name for t in study.trials] == ["COMPLETE"] * NUM_TRIALS
    assert c.get_run(launch["parent_run_id"]).info.status == "FINISHED"
    start_epochs = Counter(r.data.tags.get("flatlab.start_epoch") for r in after if r.info.run_id not in done_before)
    print(
        f"\nSLURM study: job {job1} scancel after {t1 - t0:.0f} s: {dict(tally(after1))}; job {job2} --resume, "
        f"USR1 after {t2 - t1:.0f} s: {dict(tally(after2))}; job {job3} --resume {t3 - t2:.0f} s: {dict(count)}; "
        f"start epochs of "
        f"the runs the resumes finished: {dict(start_epochs)}; wall {t3 - t0:.0f} s"
    )
