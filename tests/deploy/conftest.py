"""What the deploy tests read: deploy/settings.env and the YAML documents of a file."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def read_settings(path: Path = DEPLOY / "settings.env") -> dict:
    """``KEY=value`` lines of a settings file (comments and blank lines skipped), as the SLURM script reads it.

    Raises:
        ValueError: a line that is neither, naming the file and line.
    """
    settings = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Z][A-Z0-9_]*)=(\S*)", line)
        if match is None:
            raise ValueError(f"{path}:{n}: expected KEY=value (no spaces, no quotes), got {line!r}")
        settings[match.group(1)] = match.group(2)
    return settings


@pytest.fixture(scope="session")
def settings() -> dict:
    return read_settings()


@pytest.fixture(scope="session")
def parse_settings():
    """The parser itself (conftest modules are not importable under --import-mode=importlib)."""
    return read_settings


@pytest.fixture(scope="session")
def kuberay() -> dict:
    """Every document of deploy/kuberay/*.yaml by (kind, name)."""
    import yaml

    docs = {}
    for path in sorted((DEPLOY / "kuberay").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs
