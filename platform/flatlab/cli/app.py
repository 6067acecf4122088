"""The ``flatlab`` Typer app and what its commands share (consoles, the output root, the error exit),
so that command modules (:mod:`flatlab.cli.main`, :mod:`flatlab.cli.curves`) register on it without
importing each other."""

from __future__ import annotations

import inspect
import os
import re
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from flatlab.analysis.selection import RANKINGS
from flatlab.errors import FlatlabError

# MLflow's tqdm bars ("Downloading artifacts: 100%|...") would interleave with the CLI's own lines (the
# study report a --resume rebuilds downloads artifacts); read by MLflow when it downloads, so set here,
# before any command imports it. A user's explicit setting wins.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Hyperparameter studies of sharpness-aware and flat-minima training.",
)
# Piped output: 160 columns unless COLUMNS says otherwise (rich would assume 80).
console = Console(highlight=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)
err = Console(stderr=True, highlight=False)


def command_help(doc: str) -> str:
    """A command's docstring as ``--help`` shows it: each paragraph joined into one line (Typer keeps the
    line breaks of every paragraph after the first, and the terminal then wraps those lines a second
    time), a line starting ``- `` kept as a list item, and reST's double backticks dropped."""
    paragraphs = []
    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        lines = [line.strip() for line in paragraph.splitlines()]
        items: list = []
        for line in lines:
            if items and not line.startswith("- "):
                items[-1] = f"{items[-1]} {line}"
            else:
                items.append(line)
        paragraphs.append("\n".join(items))
    return re.sub(r"``([^`]+)``", r"\1", "\n\n".join(paragraphs))


def reflow_command_help() -> None:
    """Give every registered command whose help is its docstring the :func:`command_help` form of it; run
    once, after the command modules have registered on :data:`app`."""
    for info in app.registered_commands:
        if info.help is None and info.callback is not None and info.callback.__doc__:
            info.help = command_help(info.callback.__doc__)


ROOT_HELP = "output root: MLflow SQLite store, Optuna studies, Tune storage, logs (env FLATLAB_ROOT)"


def _root(root: Optional[Path]) -> Path:
    return root or Path(os.environ.get("FLATLAB_ROOT", "flatlab-runs"))


def check_rank_by(rank_by: str) -> None:
    """``--rank-by`` is one of :data:`flatlab.analysis.selection.RANKINGS`, checked before any store is read
    (a study whose table does not use it still refuses a misspelt value).

    Raises:
        FlatlabError: naming the option and the allowed values.
    """
    if rank_by not in RANKINGS:
        raise FlatlabError(f"--rank-by {rank_by!r} is not supported; expected one of {', '.join(RANKINGS)}")


def check_confidence(confidence: float) -> None:
    """``--confidence`` is a probability strictly between 0 and 1.

    Raises:
        FlatlabError: naming the option and the allowed values.
    """
    if not 0 < confidence < 1:
        raise FlatlabError(f"--confidence {confidence!r}: expected a number in (0, 1), e.g. 0.95 (not a percentage)")


def _fail(exc: Exception) -> None:
    err.print(f"[red]error:[/red] {exc}", soft_wrap=True)  # one line per message, also when piped
    raise typer.Exit(2)
