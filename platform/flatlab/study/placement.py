"""Where a trial runs, on record: its device policy and the placement tags of its MLflow run.

A trial picks its device with :func:`choose_device`: the GPU it reserved when CUDA works on its node;
when it does not (no driver, a broken driver, a fake GPU resource), the trial fails at once with
:class:`DeviceUnavailableError`, never trains on CPU without a word, unless the study opted into
``Resources(..., cpu_fallback=True)``. What it got travels to the driver in the first report of each
(re)start of the trial, under :data:`PLACEMENT_KEY` (a JSON string), and becomes the tags of its run
(:func:`placement_tags`): device, GPU name, world size, workers, resources, node, restart epoch, and
what its CPU threads do with subnormal floats.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from flatlab.errors import FlatlabError
from flatlab.lazy import lazy

ray = lazy("ray")
torch = lazy("torch")


class DeviceUnavailableError(FlatlabError, RuntimeError):
    """A trial reserved a GPU, and CUDA is not usable on its node (raised inside the trial, which fails)."""


def cuda_status() -> Tuple[bool, str]:
    """``(usable, reason)``: whether CUDA works in this process (``torch.cuda.is_available()`` and a
    one-element tensor on the device), with the reason when it does not."""
    if not torch.cuda.is_available():
        built = torch.version.cuda
        return False, "torch.cuda.is_available() is False; " + (
            f"torch built with CUDA {built}" if built else "torch built without CUDA"
        )
    try:
        torch.zeros(1, device="cuda").add_(1)
    except Exception as exc:  # noqa: BLE001 - a broken driver raises many kinds
        return False, f"a tensor on cuda failed: {type(exc).__name__}: {exc}"
    return True, ""


def choose_device(
    resources: Any, *, where: str = "this node", status: Callable[[], Tuple[bool, str]] = cuda_status
) -> Tuple[str, Optional[str]]:
    """The device of a trial with ``resources`` (:class:`~flatlab.study.spec.Resources`):
    ``("cpu", None)`` without a GPU reservation, ``("cuda", None)`` with one and usable CUDA, and
    ``("cpu", warning)`` when CUDA is not usable and ``resources.cpu_fallback`` is set.

    Args:
        where: the node, for the messages (e.g. its Ray node id).
        status: :func:`cuda_status` (tests give their own).

    Raises:
        DeviceUnavailableError: a GPU reserved, CUDA not usable, no ``cpu_fallback``; the message names
            the reservation, the node, the reason and both ways out.
    """
    if not resources.gpu > 0:
        return "cpu", None
    usable, reason = status()
    if usable:
        return "cuda", None
    if getattr(resources, "cpu_fallback", False):
        return "cpu", (
            f"the trial reserved gpu={resources.gpu:g} but CUDA is not usable on {where} ({reason}); "
            "it trains on CPU (Resources(cpu_fallback=True))"
        )
    raise DeviceUnavailableError(
        f"the trial reserved gpu={resources.gpu:g} but CUDA is not usable on {where} ({reason}); fix the node's "
        f"CUDA (driver, CUDA_VISIBLE_DEVICES, a CUDA build of torch), or train on CPU: Resources(..., gpu=0), or "
        f"Resources(..., cpu_fallback=True) to fall back to CPU with a warning"
    )


def node_label() -> str:
    """``"node 127.0.0.1 (3d89aeda)"``: this process's Ray node, by address and short id, for messages."""
    if not ray.is_initialized():
        return "this node"
    return f"node {ray.util.get_node_ip_address()} ({ray.get_runtime_context().get_node_id()[:8]})"


def describe_resources(resources: Any) -> str:
    """``"cpu=1, gpu=0.5"`` (``" per worker"`` when the trial has several workers)."""
    text = f"cpu={resources.cpu:g}, gpu={resources.gpu:g}"
    return text + " per worker" if resources.workers > 1 else text


