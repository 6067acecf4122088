"""Studies on a multi-node Ray cluster on this machine (a head without CPUs for trials, and two worker nodes
with 2 CPUs and one fake GPU each, every node on 127.0.0.1; :mod:`ray_cluster`): trials spread over the
nodes, survive the loss of a node, a GPU that is reserved but not usable is never silent, and a study's
own workload, optimizer and measure reach the worker nodes, from `flatlab run --address` and from
`flatlab submit`."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flatlab.tracking import runs
from flatlab_testing import BIN, EXAMPLES, check_extensions_run, env, free_port, wait_http, write_study

pytestmark = [pytest.mark.integration]

HERE = Path(__file__).resolve().parent
TRIALS = f"tags.`{runs.TAG_ROLE}` = 'trial'"


class RayCluster:
    """The :mod:`ray_cluster` process: ``address``, ``head``, ``workers`` (node ids), ``remove``, ``add``."""

    def __init__(self) -> None:
        e = env()
        e.pop("RAY_AUTH_MODE", None)  # Ray's harness starts its nodes without token authentication
        e.pop("RAY_AUTH_TOKEN", None)
        # Ray's own processes that connect to the cluster (the job agent's ray.init) take 127.0.0.1 as
        # this machine's address; on Linux Ray would take the network address, where nothing answers
        e["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "ray_cluster.py"), "0", "2", "2", "1", str(free_port())],
            env=e,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        info = self._answer()
        self.address, self.head, self.workers = info["address"], info["head"], list(info["workers"])
        self.dashboard = info["dashboard"]

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the Ray cluster process ended ({self.proc.poll()})")
        return json.loads(line)

    def remove(self, node_id: str) -> None:
        self.proc.stdin.write(f"remove {node_id}\n")
        self.proc.stdin.flush()
        assert self._answer() == {"removed": node_id}
        self.workers.remove(node_id)

    def add(self) -> str:
        self.proc.stdin.write("add\n")
        self.proc.stdin.flush()
        node_id = self._answer()["added"]
        self.workers.append(node_id)
        return node_id

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def cluster():
    c = RayCluster()
    try:
        yield c
    finally:
        c.close()


def run_env() -> dict:
    """A driver with a Ray token at hand (as Ray writes one at any local `ray.init`): before flatlab asked
    the cluster, that alone put the driver in token mode, and every trial on this cluster was cancelled."""
    e = env()
    e.pop("RAY_AUTH_MODE", None)
    e["RAY_AUTH_TOKEN"] = "f1a7" * 8
    return e


def study_source(name: str, *, trials: int, epochs: int, fallback: bool = True, workload: str = "digits") -> str:
    return f"""
Study(
    name="{name}",
    workload="{workload}",
    workload_params={{"width": 16}},
    arms=(Arm("sgd", space={{"lr": sp.loguniform(0.02, 0.3)}}),),
    num_trials={trials},
    max_epochs={epochs},
    scheduler="fifo",
    checkpoint_every=1,
    resources=Resources(cpu=1, gpu=0.5, cpu_fallback={fallback}),
)"""


def study_file(tmp_path: Path, name: str, *studies: str, preamble: str = "") -> Path:
    return write_study(
        tmp_path / f"{name}.py", f"from flatlab import Resources\n{preamble}\nSTUDIES = [{', '.join(studies)}]\n"
    )


GATED = """
import os
import time

from flatlab.workloads.digits import Digits
from flatlab.workloads.registry import register_workload

GATE = {gate!r}
_evaluated = []


@register_workload
class GatedDigits(Digits):
    \"\"\"Digits whose trials wait, after two epochs, while the file GATE exists: the test holds every
    trial mid-way until it has removed a node, however fast or loaded the machine.\"\"\"

    name = "gated_digits"

    def evaluate(self, model, split, batch_size=512):
        _evaluated.append(1)
        while len(_evaluated) > 2 and os.path.exists(GATE):
            time.sleep(0.2)
        return super().evaluate(model, split, batch_size)
