"""deploy/slurm/flatlab.sbatch across two SLURM nodes on real addresses (:mod:`netns_slurm`: slurmctld on a
bridge's address, a slurmd per node in a network namespace of its own, ``fln1`` and ``fln2``, each with its
own address, hostname and hosts file). A small digits study runs with ``--nodes=2``: the Ray head on
``fln1`` and a Ray worker on ``fln2``, one trial at a time on each, MLflow on fln1's address and reached
from fln2 by the name ``fln1``. With two trials held mid-way the job is requeued (``scontrol requeue``)
and resumes its launch by itself (SLURM_RESTART_COUNT); with two more held it is cancelled (``scancel``);
resubmitted with ``--resume`` it finishes. The MLflow store then holds every trial once, none RUNNING; no
process of any job is left; every process the jobs started ran, and listened, in a node's namespace; the
namespaces, veth pairs and bridge are gone.

Without root, ``ip`` or SLURM the test skips, saying why; with ``FLATLAB_REQUIRE_SLURM=1`` (``.ci/run``) it
fails instead."""

import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from flatlab_testing import write_study
from netns_slurm import NODES, NetnsSlurm, namespace_of, netns_unavailable
from test_slurm import (
    ARMS,
    EPOCHS,
    FINAL_SEEDS,
    FREE,
    GATED,
    NUM_TRIALS,
    REQUIRE,
    SCRIPT,
    STUDY,
    describe,
    job_env,
    tally,
    trial_runs,
    wait_for,
    wait_no_processes,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# each trial also writes the hostname it ran on (GATE/host-N), after its ticket
HOSTS = """

import socket

_plain_ticket = _ticket


def _ticket():
    i = _plain_ticket()
    with open(os.path.join(GATE, f"host-{i}"), "w") as f:
        f.write(socket.gethostname())
    return i
"""


@pytest.fixture(scope="module")
def slurm():
    why = netns_unavailable()
    if why is not None:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1, but {why}")
        pytest.skip(why)
    cluster = NetnsSlurm()
    try:
        yield cluster.start()
    finally:
        cluster.stop()  # raises if a namespace, veth or the bridge outlives it
    assert cluster.leftovers() == []


def submit(slurm: NetnsSlurm, work: Path, e: dict, *args: str, requeue: bool = False) -> str:
    return slurm.sbatch(
        "--nodes=2",
        "--cpus-per-task=1",  # one trial at a time on each node: two held trials are on both
        "--gres=none",
        "--time=30",
        "--requeue" if requeue else "--no-requeue",
        "--job-name=flatlab-test",
        f"--output={work}/job-%j.out",
        f"--chdir={work}",
        str(SCRIPT),
        "study.py",
        *args,
        env=e,
    )


def latest_mlflow_port(work: Path, job: str) -> int:
    """The MLflow port of job ``job``'s latest start (a requeued job appends to its output), or 0 before it says."""
    out = work / f"job-{job}.out"
    said = out.read_text() if out.exists() else ""
    found = re.findall(r"ports: Ray \d+, dashboard \d+ \(head loopback\), MLflow (\d+)", said)
    return int(found[-1]) if found else 0


def node_env(slurm: NetnsSlurm, root: Path) -> dict:
    """:func:`test_slurm.job_env`, with Ray's temporary files on each node's own folder."""
    return {**job_env(slurm, root), "FLATLAB_RAY_TMPDIR": str(slurm.dir / "node" / "ray")}


def listeners(pid: int) -> set:
    """(address, port) of every TCP socket process ``pid`` listens on, read in its own network namespace
    (``/proc/PID/net/tcp*``: addresses as 32-bit words in host order); IPv4-mapped IPv6 addresses as IPv4."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        tables = [Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:] for name in ("tcp", "tcp6")]
    except OSError:
        return set()
    for fd in fds:
        try:
            inodes.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed meanwhile
            pass
    found = set()
    for fields in (row.split() for table in tables for row in table):
        if fields[3] == "0A" and f"socket:[{fields[9]}]" in inodes:  # 0A: LISTEN
            hex_addr, port = fields[1].split(":")
            raw = b"".join(bytes.fromhex(hex_addr[i : i + 8])[::-1] for i in range(0, len(hex_addr), 8))
            addr = ipaddress.ip_address(raw)
            mapped = getattr(addr, "ipv4_mapped", None)
            found.add((str(mapped or addr), int(port, 16)))
    return found


def check_placement(slurm: NetnsSlurm, job: str, port: int) -> None:
    """Every process of the job runs in a node's network namespace, both nodes have some, and each listens
    only on its node's address, loopback or every address of its namespace; MLflow listens on the head's."""
    spaces = {str(Path(f"/run/netns/{slurm.netns[n]}").stat().st_ino): n for n in NODES}
    by_node, heard = Counter(), set()
    for pid in slurm.processes(job):
        ns = namespace_of(pid)
        if ns is None:
            continue
        node = spaces.get(ns.split("[")[1].rstrip("]"))
        assert node is not None, f"process {describe([pid])} of job {job} runs outside the nodes' namespaces ({ns})"
        by_node[node] += 1
        sockets = listeners(pid)
        allowed = {slurm.addr[node], "127.0.0.1", "::1", "0.0.0.0", "::"}
        assert {a for a, _ in sockets} <= allowed, (node, describe([pid]), sockets)
        heard |= sockets
    assert set(by_node) == set(NODES), by_node  # the job runs on both nodes
    assert (slurm.addr[NODES[0]], port) in heard, heard


def fetch_in_node(slurm: NetnsSlurm, node: str, url: str, host: str = "") -> int:
    """The HTTP status of GET ``url`` from ``node`` (its namespace and hosts file), optionally with a Host header."""
    code = (
        "import sys, urllib.request, urllib.error\n"
        "req = urllib.request.Request(sys.argv[1], headers={'Host': sys.argv[2]} if sys.argv[2] else {})\n"
        "try:\n    print(urllib.request.urlopen(req, timeout=20).status)\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n"
    )
    out = subprocess.run(
        [*slurm.in_node(node), sys.executable, "-c", code, url, host], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def test_a_two_node_study_survives_scancel_and_requeue_and_finishes_every_trial_once(slurm, tmp_path):
    import optuna

    work, root, gate = tmp_path / "work", tmp_path / "root", tmp_path / "gate"
    for folder in (work, root, gate):
        folder.mkdir()
    (gate / "hold").touch()
    write_study(
        work / "study.py",
        GATED.format(gate=str(gate), free=FREE)
        + HOSTS
        + STUDY.format(trials=NUM_TRIALS, epochs=EPOCHS, seeds=FINAL_SEEDS),
    )
    store = f"sqlite:///{root / 'mlflow.db'}"
    launch_file = root / "on_slurm" / "launch.json"
    head = slurm.addr[NODES[0]]
    t0 = time.monotonic()

    def held(n, job):
        def check():  # the gate's files, and the MLflow server of the job's latest start
            if len(list(gate.glob("held-*"))) < n:
                return False
            _, found = trial_runs(f"http://{head}:{latest_mlflow_port(work, job)}")
            return sum(r.info.status == "FINISHED" for r in found) >= FREE

        return check

    # 1. two nodes: the head and MLflow on fln1's address, a worker on fln2; requeued with two trials held
    job1 = submit(slurm, work, node_env(slurm, root), requeue=True)
    out = work / f"job-{job1}.out"
    wait_for(f"{FREE} trials done and two held by the gate", held(2, job1), 600, slurm, job1, work)
    text = out.read_text()
    assert f"ray node head on {NODES[0]} ({head})" in text, text[-3000:]
    assert f"ray node worker on {NODES[1]} ({slurm.addr[NODES[1]]})" in text, text[-3000:]
    assert "Ray: 2 of 2 nodes joined" in text, text[-3000:]
    assert f"--tracking-uri http://{head}:" in text, text[-3000:]
    port = latest_mlflow_port(work, job1)
    check_placement(slurm, job1, port)
    search = "/api/2.0/mlflow/experiments/search?max_results=1"
    assert fetch_in_node(slurm, NODES[1], f"http://{NODES[0]}:{port}{search}") == 200  # by the head's name
    assert fetch_in_node(slurm, NODES[1], f"http://{head}:{port}{search}", host=f"evil.example:{port}") == 403
    assert {(gate / f"host-{i}").read_text() for i in range(FREE, FREE + 2)} == set(NODES)  # one per node
    res = slurm.scontrol("requeue", job1)
    assert res.returncode == 0, res.stderr

    # 2. SLURM stops the job (TERM) and starts it again; the script sees SLURM_RESTART_COUNT and resumes; its
    #    trials are held again, and a plain scancel stops it
    def restarted():
        if slurm.state(job1) == "PENDING":  # a requeued job waits for its begin time; start it now
            slurm.scontrol("update", f"JobId={job1}", "StartTime=now")
        return "SLURM requeued this job (restart 1): resuming its launch" in out.read_text()

    wait_for("the requeued job to resume its launch", restarted, 600, slurm, job1, work)
    wait_for("two resumed trials held by the gate", held(4, job1), 600, slurm, job1, work)
    check_placement(slurm, job1, latest_mlflow_port(work, job1))
    slurm.scancel(job1)
    slurm.wait_gone(job1, timeout=120)
    wait_no_processes(slurm, job1)
    t1 = time.monotonic()
    text = out.read_text()
    assert text.count("TERM (scancel, or the time limit)") == 2, text[-5000:]
    assert text.count("flatlab.sbatch: stopped") == 2, text[-5000:]  # both stops within KillWait
    assert "(resumed)" in text, text[-5000:]
    c, after1 = trial_runs(store)
    done_before = {r.info.run_id: r.info.end_time for r in after1 if r.info.status == "FINISHED"}
    assert len(done_before) >= FREE, tally(after1)  # the held trials' runs stay RUNNING until a resume ends them

    # 3. resubmitted with --resume: the launch ends
    gate.joinpath("hold").unlink()
    job2 = submit(slurm, work, node_env(slurm, root), "--resume")
    wait_for(f"job {job2} (--resume) to end", lambda: slurm.state(job2) is None, 900, slurm, job2, work)
    wait_no_processes(slurm, job2)
    t2 = time.monotonic()
    text2 = (work / f"job-{job2}.out").read_text()
    assert "flatlab run exited 0" in text2 and "(resumed)" in text2, text2[-5000:]

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
    assert {r.info.run_id: r.info.end_time for r in after if r.info.run_id in done_before} == done_before
    launch = json.loads(launch_file.read_text())
    assert launch["status"] == "finished" and launch["tracking_uri"].startswith(f"http://{head}:")
    for arm in ARMS:
        study = optuna.load_study(
            study_name=launch["optuna_studies"][arm], storage=f"sqlite:///{root / 'on_slurm' / 'optuna.db'}"
        )
        assert [t.state.name for t in study.trials] == ["COMPLETE"] * NUM_TRIALS
    assert c.get_run(launch["parent_run_id"]).info.status == "FINISHED"
    hosts = Counter(p.read_text() for p in gate.glob("host-*"))
    assert set(hosts) == set(NODES), hosts
    print(
        f"\nSLURM on {NODES} at {slurm.addr}: job {job1} requeued and cancelled after {t1 - t0:.0f} s: "
        f"{dict(tally(after1))}; job {job2} --resume {t2 - t1:.0f} s: {dict(count)}; trials per node {dict(hosts)}; "
        f"wall {t2 - t0:.0f} s"
    )
