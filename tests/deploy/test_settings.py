"""One set of cluster settings (deploy/settings.env) for the three ways to a Ray cluster: `ray up
cluster.yaml`, deploy/slurm/flatlab.sbatch and deploy/kuberay. Ray's version is the one pyproject.toml
pins, the ports and where MLflow and the outputs live agree everywhere, GPUs are declared as the
scheduler gave them, and nothing asks Ray or MLflow to listen on every interface."""

import re
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from flatlab.study.ray_compat import TESTED_RAY_VERSIONS

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "deploy" / "slurm" / "flatlab.sbatch"
LIB = REPO / "deploy" / "slurm" / "lib.sh"


def ray_requirement() -> Requirement:
    text = (REPO / "pyproject.toml").read_text()
    return Requirement(re.search(r'"(ray\[[^"]+)"', text).group(1))


def test_the_settings_file_reads_as_the_slurm_script_reads_it(settings, parse_settings, tmp_path):
    assert set(settings) == {
        "FLATLAB_RAY_VERSION",
        "FLATLAB_RAY_PORT",
        "FLATLAB_DASHBOARD_HOST",
        "FLATLAB_DASHBOARD_PORT",
        "FLATLAB_MLFLOW_PORT",
        "FLATLAB_MLFLOW_SERVICE",
        "FLATLAB_MLFLOW_HOSTS",
        "FLATLAB_MLFLOW_WORKERS",
        "FLATLAB_MLFLOW_STORE",
        "FLATLAB_MLFLOW_ARTIFACTS",
    }
    # the script's loop (the environment wins), run by bash on the real file
    loop = re.search(
        r"(while IFS='=' read -r key value; do\n.*?\ndone <\"\$settings\")", SBATCH.read_text(), re.S
    ).group(1)
    out = subprocess.run(
        [
            "bash",
            "-c",
            f"set -euo pipefail; settings={REPO}/deploy/settings.env\n{loop}\n"
            'echo "$FLATLAB_RAY_PORT $FLATLAB_MLFLOW_PORT $FLATLAB_RAY_VERSION"',
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "FLATLAB_MLFLOW_PORT": "5999"},
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [settings["FLATLAB_RAY_PORT"], "5999", settings["FLATLAB_RAY_VERSION"]]
    bad = tmp_path / "bad.env"
    bad.write_text("FLATLAB_RAY_PORT = 6379\n")
    with pytest.raises(ValueError, match=r"bad.env:1: expected KEY=value"):
        parse_settings(bad)


def test_one_ray_version_everywhere(settings, kuberay):
    version = settings["FLATLAB_RAY_VERSION"]
    assert version in ray_requirement().specifier  # pyproject.toml's pin
    assert ".".join(version.split(".")[:2]) in TESTED_RAY_VERSIONS  # what flatlab.study.ray_compat was tested on
    cluster = kuberay[("RayCluster", "flatlab")]
    assert cluster["spec"]["rayVersion"] == version
    images = {c["image"] for _, g in groups(cluster) for c in g["template"]["spec"]["containers"]}
    images |= {c["image"] for c in kuberay[("Deployment", "flatlab-mlflow")]["spec"]["template"]["spec"]["containers"]}
    assert images == {f"flatlab:{version}"}
    dockerfile = (REPO / "deploy" / "kuberay" / "Dockerfile").read_text()
    assert f"ARG RAY_VERSION={version}\n" in dockerfile
    # cluster.yaml installs the checkout (pip install -e), so pyproject's pin; the SLURM script warns on another Ray
    launcher = yaml.safe_load((REPO / "cluster.yaml").read_text())
    assert any("pip install -q -e ~/flatlab" in c for c in launcher["setup_commands"])
    assert '[[ $installed == "$FLATLAB_RAY_VERSION" ]]' in SBATCH.read_text()


def groups(cluster):
    spec = cluster["spec"]
    yield "head", spec["headGroupSpec"]
    for g in spec["workerGroupSpecs"]:
        yield g["groupName"], g


def test_the_ports_and_the_dashboards_address_agree(settings, kuberay):
    port, dash_host, dash_port, ml_port = (
        settings[k]
        for k in ("FLATLAB_RAY_PORT", "FLATLAB_DASHBOARD_HOST", "FLATLAB_DASHBOARD_PORT", "FLATLAB_MLFLOW_PORT")
    )
    launcher = yaml.safe_load((REPO / "cluster.yaml").read_text())
    head = " ".join(launcher["head_start_ray_commands"])
    assert f"--port={port} --dashboard-host={dash_host} --dashboard-port={dash_port}" in head
    assert f"--port {ml_port}" in head and all(
        f"$RAY_HEAD_IP:{port}" in c for c in launcher["worker_start_ray_commands"][1:]
    )
    script = SBATCH.read_text() + LIB.read_text()
    for flag in (
        '--port="$FLATLAB_RAY_PORT"',
        '--dashboard-host="$FLATLAB_DASHBOARD_HOST"',
        '--dashboard-port="$FLATLAB_DASHBOARD_PORT"',
        '--port "$FLATLAB_MLFLOW_PORT"',
        '--workers "$FLATLAB_MLFLOW_WORKERS"',
        "ray_address=$head_addr:$FLATLAB_RAY_PORT",
        "mlflow_uri=http://$head_addr:$FLATLAB_MLFLOW_PORT",
    ):
        assert flag in script, flag
    params = kuberay[("RayCluster", "flatlab")]["spec"]["headGroupSpec"]["rayStartParams"]
    assert params["port"] == port and params["dashboard-port"] == dash_port
    head_ports = {
        p["name"]: p["containerPort"]
        for p in kuberay[("RayCluster", "flatlab")]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0][
            "ports"
        ]
    }
    assert head_ports["gcs-server"] == int(port) and head_ports["dashboard"] == int(dash_port)
    assert kuberay[("Service", "flatlab-mlflow")]["spec"]["ports"][0]["port"] == int(ml_port)


