"""Submitting studies to a Ray cluster as Ray Jobs (``flatlab submit``)."""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.study import ray_compat

job_submission = lazy("ray.job_submission")  # Ray loads in seconds

EXCLUDES = ["flatlab-runs/", ".venv/", ".git/", "__pycache__/", "*.egg-info/", "bench/out/"]


def enable_token_auth_if_available() -> bool:
    """Use Ray's token authentication when a token is at hand and no mode was chosen.

    Recent Ray heads (``ray start``) require a token on the dashboard/Job API; the client only sends
    one with ``RAY_AUTH_MODE=token``. The token comes from ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
    ``~/.ray/auth_token``. Must run before Ray reads its configuration (i.e. before importing the
    job-submission client). Returns whether token mode is on.
    """
    if "RAY_AUTH_MODE" in os.environ:
        return os.environ["RAY_AUTH_MODE"] == "token"
    have = os.environ.get("RAY_AUTH_TOKEN") or os.path.exists(
        os.environ.get("RAY_AUTH_TOKEN_PATH", os.path.expanduser("~/.ray/auth_token"))
    )
    if have:
        os.environ["RAY_AUTH_MODE"] = "token"
        ray_compat.refresh_auth_config()  # Ray may have read its config already
    return bool(have)


GCS_PORT = 6379  # `ray start --head`'s default --port

TOKEN_SOURCES = "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"


def match_cluster_auth(address: str, timeout: float = 3.0) -> Optional[bool]:
    """Make this driver's Ray authentication mode the one the cluster at ``address`` (``HOST:PORT``) uses,
    before ``ray.init``; returns whether token mode is on (``None``: the cluster's mode is unknown and
    nothing was changed).

    The two must agree both ways: a cluster with token authentication refuses a driver without its
    token, and a driver in token mode refuses the calls of the cluster's raylets, which carry no token
    when the cluster has none. The raylet then cannot reach the driver that owns the trials, the GCS
    takes the driver for dead and cancels every trial actor before it starts (``ActorDiedError: ... it
    was cancelled before it started running``). A token file alone says nothing about the cluster: Ray
    writes ``~/.ray/auth_token`` at any local ``ray.init``. So the cluster is asked
    (:func:`flatlab.study.ray_compat.gcs_requires_token`): with ``RAY_AUTH_MODE`` unset, token mode is
    turned on exactly when the cluster requires it (``RAY_AUTH_MODE=disabled`` otherwise).

    Raises:
        ConfigError: ``RAY_AUTH_MODE`` is set here and disagrees with the cluster; the cluster requires a
            token and none is at hand. Each message names the fix.
    """
    required = ray_compat.gcs_requires_token(address, timeout=timeout)
    if required is None:
        return None
    given = os.environ.get("RAY_AUTH_MODE")
    if given is not None and (given == "token") != required:
        if required:
            raise ConfigError(
                f"--address {address}: that Ray cluster requires token authentication, but RAY_AUTH_MODE={given} "
                f"here; set RAY_AUTH_MODE=token (or unset it) and give the cluster's token ({TOKEN_SOURCES})"
            )
        raise ConfigError(
            f"--address {address}: that Ray cluster does not use token authentication, but RAY_AUTH_MODE=token here: "
            f"its nodes could not reach this driver and every trial would be cancelled before it starts; unset "
            f"RAY_AUTH_MODE, or start every node of the cluster with RAY_AUTH_MODE=token"
        )
    if required and not (
        os.environ.get("RAY_AUTH_TOKEN")
        or os.path.exists(os.environ.get("RAY_AUTH_TOKEN_PATH", os.path.expanduser("~/.ray/auth_token")))
    ):
        raise ConfigError(
            f"--address {address}: that Ray cluster requires token authentication and no token is at hand "
            f"here; give the cluster's token ({TOKEN_SOURCES})"
        )
    if given is None:
        os.environ["RAY_AUTH_MODE"] = "token" if required else "disabled"
        ray_compat.refresh_auth_config()  # Ray may have read its config already
    return required


