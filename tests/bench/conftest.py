"""The bench scripts are not a package: tests load them from their files."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def load_bench(filename: str) -> ModuleType:
    """``bench/<filename>`` as a module (registered in ``sys.modules``: dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(f"{Path(filename).stem}_bench", BENCH_DIR / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def optimizer_bench() -> ModuleType:
    """bench/optimizer_overhead.py as a module."""
    return load_bench("optimizer_overhead.py")


@pytest.fixture(scope="session")
def platform_bench() -> ModuleType:
    """bench/platform_overhead.py as a module."""
    return load_bench("platform_overhead.py")


@pytest.fixture(scope="session")
def checkpoint_bench() -> ModuleType:
    """bench/checkpoint_cost.py as a module."""
    return load_bench("checkpoint_cost.py")


@pytest.fixture(scope="session")
def fmnist_bench() -> ModuleType:
    """bench/fmnist_epoch_cost.py as a module."""
    return load_bench("fmnist_epoch_cost.py")


@pytest.fixture(scope="session")
def longrun_bench() -> ModuleType:
    """bench/optimizer_longrun.py as a module."""
    return load_bench("optimizer_longrun.py")


@pytest.fixture(scope="session")
def select_bench() -> ModuleType:
    """bench/select_cost.py as a module."""
    return load_bench("select_cost.py")


@pytest.fixture(scope="session")
def cli_exit_bench() -> ModuleType:
    """bench/cli_exit.py as a module."""
    return load_bench("cli_exit.py")


@pytest.fixture(scope="session")
def admire_bench() -> ModuleType:
    """bench/admire_standalone.py as a module."""
    return load_bench("admire_standalone.py")
