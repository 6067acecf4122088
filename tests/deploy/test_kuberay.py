"""deploy/kuberay: the RayJob and RayCluster against KubeRay's CRD schema (deploy/kuberay/schema, an excerpt
with its source and version), unknown fields refused as `kubectl apply` refuses them, the MLflow Service and
the claim wired to the Ray pods, and the image's install steps against pyproject.toml. Nothing here starts
a Kubernetes cluster."""

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
KUBERAY = REPO / "deploy" / "kuberay"
SCHEMA = json.loads((KUBERAY / "schema" / "kuberay-crd-excerpt.json").read_text())


def validator(kind: str) -> Draft202012Validator:
    return Draft202012Validator({**SCHEMA, "$ref": f"#/$defs/{kind}"})


def resolve(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def unknown_fields(doc, node: dict, path: str = "") -> list:
    """Paths of ``doc``'s fields that the schema ``node`` does not declare (Kubernetes would drop them
    silently; `kubectl apply`'s strict validation refuses them). Maps (``additionalProperties``) take any key."""
    node = resolve(node)
    found = []
    if isinstance(doc, dict):
        props, extra = node.get("properties"), node.get("additionalProperties")
        for key, value in doc.items():
            if props is not None and key in props:
                found += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += unknown_fields(value, extra, f"{path}.{key}")
            elif props is not None:
                found.append(f"{path}.{key}")
    elif isinstance(doc, list) and "items" in node:
        for i, item in enumerate(doc):
            found += unknown_fields(item, node["items"], f"{path}[{i}]")
    return found


def problems(doc: dict) -> list:
    """Every schema error and unknown field of a RayJob or RayCluster document, one line each."""
    kind = doc.get("kind")
    if doc.get("apiVersion") != "ray.io/v1" or kind not in ("RayJob", "RayCluster"):
        return [f"apiVersion/kind: expected ray.io/v1 RayJob or RayCluster, got {doc.get('apiVersion')} {kind}"]
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(kind).iter_errors(doc)]
    return errors + [f"{p}: unknown field" for p in unknown_fields(doc, SCHEMA["$defs"][kind])]


@pytest.mark.parametrize("kind, name", [("RayJob", "flatlab-study"), ("RayCluster", "flatlab")])
def test_the_manifests_satisfy_kuberays_crd_schema(kuberay, kind, name):
    assert problems(kuberay[(kind, name)]) == []


def test_the_check_refuses_what_kubernetes_would_refuse_or_drop(kuberay):
    good = kuberay[("RayJob", "flatlab-study")]
    spec = lambda d: d["spec"]["rayClusterSpec"]  # noqa: E731
    cases = {
        "a misspelt field": (
            lambda d: spec(d)["headGroupSpec"].update(rayStartParam={}),
            ".spec.rayClusterSpec.headGroupSpec.rayStartParam: unknown field",
        ),
        "a number where KubeRay wants a string": (
            lambda d: spec(d)["workerGroupSpecs"][0]["rayStartParams"].update({"num-gpus": 1}),
            "spec.rayClusterSpec.workerGroupSpecs.0.rayStartParams.num-gpus: 1 is not of type 'string'",
        ),
        "a required field missing": (
            lambda d: spec(d)["workerGroupSpecs"][0].pop("groupName"),
            "spec.rayClusterSpec.workerGroupSpecs.0: 'groupName' is a required property",
        ),
        "a malformed quantity": (
            lambda d: spec(d)["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"].update(
                memory="32 GB"
            ),
            "resources.limits.memory: '32 GB' does not match",
        ),
        "a container field that does not exist": (
            lambda d: spec(d)["headGroupSpec"]["template"]["spec"]["containers"][0].update(gpus=1),
            ".containers[0].gpus: unknown field",
        ),
    }
    for what, (change, expected) in cases.items():
        doc = copy.deepcopy(good)
        change(doc)
        found = problems(doc)
        assert len(found) == 1 and expected in found[0], (what, found)


def test_the_rayjob_runs_a_study_on_the_rayclusters_spec(kuberay):
    job, cluster = kuberay[("RayJob", "flatlab-study")], kuberay[("RayCluster", "flatlab")]
    assert job["spec"]["rayClusterSpec"] == cluster["spec"]  # one cluster definition, kept in step
    entry = job["spec"]["entrypoint"].split()
    assert entry[:3] == ["flatlab", "run", "/opt/flatlab/studies/digits_demo.py"]
    assert (REPO / "studies" / "digits_demo.py").is_file()  # the image copies studies/ to /opt/flatlab
    # inside a Ray job RAY_ADDRESS names the cluster; the root and the store must outlive the job
    assert "--address" not in entry and entry[entry.index("--root") + 1] == "/data/flatlab-runs"
    assert entry[entry.index("--tracking-uri") + 1] == "http://flatlab-mlflow:5000"
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def pods(cluster: dict):
    spec = cluster["spec"]
    yield "head", spec["headGroupSpec"]
    for group in spec["workerGroupSpecs"]:
        yield group["groupName"], group


