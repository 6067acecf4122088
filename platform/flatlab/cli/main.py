"""The ``flatlab`` console script: the Typer app with every command group registered on it
(:mod:`flatlab.cli.app` holds what they share; one module per group), and its exit.

The process ends as ``sys.exit`` ends it (non-daemon threads joined, every ``atexit`` handler run, the
standard streams flushed, the same status) but without the interpreter's final freeing of every module
and object, which the OS does at once: with MLflow and pandas loaded that teardown is a large share of
a short command such as ``flatlab results`` (measured in bench/README.md, "The CLI's exit").
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import List

from flatlab.cli import compare, curves, interpolation, listings, objectives, results, run  # noqa: F401 - register the commands
from flatlab.cli.app import app, reflow_command_help

reflow_command_help()

_status: List[int] = []  # the status main() ends the process with, once the CLI has returned


def main() -> None:
    """Console-script entry point: the CLI, then the exit described in the module docstring."""
    atexit.register(_end_process)  # registered first, so the last handler to run (atexit runs them LIFO)
    try:
        app()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    _status.append(exit_status(code))
    sys.exit(code)


def exit_status(code: object) -> int:
    """The process status ``sys.exit(code)`` gives: 0 for ``None``, an int as it is, 1 for anything else
    (which Python prints to stderr)."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _end_process() -> None:
    """The last ``atexit`` handler: the interpreter has joined the non-daemon threads and run every other
    handler (Ray's shutdown, logging's, MLflow's); flush the standard streams and end the process with
    :func:`main`'s status. Does nothing where :func:`main` did not finish (an uncaught exception)."""
    if not _status:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken pipe: nothing left to write to
            pass
    os._exit(_status[-1])


if __name__ == "__main__":  # pragma: no cover
    main()
