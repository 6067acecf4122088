"""The bench scripts are not a package: tests load them from their files."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="session")
def optimizer_bench():
    """bench/optimizer_overhead.py as a module."""
    spec = importlib.util.spec_from_file_location("optimizer_overhead_bench", BENCH_DIR / "optimizer_overhead.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
