"""Write every result table of the docs from the commands that produce them (``make docs-results``).

Each entry of :data:`RESULTS` names a study file to run and the command that prints its table. The
script runs them (or, with ``--no-run``, only reads an existing output root), saves each printed table
as ``docs/results/<key>.md`` under a line that says when, at which commit and by which commands it was
made, and replaces the block between ``<!-- results:<key> -->`` and ``<!-- /results:<key> -->`` in
README.md and docs/*.md with that file. A table in the docs is therefore never typed by hand;
``tests/test_docs_results.py`` checks that every block equals its file.

Usage::

    python tools/docs_results.py                      # every entry (the CPU studies: about 2.5 hours here)
    python tools/docs_results.py --only digits_flatness_demo
    python tools/docs_results.py --no-run --root flatlab-runs   # re-render from runs already made
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "docs" / "results"
DOCS = ("README.md", "docs")
BLOCK = re.compile(r"(<!-- results:(?P<key>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=key) -->)", re.S)


@dataclass(frozen=True)
class Entry:
    """One table: ``run`` (flatlab command lines that make the runs, each a list of arguments after
    ``flatlab``), ``table`` (the command whose standard output is the table) and ``studies`` (the
    studies it reads, whose launches the stamp names; by default the key)."""

    key: str
    run: Tuple[Tuple[str, ...], ...]
    table: Tuple[str, ...]
    studies: Tuple[str, ...] = ()

    def read(self) -> Tuple[str, ...]:
        return self.studies or (self.key,)


RESULTS: Dict[str, Entry] = {
    e.key: e
    for e in (
        Entry(
            "digits_flatness_demo",
            (("run", "studies/digits_flatness.py", "--scale", "demo"),),
            ("compare", "digits_flatness_demo", "--format", "markdown"),
        ),
        Entry(
            "deepobs_fmnist_2c2d_cpu",
            (("run", "studies/deepobs_fmnist.py", "--scale", "cpu"),),
            ("curves", "deepobs_fmnist_2c2d_cpu", "--format", "markdown"),
        ),
        Entry(
            "fmnist_flatness",
            (("run", "studies/fmnist_flatness.py"),),
            ("compare", "fmnist_flatness", "--format", "markdown"),
        ),
        Entry(
            "digits_fmnist_summary",
            (),
            (
                "compare",
                "digits_flatness_demo",
                "fmnist_flatness",
                "--format",
                "markdown",
                "--plot",
                "docs/img/profiles_digits_fmnist.png",
            ),
            studies=("digits_flatness_demo", "fmnist_flatness"),
        ),
        Entry(
            "fmnist_flatness_replicate",
            (("run", "studies/fmnist_flatness.py", "--scale", "cpu-replicate"),),
            ("compare", "fmnist_flatness_replicate", "--format", "markdown"),
        ),
        Entry(
            "fmnist_flatness_design",
            (),
            ("compare", "fmnist_flatness", "--design", "--format", "markdown"),
            studies=("fmnist_flatness",),
        ),
        Entry(
            "fmnist_flatness_correlation",
            (),
            (
                "compare",
                "fmnist_flatness",
                "--correlation",
                "--format",
                "markdown",
                "--output",
                "docs/img/fmnist_flatness",
            ),
            studies=("fmnist_flatness",),
        ),
        Entry(
            "fmnist_equal_compute",
            (("run", "studies/fmnist_equal_compute.py"),),
            ("compare", "fmnist_equal_compute", "--format", "markdown"),
        ),
        Entry(
            "fmnist_equal_compute_replicate",
            (("run", "studies/fmnist_equal_compute.py", "--scale", "cpu-replicate"),),
            ("compare", "fmnist_equal_compute_replicate", "--format", "markdown"),
        ),
        Entry(
            "fmnist_equal_compute_time_to_target",
            (),
            ("compare", "fmnist_equal_compute", "--time-to-target", "--target", "0.87", "--format", "markdown"),
            studies=("fmnist_equal_compute",),
        ),
        Entry(
            "fmnist_equal_compute_replicate_time_to_target",
            (),
            (
                "compare",
                "fmnist_equal_compute_replicate",
                "--time-to-target",
                "--target",
                "0.87",
                "--format",
                "markdown",
            ),
            studies=("fmnist_equal_compute_replicate",),
        ),
        Entry(
            "fmnist_equal_compute_time_to_target_adamw",
            (),
            (
                "compare",
                "fmnist_equal_compute",
                "--time-to-target",
                "--target",
                "0.87",
                "--reference",
                "adamw",
                "--format",
                "markdown",
            ),
            studies=("fmnist_equal_compute",),
        ),
        Entry(
            "fmnist_equal_compute_at_equal_seconds",
            (),
            ("compare", "fmnist_equal_compute", "--at-equal", "seconds", "--format", "markdown"),
            studies=("fmnist_equal_compute",),
        ),
        Entry(
            "fmnist_tuning_curves",
            (("run", "studies/fmnist_tuning_curves.py"),),
            (
                "compare",
                "fmnist_tuning_curves",
                "--tuning-curves",
                "--format",
                "markdown",
                "--output",
                "docs/img/fmnist_tuning_curves",
            ),
        ),
        Entry(
            "fmnist_tuning_curves_correlation",
            (),
            (
                "compare",
                "fmnist_tuning_curves",
                "--correlation",
                "--format",
                "markdown",
                "--output",
                "docs/img/fmnist_tuning_curves",
            ),
            studies=("fmnist_tuning_curves",),
        ),
    )
}


def flatlab(args: Sequence[str], root: Path, capture: bool) -> str:
    """Run ``flatlab <args> --root <root>`` in this interpreter's environment; its stdout when
    ``capture``. Raises ``subprocess.CalledProcessError`` when it fails."""
    cmd = [sys.executable, "-m", "flatlab.cli.main", *args, "--root", str(root)]
    print("$ flatlab " + " ".join(args), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, cwd=REPO, check=True, text=True, stdout=subprocess.PIPE if capture else None)
    return done.stdout if capture else ""


def commit() -> str:
    """The checkout's commit (``+dirty`` when tracked files differ from it)."""
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, text=True, capture_output=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, text=True, capture_output=True
    ).stdout.strip()
    return (head or "unknown") + ("+dirty" if dirty else "")


