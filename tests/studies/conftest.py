"""Fixtures of the study-file tests: offline mode for the Hugging Face libraries, and one output root
per module whose local Ray (started by the first smoke run) is shut down after the module."""

import os

for _var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def smoke_root(tmp_path_factory):
    """One output root (one MLflow database) for every smoke run of a module; Ray is shut down after it."""
    root = tmp_path_factory.mktemp("smoke")
    yield root
    import ray

    if ray.is_initialized():
        ray.shutdown()