def check_address(address: str, timeout: float = 3.0) -> None:
    """Fail fast when the Ray cluster at ``address`` (``flatlab run --address``) cannot be reached.

    ``address`` is the head's GCS address ``HOST:PORT`` (``ray start --head --port``, 6379 by default)
    or a Ray Client address ``ray://HOST:PORT``; ``auto`` and ``local`` are left to Ray. A TCP connect
    with ``timeout`` seconds replaces Ray's own 20-30 s of retries and traceback. Then this driver's
    authentication mode is made the cluster's (:func:`match_cluster_auth`; for ``ray://``, token mode
    when a token is at hand, :func:`enable_token_auth_if_available`).

    Raises:
        ConfigError: a malformed address, a dashboard URL, nothing answering there, or an authentication
            mode that disagrees with the cluster's; one line naming the address.
    """
    if address in ("auto", "local"):
        enable_token_auth_if_available()
        return
    if address.startswith(("http://", "https://")):
        raise ConfigError(
            f"--address {address}: that is a dashboard URL (used by `flatlab submit`); `flatlab run --address` takes "
            f"the head's GCS address HOST:PORT (port {GCS_PORT} by default) or ray://HOST:10001"
        )
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
        raise ConfigError(
            f"--address {address}: no Ray head answers at {host}:{port} ({reason} within {timeout:g} s); is `ray start "
            f"--head` running there and is this its GCS port ({GCS_PORT} by default, not the dashboard's 8265)?"
        ) from None
    if address.startswith("ray://"):
        enable_token_auth_if_available()
    else:
        match_cluster_auth(f"{host}:{port}" if ":" not in host else f"[{host}]:{port}", timeout)


