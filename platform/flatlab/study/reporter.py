"""A trial's reports sent from a thread of their own, so that training does not wait on the driver.

Tune's function trainable hands each ``tune.report`` to the actor's main thread and blocks the caller
until Tune asks for the next result: with a checkpoint, that is three round trips to the driver (the
batch before it, the checkpoint's report, Tune's ``save`` call; see
:func:`flatlab.study.trainable.make_trainable`). :class:`BackgroundReporter` makes ``report`` a queue
put: one thread sends the queued reports in order while the trial trains on, and the trial waits only
where it must, at the epochs where its scheduler decides (so a trial ASHA stops never trains past its
rung) and before it returns or raises (so every report goes out first, in order).

When Tune stops the trial (ASHA, an interrupted launch), its ``report`` raises ``SystemExit(0)`` in the
sending thread; the trial receives it at its next report or wait and ends the way it would have with
a blocking report.
"""

from __future__ import annotations

import queue
import shutil
import threading
from typing import Any, Callable, Container, Dict, Optional

#: ``report(metrics, checkpoint_dir)``, blocking, as :data:`flatlab.study.trainable.Report`.
Send = Callable[[Dict[str, Any], Optional[str]], None]


class BackgroundReporter:
    """Queue a trial's reports; a daemon thread sends them with ``send`` in the order they came.

    Args:
        send: the blocking report (``tune.report`` with the folder as a ``tune.Checkpoint``).
        wait_at: epochs (``metrics["epoch"]``) whose report must have been taken by Tune before the
            trial goes on (its scheduler's decision epochs).

    A checkpoint folder passed to the reporter is its own: it is removed once sent (Tune has copied it
    into the trial's storage by then). The first exception of ``send`` (``SystemExit`` when Tune stops
    the trial) is raised in the trial's thread at its next call.
    """

    def __init__(self, send: Send, wait_at: Container[int] = ()) -> None:
        self._send, self._wait_at = send, wait_at
        self._queue: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._sent = threading.Condition()
        self._queued = self._done = 0
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="flatlab-report", daemon=True)
        self._thread.start()

    def __call__(self, metrics: Dict[str, Any], checkpoint_dir: Optional[str]) -> None:
        """Queue one report (``checkpoint_dir``: a folder the reporter now owns, or ``None``); wait
        until it is sent when its epoch is one of ``wait_at``.

        Raises:
            BaseException: the first error of an earlier send (``SystemExit`` when Tune stopped the trial).
        """
        self._raise_error()
        self._queued += 1
        self._queue.put((metrics, checkpoint_dir))
        if metrics.get("epoch") in self._wait_at:
            self.flush()

    def flush(self) -> None:
        """Wait until every queued report is sent.

        Raises:
            BaseException: the first error of a send.
        """
        with self._sent:
            while self._done < self._queued and self._error is None:
                self._sent.wait()
        self._raise_error()

    def close(self) -> None:
        """Send what is queued, then stop the thread (:meth:`flush`'s errors are raised)."""
        try:
            self.flush()
        finally:
            self._queue.put(None)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _discard(self) -> None:
        """After an error: drop what is still queued, removing its checkpoint folders."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and item[1] is not None:
                shutil.rmtree(item[1], ignore_errors=True)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            metrics, checkpoint_dir = item
            try:
                self._send(metrics, checkpoint_dir)
            except BaseException as exc:  # noqa: BLE001 - SystemExit included: the trial must see it
                error: Optional[BaseException] = exc
            else:
                error = None
            if checkpoint_dir is not None:  # sent (Tune copied it into the trial's storage) or failed
                shutil.rmtree(checkpoint_dir, ignore_errors=True)
            if error is not None:
                self._discard()
            with self._sent:
                self._error = error
                self._done += error is None
                self._sent.notify_all()
            if error is not None:
                return
