"""Ray's error broadcasts go to the study's log file, not the terminal.

A Ray driver runs a thread (``ray._private.worker.listen_error_messages``) that prints every error the
cluster publishes, e.g. the multi-line "A worker died or was killed while executing a task by an
unexpected system error ..." when a trial's worker is killed, straight to stdout through
``ray._private.worker.print_to_stdstream``, even with ``log_to_driver=False``. Those messages come
from the ``raylet`` pseudo-process; :func:`route_ray_errors_to_log` sends them to the ``ray`` logger
(which :func:`flatlab.study.runner` writes to ``logs/flatlab.log``) and leaves other output alone.
The progress line already reports the failed trial.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict

logger = logging.getLogger("ray")


def route_ray_errors_to_log() -> bool:
    """Replace Ray's driver-side printer of cluster errors by one that logs them (``WARNING`` on the
    ``ray`` logger). Idempotent; returns ``False`` (and changes nothing) if this Ray has no
    ``ray._private.worker.print_to_stdstream`` to replace.
    """
    try:
        import ray._private.worker as ray_worker
    except ImportError:  # pragma: no cover (ray is a dependency)
        return False
    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None:
        return False
    if getattr(original, "flatlab_routed", False):
        return True

    def print_to_stdstream(data: Dict[str, Any], ignore_prefix: bool = False, _print: Callable = original) -> None:
        if data.get("pid") != "raylet":
            return _print(data, ignore_prefix=ignore_prefix)
        for line in data.get("lines", []):
            logger.warning("%s", line)

    print_to_stdstream.flatlab_routed = True  # type: ignore[attr-defined]
    print_to_stdstream.__wrapped__ = original  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = print_to_stdstream
    return True
