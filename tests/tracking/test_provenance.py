"""Which flatlab code a launch ran: the commit, whether the package differed from it, and a digest of
the package's source that needs no git (flatlab.tracking.provenance.provenance_tags)."""

import hashlib
import subprocess

import pytest

from flatlab.tracking import runs


def package(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_source_digest_is_sha256_of_paths_and_bytes_in_path_order(tmp_path):
    pkg = package(
        tmp_path / "pkg",
        {
            "b.py": "x = 2\n",
            "a/__init__.py": "",
            "a/m.py": "y = 1\n",
            "a/__pycache__/m.cpython-311.py": "ignored",
            "notes.txt": "ignored",
        },
    )
    h = hashlib.sha256()
    for rel, data in (("a/__init__.py", b""), ("a/m.py", b"y = 1\n"), ("b.py", b"x = 2\n")):  # by hand
        h.update(len(rel).to_bytes(8, "big") + rel.encode() + len(data).to_bytes(8, "big") + data)
    assert runs.source_digest(pkg) == h.hexdigest()[:16]
    before = runs.source_digest(pkg)
    (pkg / "a" / "__pycache__" / "m.cpython-311.py").write_text("changed")  # caches and other files: no change
    (pkg / "notes.txt").write_text("changed")
    assert runs.source_digest(pkg) == before
    (pkg / "b.py").write_text("x = 3\n")  # one byte of code
    assert runs.source_digest(pkg) != before
    (pkg / "b.py").write_text("x = 2\n")
    assert runs.source_digest(pkg) == before
    (pkg / "b.py").rename(pkg / "c.py")  # same bytes under another name
    assert runs.source_digest(pkg) != before
    with pytest.raises(FileNotFoundError, match="not a directory"):
        runs.source_digest(tmp_path / "missing")


def test_the_installed_package_has_a_digest_and_the_launch_tags_name_it():
    tags = runs.provenance_tags()
    assert tags[runs.TAG_SOURCE] == runs.source_digest(runs.PACKAGE_DIR)
    assert len(tags[runs.TAG_SOURCE]) == 16 and int(tags[runs.TAG_SOURCE], 16) >= 0
    assert tags[runs.TAG_COMMIT] == runs.git_commit()
    assert tags.get(runs.TAG_DIRTY, "true") in ("true", "false")


def test_git_dirty_counts_changes_to_tracked_files_only(tmp_path):
    pkg = package(tmp_path / "repo" / "pkg", {"m.py": "y = 1\n"})
    assert runs.git_dirty(pkg) is None  # not a git checkout yet
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q"], cwd=pkg.parent, check=True)
    assert runs.git_dirty(pkg) is False  # untracked files only
    subprocess.run(git + ["add", "-A"], cwd=pkg.parent, check=True)
    assert runs.git_dirty(pkg) is True  # staged, not committed
    subprocess.run(git + ["commit", "-qm", "c"], cwd=pkg.parent, check=True)
    assert runs.git_dirty(pkg) is False
    (pkg / "new.py").write_text("z = 0\n")  # untracked: not counted
    assert runs.git_dirty(pkg) is False
    (pkg / "m.py").write_text("y = 2\n")
    assert runs.git_dirty(pkg) is True
    (pkg.parent / "elsewhere.py").write_text("")  # outside the package: not its business
    subprocess.run(git + ["add", "elsewhere.py"], cwd=pkg.parent, check=True)
    subprocess.run(["git", "checkout", "-q", "--", "pkg/m.py"], cwd=pkg.parent, check=True)
    assert runs.git_dirty(pkg) is False
