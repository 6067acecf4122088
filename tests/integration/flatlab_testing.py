"""Shared pieces of the integration tests: small study files and service launchers (loopback only)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ray_head(*args: str, head_env: Optional[dict] = None, timeout: float = 120) -> Iterator[int]:
    """A Ray head on 127.0.0.1 for one test: ``ray start --head --block`` with ``args`` in a session of its
    own and a Ray folder of its own (so that no ``ray.init()`` elsewhere on this machine finds it). Yields
    its GCS port once it accepts connections; on exit its whole session gets SIGTERM and the folder goes.
    Never ``ray stop``, which would stop every Ray instance on the machine (another test's, a user's)."""
    gcs = free_port()
    folder = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths live under it
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(gcs)]
        + ["--temp-dir", folder, "--disable-usage-stats", "--block", *args],
        env=head_env or env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", gcs), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and head.poll() is None, "the Ray head did not start"
                time.sleep(1)
        yield gcs
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # the head and the Ray processes it started (its own session)
        try:
            head.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        for pid in session_pids(head.pid):  # Ray's daemons that ignore SIGTERM, still of that session
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(folder, ignore_errors=True)


def session_pids(sid: int) -> list:
    """The processes (``/proc``) of session ``sid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    out.append(int(entry))
            except OSError:
                pass
    return out


def write_study(path: Path, body: str) -> Path:
    path.write_text("from flatlab import Arm, Study\nfrom flatlab import space as sp\n\n" + textwrap.dedent(body))
    return path


def assert_final_stage_ran_the_best_search_trial(trials) -> None:
    """Every final-stage run of a one-arm, one-seed fifo study (every search trial completed) has the
    ``lr`` of the search run with the highest final ``val/accuracy``. ``trials``: its MLflow trial runs."""
    from flatlab.tracking import runs

    def stage(name):
        return [r for r in trials if r.data.tags[runs.TAG_STAGE] == name]

    best = max(stage("search"), key=lambda r: r.data.metrics["val/accuracy"])
    assert {r.data.params["lr"] for r in stage("final")} == {best.data.params["lr"]}


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError:
            return  # it answers (e.g. 401 from a Ray head with token auth)
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def env() -> dict:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e.pop("MLFLOW_TRACKING_URI", None)
    e.pop("RAY_ADDRESS", None)
    return e


def flatlab(*args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "flatlab"), *args], capture_output=True, text=True, timeout=timeout, env=env(), **kw
    )


def run_epoch_hook(env_var: str, body: str) -> str:
    """Source of a ``sitecustomize`` module that, when ``env_var`` is set, wraps
    ``flatlab.train.trainer.Trainer.run_epoch`` in every Python process of a flatlab run (Ray's workers
    inherit ``PYTHONPATH``). ``body`` is the wrapper's body: ``self`` is the trainer, ``original(self)``
    runs the epoch, ``VALUE`` is the environment variable's value."""
    indented = textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 16)
    return f"""
import importlib.abc, importlib.util, os, sys

VALUE = os.environ.get({env_var!r})


class _PatchTrainer(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "flatlab.train.trainer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            original = module.Trainer.run_epoch

            def run_epoch(self):
{indented}

            module.Trainer.run_epoch = run_epoch

        spec.loader.exec_module = exec_module
        return spec


if VALUE:
    sys.meta_path.insert(0, _PatchTrainer())
"""


EXAMPLES = Path(__file__).resolve().parents[2] / "studies" / "examples"


def check_extensions_run(root: Path, tmp_path: Path, nodes=None) -> None:
    """Every trial of the example FINISHED with its own optimizer and the measure's value equal to the
    norm of the model it uploaded (on ``nodes``, when given)."""
    import pytest
    import torch
    from safetensors.torch import load_file

    from flatlab.tracking import runs
    from flatlab.tracking.logged_model import download_weights

    c = runs.client(runs.default_tracking_uri(root))
    exp = c.get_experiment_by_name("extensions_demo")
    trials = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
    assert len(trials) == 4 and all(r.info.status == "FINISHED" for r in trials)
    assert sorted(r.data.tags[runs.TAG_OPT] for r in trials) == ["lion", "lion", "sgd", "sgd"]
    for r in trials:
        (tmp_path / r.info.run_id).mkdir()
        weights = load_file(download_weights(c, r.info.run_id, str(tmp_path / r.info.run_id)))  # its logged model's
        norm = float(torch.sqrt(sum((w.double() ** 2).sum() for w in weights.values())))
        assert r.data.metrics["flat/param_norm"] == pytest.approx(norm, rel=1e-6)
        assert r.data.metrics["epoch"] == 4 and 0.0 <= r.data.metrics["test/accuracy"] <= 1.0
        if nodes is not None:
            assert r.data.tags["flatlab.node"] in nodes
