"""The ``flatlab`` console script: the Typer app with every command group registered on it
(:mod:`flatlab.cli.app` holds what they share; one module per group)."""

from __future__ import annotations

import os
import sys

from flatlab.cli import compare, curves, interpolation, listings, results, run  # noqa: F401 - register the commands
from flatlab.cli.app import app


def main() -> None:
    """Console-script entry point: the CLI, then a quick exit (see :func:`exit_without_teardown`)."""
    try:
        app()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    exit_without_teardown(code)


def exit_without_teardown(code: object = 0) -> None:
    """End the process like ``sys.exit(code)`` but without the interpreter's module teardown.

    Everything a normal exit does for correctness still happens, in the same order: the threading
    exit callbacks run and non-daemon threads are joined, ``atexit`` handlers run (Ray's shutdown,
    ``logging.shutdown``, MLflow's), and the standard streams are flushed. Only the final freeing of
    every module and object is skipped; with torch, Ray, MLflow and Optuna loaded that teardown alone
    takes 1-2 s, which the OS does for free. ``code`` follows ``sys.exit``: ``None`` is 0, an int is
    the status, anything else is printed to stderr and gives 1.
    """
    import atexit
    import threading

    # What the interpreter's exit does first: the callbacks registered with threading (they stop
    # idle concurrent.futures workers), then a join of every non-daemon thread.
    threading._shutdown()  # type: ignore[attr-defined]
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken pipe: nothing left to write to
                pass
        os._exit(status)


if __name__ == "__main__":  # pragma: no cover
    main()
