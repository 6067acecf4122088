"""deploy/slurm/lib.sh, the batch script's functions, run by bash without SLURM: two jobs on one node get
ports of their own, and a job goes on only when the listener on its port is its own process (another job's
listener, on a port given to both, stops it with that message)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "deploy" / "slurm" / "lib.sh"
PORTS = ("FLATLAB_RAY_PORT", "FLATLAB_DASHBOARD_PORT", "FLATLAB_MLFLOW_PORT")
LISTEN = (
    "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(99)"
)


def bash(script: str, tag: str) -> subprocess.CompletedProcess:
    """``script`` after ``source lib.sh``, as a job whose processes carry FLATLAB_JOB_TAG=``tag``."""
    e = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin:/usr/sbin:/sbin", "FLATLAB_JOB_TAG": tag}
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {LIB}; {script}"], env=e, capture_output=True, text=True, timeout=60
    )


def choose(tag: str) -> dict:
    out = bash(f"choose_ports {' '.join(PORTS)}; " + "; ".join(f'echo "{k}=${k}"' for k in PORTS), tag)
    assert out.returncode == 0, out.stderr
    return {k: int(v) for k, v in (line.split("=") for line in out.stdout.split())}


@pytest.fixture
def listeners():
    """Start a process listening on 127.0.0.1:PORT with FLATLAB_JOB_TAG=TAG in its environment (a job's
    Ray head or MLflow server); each is killed afterwards."""
    procs = []

    def start(port: int, tag: str) -> subprocess.Popen:
        # the tag first and a long environment after it, as a real server's (bash reads all of /proc/PID/environ)
        e = {"FLATLAB_JOB_TAG": tag, **{k: v for k, v in os.environ.items() if k != "FLATLAB_JOB_TAG"}}
        e.update({f"PADDING_{i}": "x" * 60000 for i in range(4)})
        proc = subprocess.Popen([sys.executable, "-c", LISTEN, str(port)], env=e)
        procs.append(proc)
        for _ in range(100):
            if bash(f"port_owner {port}", tag).stdout.strip() == "ours":
                return proc
            time.sleep(0.1)
        raise AssertionError(f"no listener on {port}")

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_two_jobs_on_one_node_get_ports_of_their_own(listeners):
    first = choose("1001.0.1")
    assert len(set(first.values())) == 3, first
    for port in first.values():  # job 1001's Ray head, dashboard and MLflow server now listen
        listeners(port, "1001.0.1")
    second = choose("1002.0.7")  # job 1002 starts on the same node
    assert len(set(second.values())) == 3 and not set(second.values()) & set(first.values()), (first, second)


def test_a_job_accepts_its_own_listener_and_stops_at_another_jobs(listeners):
    port = choose("1001.0.1")["FLATLAB_MLFLOW_PORT"]
    proc = listeners(port, "1001.0.1")
    ours = bash(f'wait_port 127.0.0.1 {port} 10 "the MLflow server" {proc.pid}', "1001.0.1")
    assert ours.returncode == 0, ours.stderr
    # job 1002 was given the same fixed port: the listener is not its own, and it stops at once
    t0 = time.monotonic()
    theirs = bash(f'wait_port 127.0.0.1 {port} 30 "the MLflow server" $$', "1002.0.7")
    assert theirs.returncode == 2 and time.monotonic() - t0 < 10
    assert f"the MLflow server: port {port} on" in theirs.stderr
    assert "is taken by a process that is not this job's" in theirs.stderr
    assert bash(f"port_owner {port}", "1002.0.7").stdout.strip() == "other"
    # nothing listens yet: wait_port waits while the starting process lives, and says when it ended
    free = choose("1003.0.1")["FLATLAB_MLFLOW_PORT"]
    gone = bash(f'sleep 0.2 & wait_port 127.0.0.1 {free} 30 "the Ray head" $!', "1003.0.1")
    assert gone.returncode == 2 and f"the Ray head ended before it listened on 127.0.0.1:{free}" in gone.stderr
