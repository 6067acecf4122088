"""The exception of a failed Tune trial as text: the full report for ``error.txt``, and one line for a tag.

Tune writes a failed trial's error into ``error.txt`` under the trial's driver-side folder (in Ray's
temporary session directory, which later disappears and on a cluster exists only on the head), one
block per failure: ``Failure # <n> (occurred at <time>)`` followed by the ``RayTaskError`` text (the
worker's traceback, ending with the exception's ``Type: message`` line). :func:`read_trial_error`
reads the latest block at once, on the driver, so it can be logged to MLflow before it is gone.
"""

from __future__ import annotations

import re
from typing import Any, Optional

#: longest one-line summary (an MLflow tag value; the table column stays readable)
ONE_LINE_MAX = 250

_BLOCK = re.compile(r"^Failure # \d+ \(occurred at [^)]*\)\n", re.MULTILINE)
# "ValueError: msg", "ray.exceptions.RayTaskError(ValueError): msg", "KeyboardInterrupt"
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:\([\w.]+\))?)(?::\s?(.*))?$")


def read_trial_error(trial: Any) -> str:
    """The text of ``trial``'s latest failure (traceback included), read from Tune's error file.

    Falls back to ``trial.get_error()`` (Ray >= 2.x storage copy) and then to a short note when no
    file can be read. Never raises: a failed read is described in the returned text.
    """
    text: Optional[str] = None
    path = getattr(trial, "error_file", None)
    if path:
        try:
            with open(path, "r", encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            text = None
    if not text:
        get = getattr(trial, "get_error", None)
        try:
            got = get() if get is not None else None
            text = str(got) if got else None
        except Exception:  # storage not reachable: fall through to the note
            text = None
    if not text:
        return f"the trial raised, but Tune's error file could not be read ({path or 'no error file'})"
    starts = [m.end() for m in _BLOCK.finditer(text)]
    return (text[starts[-1] :] if starts else text).strip()


def one_line(text: str, limit: int = ONE_LINE_MAX) -> str:
    """``"Type: message"`` from a traceback (its last ``Type: message`` line that is not indented),
    shortened to at most ``limit`` characters (ending in ``"…"`` when cut).

    Ray's wrapper is unwrapped: ``RayTaskError(ValueError): msg`` gives ``ValueError: msg``. Text with
    no such line gives its first non-empty line.
    """
    lines = [row.rstrip() for row in text.strip().splitlines()]
    line = next((row for row in lines if row), "")
    for candidate in reversed(lines):
        if (
            not candidate
            or candidate[0].isspace()
            or candidate.startswith(("Traceback", "During handling", "The above"))
        ):
            continue
        m = _EXC_LINE.match(candidate)
        if m and (m.group(2) is not None or m.group(1).endswith(("Error", "Exception", "Interrupt", "Exit"))):
            name = m.group(1)
            inner = re.fullmatch(r"[\w.]*\(([\w.]+)\)", name)
            name = (inner.group(1) if inner else name).rsplit(".", 1)[-1]
            line = f"{name}: {m.group(2)}" if m.group(2) is not None else name
            break
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