def launches(entry: Entry, root: Path) -> List[str]:
    """For each study the entry reads: its latest launch's date and the commit it ran at (the MLflow
    parent run's ``flatlab.git_commit`` tag, ``+dirty`` when the package differed from it, and then, or
    outside git, its ``flatlab.source_digest``), as text; a study without a readable launch says so."""
    import json

    out = []
    for study in entry.read():
        try:
            launch = json.loads((root / study / "launch.json").read_text())
            from flatlab.tracking import runs

            run = runs.client(launch["tracking_uri"]).get_run(launch["parent_run_id"])
            started = dt.datetime.fromtimestamp(run.info.start_time / 1000)
            tags = run.data.tags
            commit = tags.get(runs.TAG_COMMIT, "unknown")
            dirty = tags.get(runs.TAG_DIRTY) == "true"
            source = tags.get(runs.TAG_SOURCE)
            digest = source and (dirty or commit == "unknown")  # the commit alone does not say which code ran
            out.append(
                f"{study} launched {started:%Y-%m-%d %H:%M} at commit `{commit[:12]}{'+dirty' if dirty else ''}`"
                + (f" (flatlab source digest `{source}`)" if digest else "")
            )
        except Exception as exc:  # noqa: BLE001 - the stamp says what is not known
            out.append(f"{study}: launch not readable ({type(exc).__name__})")
    return out


def stamp(entry: Entry, when: dt.datetime, rev: str, ran: Sequence[str] = ()) -> str:
    """The line above a saved table: its date, commit and commands, and the launches it reads (``ran``)."""
    cmds = "; ".join("`flatlab " + " ".join(c) + "`" for c in (*entry.run, entry.table))
    runs_text = f" Runs: {'; '.join(ran)}." if ran else ""
    return f"*Written by `make docs-results` on {when:%Y-%m-%d} at commit `{rev}`: {cmds}.{runs_text}*\n\n"


def write_table(entry: Entry, root: Path, run: bool, rev: str = "") -> Path:
    """Run ``entry`` (unless ``run`` is false), save its table to ``docs/results/<key>.md`` stamped with
    commit ``rev`` (default: the checkout's now); the path."""
    if run:
        for args in entry.run:
            flatlab(args, root, capture=False)
    table = flatlab(entry.table, root, capture=True).strip() + "\n"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{entry.key}.md"
    path.write_text(stamp(entry, dt.datetime.now(), rev or commit(), launches(entry, root)) + table)
    return path


def doc_files(repo: Path = REPO) -> List[Path]:
    """README.md and every markdown file under docs/ (the saved tables themselves excluded)."""
    out = [repo / "README.md"]
    out += sorted(p for p in (repo / "docs").rglob("*.md") if "results" not in p.relative_to(repo / "docs").parts[:1])
    return [p for p in out if p.is_file()]


def blocks(text: str) -> List[Tuple[str, str]]:
    """``(key, body)`` of every results block in ``text``."""
    return [(m.group("key"), m.group("body")) for m in BLOCK.finditer(text)]


def fill(text: str, tables: Dict[str, str]) -> str:
    """``text`` with every results block whose key is in ``tables`` replaced by that table.

    Raises:
        KeyError: a block names a key that has no saved table.
    """

    def sub(m: "re.Match[str]") -> str:
        key = m.group("key")
        if key not in tables:
            raise KeyError(f"no saved table docs/results/{key}.md for the block <!-- results:{key} -->")
        return m.group(1) + tables[key] + m.group(4)

    return BLOCK.sub(sub, text)


def saved_tables(results_dir: Path = RESULTS_DIR) -> Dict[str, str]:
    """Every saved table, by key."""
    return {p.stem: p.read_text() for p in sorted(results_dir.glob("*.md"))}


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(RESULTS), help="this entry only (repeatable)")
    parser.add_argument("--root", type=Path, default=REPO / "flatlab-runs", help="output root of the runs")
    parser.add_argument("--no-run", action="store_true", help="read the tables from runs already in --root")
    args = parser.parse_args(list(argv) or None)
    rev = commit()  # before this tool changes any file: the tables it writes would make the checkout dirty
    for key in args.only or list(RESULTS):
        print(f"wrote {write_table(RESULTS[key], args.root.resolve(), run=not args.no_run, rev=rev).relative_to(REPO)}")
    tables = saved_tables()
    for path in doc_files():
        text = path.read_text()
        new = fill(text, tables)
        if new != text:
            path.write_text(new)
            print(f"updated {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