"""


def trial_runs(root: Path, name: str):
    c = runs.client(runs.default_tracking_uri(root))
    exp = c.get_experiment_by_name(name)
    return c, (c.search_runs([exp.experiment_id], filter_string=TRIALS) if exp else [])


def max_overlap(intervals) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = best = 0
    for _, d in events:
        now += d
        best = max(best, now)
    return best


def test_max_overlap_by_hand():
    assert max_overlap([(0, 10), (1, 2), (3, 4), (5, 12), (6, 7)]) == 3
    assert max_overlap([(0, 1), (1, 2)]) == 1  # one ends as the next starts


@pytest.mark.slow  # minutes; .ci/run (make test) runs slow tests
def test_gpu_trials_spread_over_both_worker_nodes_and_never_train_on_cpu_unasked(cluster, tmp_path):
    """One launch of two studies (one start-up for both): ``spread`` falls back to CPU when CUDA is not
    usable (the fake GPUs), ``nocuda`` does not, so each of its trials fails at once, and so the launch."""
    root = tmp_path / "root"
    study = study_file(
        tmp_path,
        "gpus",
        study_source("spread", trials=4, epochs=6),
        study_source("nocuda", trials=2, epochs=3, fallback=False),
    )
    t0 = time.monotonic()
    res = subprocess.run(
        [str(BIN / "flatlab"), "run", str(study), "--address", cluster.address, "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=600,
        env=run_env(),
    )
    print(f"spread and nocuda studies: {time.monotonic() - t0:.0f} s")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]  # every trial of nocuda failed: non-zero
    log = root.resolve() / "nocuda" / "logs" / "flatlab.log"
    assert (
        res.stdout.strip().splitlines()[-1]
        == f"every trial of nocuda failed (2 of 2); see {log} and `flatlab results nocuda`"
    )

    c, trials = trial_runs(root, "spread")
    assert len(trials) == 4 and all(r.info.status == "FINISHED" for r in trials), [r.info.status for r in trials]
    tags = [r.data.tags for r in trials]
    assert {t["flatlab.node"] for t in tags} == set(cluster.workers)  # both worker nodes; the GPU-less head none
    for t in tags:  # on record: where and on what each trial ran
        assert t["flatlab.device"] == "cpu" and t["flatlab.gpu_ids"] == "0" and t["flatlab.world_size"] == "1"
        assert t["flatlab.resources"] == "cpu=1, gpu=0.5" and t["flatlab.workers"] == "1"
        assert "CUDA is not usable" in t["flatlab.cpu_fallback"] and t["flatlab.start_epoch"] == "0"
    # two trials share each fake GPU (gpu=0.5): four at once
    assert max_overlap([(r.info.start_time, r.info.end_time) for r in trials]) == 4
    assert res.stdout.count("trains on CPU (Resources(cpu_fallback=True))") == 4  # one warning per trial

    c, trials = trial_runs(root, "nocuda")
    assert len(trials) == 2 and all(r.info.status == "FAILED" for r in trials)
    for r in trials:
        assert r.data.tags[runs.TAG_ERROR].startswith(
            "DeviceUnavailableError: the trial reserved gpu=0.5 but CUDA is not usable on node 127.0.0.1 ("
        )
        error = Path(c.download_artifacts(r.info.run_id, "error.txt", str(tmp_path))).read_text()
        assert "torch.cuda.is_available() is False; torch built with" in error
        assert "or train on CPU: Resources(..., gpu=0), or Resources(..., cpu_fallback=True)" in error
        assert c.get_metric_history(r.info.run_id, "epoch") == []  # it failed before training, not after


@pytest.mark.slow  # minutes; .ci/run (make test) runs slow tests
def test_a_removed_worker_nodes_trials_resume_on_the_other_from_their_checkpoints(cluster, tmp_path):
    import optuna

    epochs, n = 12, 4
    root = tmp_path / "root"
    gate = tmp_path / "hold"  # while it exists, every trial waits after its second epoch (GatedDigits)
    gate.touch()
    study = study_file(
        tmp_path,
        "lost",
        study_source("lost", trials=n, epochs=epochs, workload="gated_digits"),
        preamble=GATED.format(gate=str(gate)),
    )
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [str(BIN / "flatlab"), "run", str(study), "--address", cluster.address, "--root", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=run_env(),
    )
    try:
        held = []
        deadline = time.monotonic() + 300
        while len(held) < n:  # all four trials (two per worker node) are held, with checkpointed epochs
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, f"not every trial reached its second epoch: {held}"
            time.sleep(0.5)
            try:
                c, trials = trial_runs(root, "lost")
            except Exception:  # the store is being created
                continue
            held = [
                r
                for r in trials
                if r.info.status == "RUNNING"
                and r.data.tags.get("flatlab.node") in cluster.workers
                and r.data.metrics.get("epoch", 0) >= 2
            ]
        victim = held[0].data.tags["flatlab.node"]
        moved = [r.data.tags[runs.TAG_TRIAL] for r in held if r.data.tags["flatlab.node"] == victim]
        assert len(moved) == 2, [(r.data.tags[runs.TAG_TRIAL], r.data.tags["flatlab.node"]) for r in held]
        cluster.remove(victim)
    except BaseException:
        proc.kill()
        raise
    finally:
        gate.unlink()  # let the trials go on
    out, _ = proc.communicate(timeout=600)
    print(f"node-loss study: {time.monotonic() - t0:.0f} s")
    replacement = cluster.add()  # the next tests have two worker nodes again
    assert proc.returncode == 0, out[-4000:]
    assert "will resume from its last checkpoint" in out, out[-4000:]
    c, trials = trial_runs(root, "lost")
    assert len(trials) == n and all(r.info.status == "FINISHED" for r in trials), [r.info.status for r in trials]
    by_trial = {r.data.tags[runs.TAG_TRIAL]: r for r in trials}
    for r in trials:  # every epoch logged once, also across the restart
        assert [m.step for m in c.get_metric_history(r.info.run_id, "epoch")] == list(range(1, epochs + 1))
    for trial_id in moved:  # restarted on the surviving node, from a checkpoint (MLflow lags the trial)
        tags = by_trial[trial_id].data.tags
        assert tags["flatlab.node"] not in (victim, replacement), tags
        assert 1 <= int(tags["flatlab.start_epoch"]) < epochs, tags
    launch = json.loads((root / "lost" / "launch.json").read_text())
    optuna_trials = optuna.load_study(
        study_name=launch["optuna_studies"]["sgd"], storage=f"sqlite:///{root / 'lost' / 'optuna.db'}"
    ).trials
    assert len(optuna_trials) == n and all(t.state.name == "COMPLETE" for t in optuna_trials)
    assert all(sorted(t.intermediate_values) == list(range(1, epochs + 1)) for t in optuna_trials)
    assert {t.user_attrs["mlflow_run_id"] for t in optuna_trials} == {r.info.run_id for r in trials}


@pytest.mark.slow
def test_a_study_files_own_extensions_reach_the_worker_nodes_by_run_and_by_submit(cluster, tmp_path):
    work = tmp_path / "work"  # the study file and the module next to it; neither is importable on the nodes
    shutil.copytree(EXAMPLES, work, ignore=shutil.ignore_patterns("__pycache__"))
    root = tmp_path / "run-root"
    res = subprocess.run(
        [str(BIN / "flatlab"), "run", str(work / "extensions.py"), "--address", cluster.address, "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=600,
        env=run_env(),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check_extensions_run(root, tmp_path, nodes=cluster.workers)

    wait_http(f"{cluster.dashboard}/api/version", timeout=120)
    root = tmp_path / "job-root"
    res = subprocess.run(
        [
            str(BIN / "flatlab"),
            "submit",
            "extensions.py",
            "--address",
            cluster.dashboard,
            "--working-dir",
            str(work),
            f"--arg=--root={root}",
            "--follow",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=run_env(),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1].startswith("raysubmit_")
    check_extensions_run(root, tmp_path, nodes=cluster.workers)