def test_every_ray_pod_mounts_the_claim_and_reaches_mlflow_through_its_service(kuberay):
    claim, deployment = kuberay[("PersistentVolumeClaim", "flatlab-runs")], kuberay[("Deployment", "flatlab-mlflow")]
    service = kuberay[("Service", "flatlab-mlflow")]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # head, workers and MLflow at once
    for name, group in pods(kuberay[("RayCluster", "flatlab")]):
        pod = group["template"]["spec"]
        assert "hostNetwork" not in pod, name  # the pod's own network: its address and loopback only
        assert [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]] == ["flatlab-runs"], name
        (container,) = pod["containers"]
        assert [m["mountPath"] for m in container["volumeMounts"]] == ["/data/flatlab-runs"], name
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (
            env["FLATLAB_ROOT"] == "/data/flatlab-runs" and env["MLFLOW_TRACKING_URI"] == "http://flatlab-mlflow:5000"
        ), name
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["type"] == "ClusterIP"
    assert (
        deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    )  # one SQLite writer
    (mlflow,) = deployment["spec"]["template"]["spec"]["containers"]
    args = mlflow["args"]
    assert args[args.index("--host") + 1] == "$(POD_IP)"  # its pod's address, not 0.0.0.0
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in mlflow["env"]
    assert args[args.index("--backend-store-uri") + 1] == "sqlite:////data/flatlab-runs/mlflow.db"
    assert service["spec"]["ports"][0]["targetPort"] == int(args[args.index("--port") + 1])


def dockerfile() -> str:
    return (KUBERAY / "Dockerfile").read_text()


def arg_default(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", dockerfile(), re.M)
    assert match, f"ARG {name}=... missing in deploy/kuberay/Dockerfile"
    return match.group(1)


def pyproject():
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def makefile_pins() -> dict:
    line = re.search(r"^TORCH_PINS \?= (.+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    return dict(pin.split("==") for pin in line.split())


def test_the_image_installs_what_pyproject_pins():
    pytest.importorskip("tomllib")  # Python 3.11+
    project = pyproject()
    ray = next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "ray")
    version = arg_default("RAY_VERSION")
    assert version in ray.specifier, (version, str(ray.specifier))
    installs = re.findall(
        r'"([^"]+)"',
        " ".join(line for line in dockerfile().splitlines() if "pip install" in line or line.startswith(" &&")),
    )
    ray_install = Requirement(next(i for i in installs if i.startswith("ray[")).replace("${RAY_VERSION}", version))
    assert ray_install.extras == ray.extras and str(ray_install.specifier) == f"=={version}"
    extras = [m for i in installs if i.startswith(".[") for m in i[2:-1].split(",")]
    assert extras and set(extras) <= set(project["optional-dependencies"]), extras  # extras pyproject declares
    pins = makefile_pins()  # the torch build the project is tested with
    assert f"torchvision=={pins['torchvision']}" in installs
    assert arg_default("BASE_IMAGE").startswith(f"pytorch/pytorch:{pins['torch']}-cuda")
    assert (
        "-e" in dockerfile() and "COPY platform ./platform" in dockerfile() and "COPY studies ./studies" in dockerfile()
    )


def test_the_image_bakes_in_no_secret():
    names = re.findall(r"^(?:ENV|ARG)\s+(.+)$", dockerfile(), re.M)
    flat = " ".join(names)
    assert not re.search(r"TOKEN|SECRET|PASSW|API_KEY|CREDENTIAL|AWS_", flat, re.I), flat
    ignored = (KUBERAY / "Dockerfile.dockerignore").read_text().split()
    assert {"**/flatlab-runs", "**/.venv", ".git", "**/*.db"} <= set(ignored)
    for doc in yaml.safe_load_all("\n---\n".join(p.read_text() for p in KUBERAY.glob("*.yaml"))):
        text = json.dumps(doc)
        assert not re.search(r'"(value)": "[0-9a-f]{32,}"', text)  # no token pasted into an env value
