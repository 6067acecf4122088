"""deploy/kuberay: the RayJob and RayCluster against KubeRay's published CRDs (tests/deploy/crds, v1.7.0 as
released, their README says from where), unknown fields refused as `kubectl apply` refuses them, the MLflow
Service and the claim wired to the Ray pods, and the image's install steps and CUDA build against pyproject.toml
and the Makefile's torch. Nothing here starts a Kubernetes cluster."""

import copy
import functools
import json
import re
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
KUBERAY = REPO / "deploy" / "kuberay"
CRDS = Path(__file__).resolve().parent / "crds"
CRD_FILES = {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}


@functools.lru_cache(maxsize=None)
def schema(kind: str) -> dict:
    """The ``openAPIV3Schema`` of the CRD's ``ray.io/v1`` version (the one the manifests use)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are ~1 MB each: libyaml when there
    crd = yaml.load((CRDS / CRD_FILES[kind]).read_text(), Loader=loader)
    assert crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def unknown_fields(doc, node: dict, path: str = "") -> list:
    """Paths of ``doc``'s fields that the schema ``node`` does not declare (Kubernetes would drop them
    silently; `kubectl apply`'s strict validation refuses them). Maps (``additionalProperties``) take any key,
    and so do objects marked ``x-kubernetes-preserve-unknown-fields``."""
    found = []
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return found
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
    """Every schema error and unknown field of a RayJob or RayCluster document, one line each. The CRDs'
    CEL rules (``x-kubernetes-validations``) are not evaluated: only an API server runs CEL."""
    kind = doc.get("kind")
    if doc.get("apiVersion") != "ray.io/v1" or kind not in CRD_FILES:
        return [f"apiVersion/kind: expected ray.io/v1 RayJob or RayCluster, got {doc.get('apiVersion')} {kind}"]
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in Draft202012Validator(schema(kind)).iter_errors(doc)
    ]
    return errors + [f"{p}: unknown field" for p in unknown_fields(doc, schema(kind))]


def test_the_vendored_crds_are_kuberays_release():
    readme = (CRDS / "README.md").read_text()
    assert "v1.7.0" in readme and "59d663aeec13760646da3db9c1cf8cfe883e30b7" in readme
    for kind in CRD_FILES:  # fields of releases after v1.2 that the hand excerpt lacked, and the manifests use
        pod = schema(kind)["properties"]["spec"]["properties"]
        if kind == "RayJob":
            pod = pod["rayClusterSpec"]["properties"]
        template = pod["headGroupSpec"]["properties"]["template"]["properties"]["spec"]["properties"]
        assert {"securityContext", "imagePullSecrets"} <= set(template), kind
        assert "rayStartParams" not in pod["headGroupSpec"].get("required", []), kind  # optional since v1.4


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
    assert claim["spec"]["storageClassName"]  # not the cluster's default class, often ReadWriteOnce only
    mlflow_pod = deployment["spec"]["template"]["spec"]
    security = [g["template"]["spec"]["securityContext"] for _, g in pods(kuberay[("RayCluster", "flatlab")])]
    for context in security + [mlflow_pod["securityContext"]]:  # the image's user; the claim's group
        assert context == {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000}, context
    assert re.search(r"^USER 1000$", dockerfile(), re.M)
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
    text = dockerfile()
    ray_install = Requirement(re.search(r'"(ray\[[^"]+)"', text).group(1).replace("${RAY_VERSION}", version))
    assert ray_install.extras == ray.extras and str(ray_install.specifier) == f"=={version}"
    extras = re.findall(r"\['optional-dependencies'\]\['(\w+)'\]", text)
    assert extras == ["vision"] and set(extras) <= set(project["optional-dependencies"]), extras
    assert "['dependencies']" in text  # pyproject's dependencies, read from the file the layer copies
    # the dependency layer comes before the source: a code edit does not reinstall the dependencies
    deps, source = text.index("pip install -r /tmp/requirements.txt"), text.index("COPY platform ./platform")
    assert text.index("COPY pyproject.toml README.md ./") < deps < source < text.index("pip install --no-deps -e .")
    assert "COPY studies ./studies" in text


#: The CUDA of PyPI's default torch wheels (pytorch.org's install matrix: ``pip install torch`` gets this build,
#: its torchvision the matching ``+cuNNN``), by torch release.
PYPI_TORCH_CUDA = {"2.14": "13.0"}


def test_the_image_has_one_cuda_build_the_makefiles_torch():
    pins = makefile_pins()  # the torch build the project is tested with
    assert arg_default("TORCH_VERSION") == pins["torch"] and arg_default("TORCHVISION_VERSION") == pins["torchvision"]
    minor = ".".join(pins["torch"].split(".")[:2])
    assert minor in PYPI_TORCH_CUDA, f"torch {pins['torch']}: add its PyPI CUDA to PYPI_TORCH_CUDA"
    cuda = arg_default("CUDA_VERSION")
    assert cuda == PYPI_TORCH_CUDA[minor]
    torch = pytest.importorskip("torch")
    if torch.__version__.split("+")[0] == pins["torch"] and torch.version.cuda:  # `make venv`'s PyPI wheel
        assert torch.version.cuda == cuda, torch.__version__
    # the base image is that torch on that CUDA; torch and torchvision are installed at the pins, not upgraded
    assert arg_default("BASE_IMAGE") == "pytorch/pytorch:${TORCH_VERSION}-cuda${CUDA_VERSION}-cudnn9-runtime"
    text = dockerfile()
    assert '"torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"' in text
    # the build fails unless torch and torchvision both import and are CUDA_VERSION builds, and says which
    check = text[text.index('python -c "import torch, torchvision, ray;') :]
    for part in (
        "torch.version.cuda, '| torchvision', torchvision.__version__",
        "'CUDA', torchvision.version.cuda",
        "assert torch.version.cuda == '${CUDA_VERSION}'",
        "assert torchvision.version.cuda == major * 1000 + minor * 10",
    ):
        assert part in check, part


def test_the_image_runs_as_uid_1000_on_any_base_and_has_what_the_probes_need():
    text = dockerfile()
    # Ubuntu 24.04 has uid 1000 (ubuntu): create one only where none exists
    assert "if ! getent passwd 1000 >/dev/null; then useradd --create-home --uid 1000" in text
    assert re.search(r"^USER 1000$", text, re.M) and text.rstrip().endswith("USER 1000")
    assert "apt-get install -y --no-install-recommends wget" in text  # KubeRay <= 1.5's probes run wget


def test_the_image_bakes_in_no_secret():
    names = re.findall(r"^(?:ENV|ARG)\s+(.+)$", dockerfile(), re.M)
    flat = " ".join(names)
    assert not re.search(r"TOKEN|SECRET|PASSW|API_KEY|CREDENTIAL|AWS_", flat, re.I), flat
    ignored = (KUBERAY / "Dockerfile.dockerignore").read_text().split()
    assert {"**/flatlab-runs", "**/.venv", ".git", "**/*.db"} <= set(ignored)
    for doc in yaml.safe_load_all("\n---\n".join(p.read_text() for p in KUBERAY.glob("*.yaml"))):
        text = json.dumps(doc)
        assert not re.search(r'"(value)": "[0-9a-f]{32,}"', text)  # no token pasted into an env value