def test_mlflow_and_the_outputs_live_under_the_shared_root(settings, kuberay):
    store, artifacts = settings["FLATLAB_MLFLOW_STORE"], settings["FLATLAB_MLFLOW_ARTIFACTS"]
    launcher = " ".join(yaml.safe_load((REPO / "cluster.yaml").read_text())["head_start_ray_commands"])
    root = "/home/ubuntu/flatlab-runs"  # the --root cluster.yaml's submit line gives
    assert (
        f"--backend-store-uri sqlite:///{root}/{store}" in launcher
        and f"--artifacts-destination {root}/{artifacts}" in launcher
    )
    script = SBATCH.read_text()
    assert 'tracking_store="sqlite:///$ROOT/$FLATLAB_MLFLOW_STORE"' in script
    assert 'artifacts="file://$ROOT/$FLATLAB_MLFLOW_ARTIFACTS"' in script
    assert '--root "$ROOT" --tracking-uri "$mlflow_uri"' in script
    args = kuberay[("Deployment", "flatlab-mlflow")]["spec"]["template"]["spec"]["containers"][0]["args"]
    k8s_root = "/data/flatlab-runs"
    assert args[args.index("--backend-store-uri") + 1] == f"sqlite:///{k8s_root}/{store}"
    assert args[args.index("--default-artifact-root") + 1] == f"file://{k8s_root}/{artifacts}"
    assert f"--root {k8s_root}" in " ".join(kuberay[("RayJob", "flatlab-study")]["spec"]["entrypoint"].split())


