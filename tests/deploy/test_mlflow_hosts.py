"""MLflow answers every name a deploy path reaches it by, and no other. MLflow 3 refuses a request whose Host
header is not in its allowed list with 403 (its guard against DNS rebinding), and a list given replaces its
default. Each path's server is started here exactly as that path starts it, on 127.0.0.1 and a free port:

- a local run: the ``mlflow server`` command flatlab prints (:func:`flatlab.tracking.ui.serve_hint`);
- SLURM: ``start_mlflow`` of deploy/slurm/lib.sh, the batch script's own function, on a head node ``node017``;
- KubeRay: the container of deploy/kuberay/mlflow.yaml (command, args, environment, with Kubernetes'
  ``$(VAR)`` expansion), in namespace ``research``.

Requests carry the Host headers that path's clients send (200) and foreign ones (403)."""

import http.client
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from flatlab.tracking.ui import serve_hint
from flatlab_testing import env, free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "deploy" / "slurm" / "lib.sh"
API = "/api/2.0/mlflow/experiments/search?max_results=1"
NAMESPACE = "research"


def status(port: int, host: str) -> int:
    """The status of an MLflow API request to 127.0.0.1:``port`` whose Host header is ``host``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("GET", API, skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def wait_ready(port: int, pid: int, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                pass
            if status(port, f"127.0.0.1:{port}") in (200, 403):
                return
        except OSError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise AssertionError(f"the MLflow server ended before it listened:\n{log.read_text()[-3000:]}") from None
        time.sleep(0.5)
    raise AssertionError(f"the MLflow server did not answer on 127.0.0.1:{port} within {timeout} s")


def stop(pid: int) -> None:
    """The server's whole session (it runs in one of its own: setsid, or start_new_session)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pid, signal.SIGKILL)


def start(args: list, e: dict, tmp: Path) -> int:
    """``args`` in a session of its own, its output in ``tmp``/log; its pid (the session's id)."""
    with open(tmp / "log", "w") as log:
        return subprocess.Popen(args, env=e, stdout=log, stderr=subprocess.STDOUT, start_new_session=True).pid


def local_server(tmp: Path, port: int):
    """The command flatlab prints for a local run's file store, at ``port``; what its link and a browser send."""
    args = shlex.split(serve_hint(f"sqlite:///{tmp / 'mlflow.db'}"))
    assert args[args.index("--host") + 1] == "127.0.0.1"  # a local run's services listen on loopback only
    args[args.index("--port") + 1] = str(port)
    return start(args, env(), tmp), [f"127.0.0.1:{port}", f"localhost:{port}"]


def slurm_server(tmp: Path, port: int, settings: dict):
    """The batch script's start_mlflow on head node ``node017`` (its address here: 127.0.0.1); the tracking
    URI the job hands to every node, the node's names, and an SSH tunnel's end on your machine."""
    e = {**env(), **{k: v for k, v in settings.items() if k.startswith("FLATLAB_MLFLOW_")}}
    e.update(FLATLAB_MLFLOW_PORT=str(port), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    script = (
        f"set -euo pipefail; source {shlex.quote(str(LIB))}; "
        f'start_mlflow 127.0.0.1 node017 "sqlite:///{tmp}/mlflow.db" "file://{tmp}/mlartifacts" {tmp}/log; '
        'echo "$mlflow_pid"'
    )
    out = subprocess.run(["bash", "-c", script], env=e, capture_output=True, text=True, timeout=60, check=True)
    hostname = socket.gethostname()
    return int(out.stdout.split()[-1]), [f"127.0.0.1:{port}", f"node017:{port}", f"{hostname}:{port}", "localhost:5000"]


def expand(value: str, variables: dict) -> str:
    """Kubernetes' ``$(VAR)`` expansion in a container's args and env values."""
    return re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), m.group(0)), value)


def kuberay_server(tmp: Path, port: int, kuberay: dict):
    """deploy/kuberay/mlflow.yaml's container, in namespace ``research`` (its --host, --port and store moved
    to this test's); the Ray pods' tracking URI, the Service's other names, and a port-forward's end."""
    (container,) = kuberay[("Deployment", "flatlab-mlflow")]["spec"]["template"]["spec"]["containers"]
    variables = {"POD_NAMESPACE": NAMESPACE}
    for item in container["env"]:
        if "value" in item:
            variables[item["name"]] = expand(item["value"], variables)
    args = [expand(a, variables) for a in container["command"] + container["args"]]
    for flag, value in {
        "--host": "127.0.0.1",
        "--port": str(port),
        "--backend-store-uri": f"sqlite:///{tmp}/mlflow.db",
        "--default-artifact-root": f"file://{tmp}/mlartifacts",
    }.items():
        args[args.index(flag) + 1] = value
    args[0] = str(Path(env()["PATH"].split(os.pathsep)[0]) / "mlflow")
    e = {**env(), **variables}
    pid = start(args, e, tmp)
    uri = kuberay[("RayCluster", "flatlab")]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    service = urlparse(next(v["value"] for v in uri if v["name"] == "MLFLOW_TRACKING_URI")).netloc
    name, service_port = service.split(":")
    names = [name, f"{name}.{NAMESPACE}", f"{name}.{NAMESPACE}.svc", f"{name}.{NAMESPACE}.svc.cluster.local"]
    return pid, [f"{n}:{service_port}" for n in names] + ["localhost:5000", "127.0.0.1:8080"]


def test_each_paths_mlflow_answers_the_names_its_clients_use_and_refuses_others(tmp_path, settings, kuberay):
    started = {}
    try:
        for path in ("local", "slurm", "kuberay"):
            folder, port = tmp_path / path, free_port()
            folder.mkdir()
            if path == "local":
                pid, hosts = local_server(folder, port)
            elif path == "slurm":
                pid, hosts = slurm_server(folder, port, settings)
            else:
                pid, hosts = kuberay_server(folder, port, kuberay)
            started[path] = (pid, port, hosts, folder / "log")
        for path, (pid, port, hosts, log) in started.items():
            wait_ready(port, pid, log)
            answers = {host: status(port, host) for host in hosts}
            assert answers == {host: 200 for host in hosts}, (path, answers)
            foreign = ["evil.example:5000", f"evil.example:{port}", "node018:5000", "flatlab-mlflow.evil.example:5000"]
            refused = {host: status(port, host) for host in foreign}
            assert refused == {host: 403 for host in foreign}, (path, refused)
    finally:
        for pid, *_ in started.values():
            stop(pid)
