"""Which flatlab code a launch ran: the checkout's git commit, whether its tracked files were changed, and
a digest of the package's source that holds with or without git (:func:`provenance_tags`, set on every
launch's parent run)."""

from __future__ import annotations

import hashlib
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Dict, Optional, Sequence

from flatlab.tracking.layout import TAG_COMMIT, TAG_DIRTY, TAG_SOURCE

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # platform/flatlab


def _git(args: Sequence[str], cwd: Path) -> Optional[str]:
    """``git <args>``'s stdout in ``cwd`` (stripped), or ``None`` when git is missing or fails there."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The flatlab checkout's commit (``unknown`` outside a git checkout)."""
    return _git(["rev-parse", "HEAD"], PACKAGE_DIR) or "unknown"


def git_dirty(package: Path = PACKAGE_DIR) -> Optional[bool]:
    """Whether tracked files under ``package`` differ from the checkout's commit (staged or not;
    untracked files are not counted), ``None`` outside a git checkout. A launch records it as
    :data:`TAG_DIRTY`: with ``true``, the commit alone does not say which code ran (see
    :func:`source_digest`)."""
    out = _git(["status", "--porcelain", "--untracked-files=no", "--", "."], package)
    return None if out is None else bool(out)


def source_digest(package: Path = PACKAGE_DIR) -> str:
    """16 hex digits of SHA-256 over the package's Python source: every ``*.py`` file under ``package``
    (``__pycache__`` left out), in order of relative path, each as its path and its bytes. Two launches
    with the same digest ran the same flatlab code, whether or not either came from a git checkout or a
    clean one; a launch records it as :data:`TAG_SOURCE`.

    Raises:
        FileNotFoundError: ``package`` is not a directory.
    """
    if not package.is_dir():
        raise FileNotFoundError(f"source_digest: {package} is not a directory")
    h = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts):
        rel = path.relative_to(package).as_posix().encode()
        data = path.read_bytes()
        h.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()[:16]


def provenance_tags() -> Dict[str, str]:
    """The tags that say which flatlab code a launch ran: :data:`TAG_COMMIT`, :data:`TAG_SOURCE` and,
    inside a git checkout, :data:`TAG_DIRTY` (``true``/``false``)."""
    tags = {TAG_COMMIT: git_commit(), TAG_SOURCE: source_digest()}
    dirty = git_dirty()
    if dirty is not None:
        tags[TAG_DIRTY] = "true" if dirty else "false"
    return tags
