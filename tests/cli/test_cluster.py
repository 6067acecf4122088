"""Cluster runs: submitted jobs keep their outputs, run the head's Python on the uploaded checkout, and
`flatlab run --address` reaches a token-authenticated head or fails in one line within seconds."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flatlab.cli.main import app
from flatlab.cluster import check_address, job_entrypoint, job_output_args
from flatlab.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from flatlab_testing import BIN, env, free_port, ray_head, write_study  # noqa: E402

runner = CliRunner()


def test_submit_refuses_outputs_that_die_with_the_job(tmp_path, monkeypatch):
    monkeypatch.delenv("FLATLAB_ROOT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    write_study(tmp_path / "job.py", "STUDY = Study(name='job', workload='digits', arms=(Arm('sgd'),))\n")
    # nothing is contacted: the address is a closed port, the refusal comes first
    res = runner.invoke(
        app, ["submit", "job.py", "--address", f"http://127.0.0.1:{free_port()}", "--working-dir", str(tmp_path)]
    )
    assert res.exit_code == 2
    assert "temporary working directory, which is deleted with the job" in res.output
    assert "--arg=--root=" in res.output and "FLATLAB_ROOT" in res.output and "MLFLOW_TRACKING_URI" in res.output


@pytest.mark.parametrize(
    "args, environ, match",
    [
        ([], {}, r"give an absolute root on the head"),
        (["--root=runs"], {}, r"--root=runs is relative"),
        (["--root", "runs"], {}, r"--root=runs is relative"),
        ([], {"FLATLAB_ROOT": "flatlab-runs"}, r"--root=flatlab-runs is relative"),
        (["--root=~/runs"], {}, r"--root=~/runs is relative"),  # the job's shell does not expand a quoted ~
        (["--root=/data/runs", "--storage=ray"], {}, r"--storage=ray is relative"),
        (
            ["--root=/data/runs", "--tracking-uri=sqlite:///mlflow.db"],
            {},
            r"--tracking-uri=sqlite:///mlflow.db is relative",
        ),
        (["--root=/data/runs"], {"MLFLOW_TRACKING_URI": "mlruns"}, r"--tracking-uri=mlruns is relative"),
    ],
)
def test_job_outputs_must_outlive_the_job(args, environ, match):
    with pytest.raises(ConfigError, match=match):
        job_output_args(args, environ)


def test_lasting_outputs_pass_and_the_environment_is_forwarded():
    assert job_output_args(["--root=/data/runs"], {}) == []
    assert (
        job_output_args(["--root=/data/runs", "--tracking-uri=sqlite:////data/mlflow.db", "--storage=s3://b/x"], {})
        == []
    )
    assert job_output_args([], {"FLATLAB_ROOT": "/data/runs", "MLFLOW_TRACKING_URI": "http://10.0.0.5:5000"}) == [
        "--root=/data/runs",
        "--tracking-uri=http://10.0.0.5:5000",
    ]
    # a flag wins over the environment, which is then not forwarded
    assert job_output_args(["--root=/a"], {"FLATLAB_ROOT": "/b"}) == []


def test_the_job_runs_the_heads_python_on_the_uploaded_checkout(tmp_path):
    entry, rt = job_entrypoint("studies/digits_demo.py", ["--root=/data/runs", "--trials=2"], REPO)
    assert entry == "python -m flatlab.cli.main run studies/digits_demo.py --root=/data/runs --trials=2"
    assert rt["working_dir"] == str(REPO) and rt["py_modules"] == [str(REPO / "platform" / "flatlab")]
    entry, rt = job_entrypoint("job.py", [], tmp_path)  # not a checkout: the cluster's installed flatlab runs
    assert "py_modules" not in rt and rt["working_dir"] == str(tmp_path)


def test_the_cli_module_runs_as_main():
    res = subprocess.run(
        [sys.executable, "-m", "flatlab.cli.main", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "platform")},
    )
    assert res.returncode == 0 and "submit" in res.stdout and "run" in res.stdout


def test_an_unreachable_address_fails_in_one_line_within_seconds(tmp_path, monkeypatch):
    closed = free_port()
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=rf"--address 127.0.0.1:{closed}: no Ray head answers at 127.0.0.1:{closed}"):
        check_address(f"127.0.0.1:{closed}")
    assert time.monotonic() - t0 < 5
    with pytest.raises(ConfigError, match=r"that is a dashboard URL"):
        check_address("http://127.0.0.1:8265")
    with pytest.raises(ConfigError, match=r"expected HOST:PORT"):
        check_address("headnode")
    study = write_study(tmp_path / "s.py", "STUDY = Study(name='s', workload='digits', arms=(Arm('sgd'),))\n")
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    res = runner.invoke(app, ["run", str(study), "--address", f"127.0.0.1:{closed}"])
    assert res.exit_code == 2 and time.monotonic() - t0 < 10
    assert res.output.strip().count("\n") == 0 and f"127.0.0.1:{closed}" in res.output
    assert not (tmp_path / "flatlab-runs").exists()  # nothing was started or written


def test_cluster_yaml_passes_rays_own_validation():
    yaml = pytest.importorskip("yaml")
    pytest.importorskip("jsonschema")
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    validate_config(prepare_config(config))  # what `ray up` checks first (no cloud access needed)
    assert config["available_node_types"]["gpu_worker"]["resources"] == {"CPU": 4, "GPU": 1}


@pytest.mark.slow
@pytest.mark.integration
def test_run_reaches_a_token_authenticated_head(tmp_path):
    token = "f1a7" * 8
    home = tmp_path / "home"  # no ~/.ray/auth_token: the token comes from RAY_AUTH_TOKEN alone
    home.mkdir()
    head_env = {**env(), "HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    with ray_head("--num-cpus", "2", "--include-dashboard", "false", head_env=head_env) as gcs:
        study = write_study(
            tmp_path / "tok.py",
            """
STUDY = Study(name="tok", workload="digits", workload_params={"width": 8},
              arms=(Arm("sgd", space={"lr": 0.1}),), num_trials=1, max_epochs=1, scheduler="fifo")
""",
        )
        run_env = {**env(), "HOME": str(home), "RAY_AUTH_TOKEN": token}
        run_env.pop("RAY_AUTH_MODE", None)
        res = subprocess.run(
            [
                str(BIN / "flatlab"),
                "run",
                str(study),
                "--address",
                f"127.0.0.1:{gcs}",
                "--root",
                str(tmp_path / "root"),
            ],
            capture_output=True,
            text=True,
            timeout=400,
            env=run_env,
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "FINISHED" in res.stdout
