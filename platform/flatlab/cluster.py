"""Submitting studies to a Ray cluster as Ray Jobs (``flatlab submit``)."""

from __future__ import annotations

import asyncio
import os
import shlex
from pathlib import Path
from typing import Any, List

from flatlab.errors import ConfigError

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
    return bool(have)


def submit_study(
    address: str, study_file: Path, working_dir: Path, extra_args: List[str], *, follow: bool = False, console: Any = None
) -> str:
    """Submit ``flatlab run <study_file> <extra_args>`` as a Ray Job; returns the job id.

    The working directory is uploaded (``runtime_env.working_dir``, minus run outputs and virtualenvs),
    so the study file path must be relative to it. With ``follow`` the job's logs are streamed until it
    ends, and a failed job raises ``ConfigError`` carrying its status.
    """
    from ray.job_submission import JobStatus, JobSubmissionClient

    wd = Path(working_dir).resolve()
    sf = Path(study_file)
    rel = sf if not sf.is_absolute() else sf.resolve().relative_to(wd)
    if not (wd / rel).is_file():
        raise ConfigError(f"study file {study_file} not found under the working directory {wd}")
    entry = " ".join(["flatlab", "run", shlex.quote(str(rel)), *map(shlex.quote, extra_args)])
    client = JobSubmissionClient(address)
    job_id = client.submit_job(entrypoint=entry, runtime_env={"working_dir": str(wd), "excludes": EXCLUDES})
    if console is not None:
        console.print(f"submitted {job_id}: {entry}")
    if follow:
        async def _tail() -> None:
            async for lines in client.tail_job_logs(job_id):
                print(lines, end="", flush=True)

        asyncio.run(_tail())
        status = client.get_job_status(job_id)
        if status != JobStatus.SUCCEEDED:
            raise ConfigError(f"job {job_id} ended with status {status}")
    return job_id