def _host_port(address: str) -> Tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; raises ConfigError naming the address."""
    rest = address.split("://", 1)[1] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--address {address!r}: expected HOST:PORT (e.g. 10.0.0.5:{GCS_PORT}) or ray://HOST:10001")
    return host.strip("[]"), int(port)


def job_output_args(extra_args: List[str], environ: Mapping[str, str]) -> List[str]:
    """The ``flatlab run`` arguments that send a submitted job's outputs somewhere that outlives the job.

    A Ray Job runs in a temporary copy of the working directory, deleted with the job: ``flatlab run``'s
    default root (``./flatlab-runs``: ``launch.json``, ``optuna.db``, Tune storage and the SQLite MLflow
    store) would vanish there, and ``flatlab results`` / ``--resume`` would never find it. So the job needs
    an absolute ``--root`` on the head (or shared storage), from ``--arg=--root=...`` or this machine's
    ``FLATLAB_ROOT``; an MLflow tracking URI from ``--arg=--tracking-uri=...`` or ``MLFLOW_TRACKING_URI`` is
    forwarded too (without one, MLflow's SQLite store goes under the root). Values taken from the
    environment are returned as extra arguments; relative paths are refused.

    Raises:
        ConfigError: no root, or a root, storage path or SQLite/file tracking URI that is relative (it would
            land in the job's temporary working directory).
    """
    given = _options(extra_args)
    added: List[str] = []
    for option, env in (("--root", "FLATLAB_ROOT"), ("--tracking-uri", "MLFLOW_TRACKING_URI")):
        if option not in given and environ.get(env):
            given[option] = environ[env]
            added.append(f"{option}={environ[env]}")
    root = given.get("--root")
    if root is None:
        raise ConfigError(
            "flatlab submit: the job would write launch.json, optuna.db, Tune's storage and (without a tracking URI) "
            "MLflow under ./flatlab-runs in its temporary working directory, which is deleted with the job; give an "
            "absolute root on the head, --arg=--root=/home/ubuntu/flatlab-runs (or set FLATLAB_ROOT), and an MLflow "
            "server, --arg=--tracking-uri=http://HEAD_PRIVATE_IP:5000 (or set MLFLOW_TRACKING_URI)"
        )
    problems = []
    if not _lasting_path(root):
        problems.append(f"--root={root}")
    storage = given.get("--storage")
    if storage is not None and not _lasting_path(storage):
        problems.append(f"--storage={storage}")
    uri = given.get("--tracking-uri")
    if uri is not None and not _lasting_uri(uri):
        problems.append(f"--tracking-uri={uri}")
    if problems:
        raise ConfigError(
            f"flatlab submit: {', '.join(problems)} is relative, i.e. inside the job's temporary working directory, "
            "which is deleted with the job; use absolute paths on the head or shared storage (s3://..., "
            "sqlite:////abs/path, http://HEAD:5000)"
        )
    return added


def _options(args: List[str]) -> Dict[str, str]:
    """``--name value`` / ``--name=value`` pairs of ``args`` (the last one wins)."""
    out: Dict[str, str] = {}
    for i, a in enumerate(args):
        if not a.startswith("--"):
            continue
        name, eq, value = a.partition("=")
        if eq:
            out[name] = value
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[name] = args[i + 1]
    return out


def _lasting_path(path: str) -> bool:
    """An absolute local path or a URI (``s3://``, ``gs://`` ...): not inside the job's working directory."""
    return "://" in path or os.path.isabs(path)  # "~/x" is not expanded in the job: a folder named "~" there


def _lasting_uri(uri: str) -> bool:
    """A tracking URI that outlives the job: a server (``http(s)://``, ``databricks`` ...) or an absolute
    SQLite / file path (``sqlite:////abs/mlflow.db``, ``file:///abs``, ``/abs``)."""
    if uri.startswith("sqlite:///"):
        return uri[len("sqlite:///") :].startswith("/")
    if uri.startswith("file:"):
        rest = uri[len("file:") :]
        return rest.startswith("/")  # file:/abs or file:///abs; file:relative is inside the job's folder
    if "://" in uri or uri == "databricks" or uri.startswith("databricks"):
        return True
    return os.path.isabs(uri)


def job_entrypoint(study_file: str, extra_args: List[str], working_dir: Path) -> Tuple[str, Dict[str, Any]]:
    """The Ray Job's shell command and runtime environment for ``flatlab run study_file extra_args``.

    The command is ``python -m flatlab.cli.main run ...``: the head's Python (the one Ray runs with must
    be first on its PATH, see the README), not a ``flatlab`` script that may not be on PATH. When the
    working directory is a flatlab checkout (``platform/flatlab``), that package is uploaded as a
    ``py_modules`` entry, which Ray puts first on ``PYTHONPATH`` of the job and its trial workers: the
    submitted checkout's code runs, not the copy installed on the cluster.
    """
    entry = " ".join(
        ["python", "-m", "flatlab.cli.main", "run", shlex.quote(study_file), *map(shlex.quote, extra_args)]
    )
    runtime_env: Dict[str, Any] = {"working_dir": str(working_dir), "excludes": EXCLUDES}
    package = working_dir / "platform" / "flatlab"
    if (package / "__init__.py").is_file():
        runtime_env["py_modules"] = [str(package)]
    return entry, runtime_env


def submit_study(
    address: str,
    study_file: Path,
    working_dir: Path,
    extra_args: List[str],
    *,
    follow: bool = False,
    console: Any = None,
) -> str:
    """Submit ``flatlab run <study_file> <extra_args>`` as a Ray Job; returns the job id.

    The working directory is uploaded (``runtime_env.working_dir``, minus run outputs and virtualenvs),
    so the study file path must be relative to it; the job runs with the head's Python
    (:func:`job_entrypoint`). Its outputs must outlive it (:func:`job_output_args`: an absolute root,
    from ``--arg=--root=...`` or ``FLATLAB_ROOT``; ``MLFLOW_TRACKING_URI`` is forwarded). With ``follow``
    the job's logs are streamed until it ends, and a failed job raises ``ConfigError`` carrying its status.

    Raises:
        ConfigError: the study file is not under the working directory; outputs that would not outlive
            the job; with ``follow``, a job that did not succeed.
    """
    wd = Path(working_dir).resolve()
    sf = Path(study_file)
    rel = sf if not sf.is_absolute() else sf.resolve().relative_to(wd)
    if not (wd / rel).is_file():
        raise ConfigError(f"study file {study_file} not found under the working directory {wd}")
    extra_args = [*extra_args, *job_output_args(extra_args, os.environ)]
    entry, runtime_env = job_entrypoint(str(rel), extra_args, wd)
    client = job_submission.JobSubmissionClient(address)
    job_id = client.submit_job(entrypoint=entry, runtime_env=runtime_env)
    if console is not None:
        console.print(f"submitted {job_id}: {entry}")
    if follow:

        async def _tail() -> None:
            async for lines in client.tail_job_logs(job_id):
                print(lines, end="", flush=True)

        asyncio.run(_tail())
        status = client.get_job_status(job_id)
        if status != job_submission.JobStatus.SUCCEEDED:
            raise ConfigError(f"job {job_id} ended with status {status}")
    return job_id