def placement(
    device: str,
    resources: Any,
    *,
    world_size: int = 1,
    start_epoch: int = 0,
    fallback: Optional[str] = None,
    denormals: Optional[str] = None,
) -> Dict[str, str]:
    """The placement of the calling trial process: ``device`` (``cuda`` made ``cuda:<index>``), the
    GPU's name, ``world_size``, the workers and resources the trial reserved, its Ray node id and the
    GPU ids Ray gave it, the epoch it (re)started at, the CPU-fallback warning if any, and what its CPU
    threads do with subnormal floats (``denormals``: one of :data:`flatlab.train.cpu_threads.MODES`)."""
    out: Dict[str, str] = {
        "device": device,
        "world_size": str(world_size),
        "workers": str(resources.workers),
        "resources": describe_resources(resources),
        "start_epoch": str(start_epoch),
    }
    if device.startswith("cuda"):
        index = torch.cuda.current_device() if device == "cuda" else torch.device(device).index or 0
        out["device"] = f"cuda:{index}"
        out["gpu_name"] = torch.cuda.get_device_name(index)
    if ray.is_initialized():
        out["node"] = ray.get_runtime_context().get_node_id()
        gpu_ids = ray.get_gpu_ids()
        if gpu_ids:
            out["gpu_ids"] = ",".join(map(str, gpu_ids))
    if fallback:
        out["cpu_fallback"] = fallback
    if denormals:
        out["cpu_denormals"] = denormals
    return out


def missing_resources(need: Mapping[str, float], have: Mapping[str, float]) -> Dict[str, Tuple[float, float]]:
    """``{resource: (needed, present)}`` for each resource of ``need`` that ``have`` (e.g.
    ``ray.cluster_resources()`` or ``ray.available_resources()``) holds less of."""
    return {k: (v, float(have.get(k, 0.0))) for k, v in need.items() if float(have.get(k, 0.0)) + 1e-9 < v}


def local_shortfall(
    study_name: str, resources: Any, cluster: Mapping[str, float], scales: Sequence[str] = ()
) -> Optional[str]:
    """The error of a local launch whose trials cannot run on the local Ray instance (``cluster``:
    its ``ray.cluster_resources()``): which resource, how much one trial needs, how much there is, and
    the ways out (the CPUs a suggested ``Resources`` asks for capped at what the instance has; ``scales``:
    other scales of the study file, named as ``--scale a|b``); ``None`` when one trial fits."""
    missing = missing_resources(resources.request(), cluster)
    if not missing:
        return None
    parts = ", ".join(f"{k} {need:g} (the local Ray instance has {have:g})" for k, (need, have) in missing.items())
    cpu = min(float(resources.cpu), float(cluster.get("CPU", 0.0)) / resources.workers)  # each worker's share
    if "GPU" in missing:
        way = (
            f"run it on a Ray cluster that has GPUs (--address HOST:PORT), or train on CPU with "
            f"Resources(cpu={cpu:g}, gpu=0)"
        )
    else:
        way = (
            "give the local instance more CPUs (--num-cpus), ask for fewer per "
            "trial (Resources(cpu=...)), or run it on a cluster (--address HOST:PORT)"
        )
    if scales:
        way += f", or another scale of this file: --scale {'|'.join(scales)}"
    return f"study {study_name!r}: each trial needs {parts}; no trial could ever start: {way}"


def waiting_for(request: Mapping[str, float], available: Mapping[str, float], total: Mapping[str, float]) -> str:
    """``"GPU (each needs 0.5; 0 of 0 free)"``: what a pending trial with ``request`` waits for on a
    cluster with ``available`` of ``total`` resources; ``""`` when it fits."""
    missing = missing_resources(request, available)
    return ", ".join(
        f"{k} (each needs {need:g}; {have:g} of {float(total.get(k, 0.0)):g} free)"
        for k, (need, have) in missing.items()
    )
