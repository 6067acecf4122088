"""A local study sends nothing out: ``import flatlab`` turns off Ray's usage statistics, MLflow's and
Hugging Face's telemetry (flatlab.telemetry), unless the user set them. Each case runs in a fresh interpreter with a
clean environment: MLflow also stays quiet under pytest or CI variables, which would hide the default."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flatlab
from flatlab.telemetry import OFF, disable_reporting

PROBE = """
import json, os, sys
{before}
import mlflow.telemetry
from ray._common.usage import usage_lib
print(json.dumps({{"mlflow_client": mlflow.telemetry.get_telemetry_client() is not None,
                  "ray_usage_stats": usage_lib.usage_stats_enabled(),
                  "env": {{k: os.environ.get(k) for k in (
                      "RAY_USAGE_STATS_ENABLED", "MLFLOW_DISABLE_TELEMETRY", "HF_HUB_DISABLE_TELEMETRY")}}}}))
"""


def probe(before: str, **env: str) -> dict:
    """Whether MLflow's telemetry client runs and Ray's usage statistics are on, after ``before`` ran."""
    clean = {
        "PATH": os.environ.get("PATH", "/usr/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(Path(flatlab.__file__).resolve().parents[1]),
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)], env=clean, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("before", ["import flatlab", "import mlflow\nimport flatlab"])
def test_import_flatlab_turns_both_off(before):
    # the second case: MLflow imported first had already started its client; flatlab drops it
    assert probe(before) == {
        "mlflow_client": False,
        "ray_usage_stats": False,
        "env": {"RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_DISABLE_TELEMETRY": "1"},
    }


def test_without_flatlab_both_report_and_a_users_setting_wins():
    # what flatlab turns off is on by default (the case this module exists for) ...
    assert probe("") == {
        "mlflow_client": True,
        "ray_usage_stats": True,
        "env": {"RAY_USAGE_STATS_ENABLED": None, "MLFLOW_DISABLE_TELEMETRY": None, "HF_HUB_DISABLE_TELEMETRY": None},
    }
    # ... and a user who set the variables keeps their choice
    chosen = {"RAY_USAGE_STATS_ENABLED": "1", "MLFLOW_DISABLE_TELEMETRY": "false", "HF_HUB_DISABLE_TELEMETRY": "0"}
    assert probe("import flatlab", **chosen) == {"mlflow_client": True, "ray_usage_stats": True, "env": chosen}


def test_disable_reporting_sets_only_what_is_unset():
    env = {"MLFLOW_DISABLE_TELEMETRY": "false", "OTHER": "x"}
    assert disable_reporting(env) == {"RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
    assert env == {
        "MLFLOW_DISABLE_TELEMETRY": "false",
        "OTHER": "x",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    assert disable_reporting(env) == {}
    assert OFF == {"RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_DISABLE_TELEMETRY": "1"}