def test_gpus_are_declared_as_the_scheduler_gave_them(kuberay):
    cluster = kuberay[("RayCluster", "flatlab")]
    for name, group in groups(cluster):
        (container,) = group["template"]["spec"]["containers"]
        limits = container["resources"]["limits"]
        params = group["rayStartParams"]
        assert params["num-gpus"] == str(limits.get("nvidia.com/gpu", 0)), name  # KubeRay's pod limit, declared to Ray
        if name != "head":
            assert params["num-cpus"] == str(limits["cpu"]), name
    assert any(g["rayStartParams"]["num-gpus"] != "0" for _, g in groups(cluster))  # a GPU worker group
    launcher = yaml.safe_load((REPO / "cluster.yaml").read_text())
    assert launcher["available_node_types"]["gpu_worker"]["resources"]["GPU"] == 1  # g5.xlarge: one A10G
    script = SBATCH.read_text()  # SLURM: the GPUs it names in CUDA_VISIBLE_DEVICES, 0 when none
    assert 'IFS=, read -ra ids <<<"$CUDA_VISIBLE_DEVICES"' in script and '--num-gpus="$gpus"' in script


def test_nothing_listens_on_every_interface(kuberay):
    assert "0.0.0.0" not in (REPO / "cluster.yaml").read_text()
    text = SBATCH.read_text() + LIB.read_text()
    code = [line.split("  # ")[0] for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert [line.strip() for line in code if "0.0.0.0" in line] == [
        '[[ -n $addr && $addr != 0.0.0.0 ]] || { echo "no address for node $1" >&2; return 1; }'
    ]
    assert '--node-ip-address="$addr"' in text and 'mlflow server --host "$1"' in text
    assert 'start_mlflow "$head_addr" "$head_node"' in text  # the head's private address
    # MLflow's pod: 0.0.0.0 in a pod's own network is its IP (the Service) and loopback (kubectl port-forward)
    deployment = kuberay[("Deployment", "flatlab-mlflow")]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--host") + 1] == "0.0.0.0" and "hostNetwork" not in deployment["spec"]["template"]["spec"]
    for doc in kuberay.values():  # the manifests' values, not their comments
        if doc is not deployment:
            assert "0.0.0.0" not in yaml.safe_dump(doc), doc["metadata"]["name"]


def test_mlflow_answers_the_names_each_path_gives_it(settings, kuberay):
    """The allowed Host headers follow the settings: loopback everywhere; the Service's names at its port in
    Kubernetes; the job's port after the head's names on SLURM (tests/deploy/test_mlflow_hosts.py sends them)."""
    loopback, service, port = (
        settings[k] for k in ("FLATLAB_MLFLOW_HOSTS", "FLATLAB_MLFLOW_SERVICE", "FLATLAB_MLFLOW_PORT")
    )
    (mlflow,) = kuberay[("Deployment", "flatlab-mlflow")]["spec"]["template"]["spec"]["containers"]
    allowed = next(e["value"] for e in mlflow["env"] if e["name"] == "MLFLOW_SERVER_ALLOWED_HOSTS").split(",")
    ns = "$(POD_NAMESPACE)"
    names = [service, f"{service}.{ns}", f"{service}.{ns}.svc", f"{service}.{ns}.svc.cluster.local"]
    assert allowed == [f"{n}:{port}" for n in names] + loopback.split(",")
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in mlflow["env"]
    assert kuberay[("Service", service)]["spec"]["ports"][0]["port"] == int(port)
    assert mlflow["args"][mlflow["args"].index("--workers") + 1] == settings["FLATLAB_MLFLOW_WORKERS"] == "1"
    out = subprocess.run(
        ["bash", "-c", f"source {LIB}; mlflow_hosts 40123 10.1.2.3 node017"],
        env={"PATH": "/usr/bin:/bin", "FLATLAB_MLFLOW_HOSTS": loopback},
        capture_output=True,
        text=True,
        timeout=30,
    )
    hosts = out.stdout.strip().split(",")
    assert hosts[:4] == [*loopback.split(","), "10.1.2.3:40123", "node017:40123"], out
    assert f"{socket.gethostname()}:40123" in hosts and len(hosts) == len(set(hosts))
