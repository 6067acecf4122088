"""A trial's reports sent from a thread of their own, so that training does not wait on the driver.

Tune's function trainable hands each ``tune.report`` to the actor's main thread and blocks the caller
until Tune asks for the next result: with a checkpoint, that is three round trips to the driver (the
batch before it, the checkpoint's report, Tune's ``save`` call; see
:func:`flatlab.study.trainable.make_trainable`). :class:`BackgroundReporter` makes ``report`` a queue
put: one thread sends the queued reports in order while the trial trains on, and the trial waits only
where it must, at the epochs where its scheduler decides (so a trial ASHA stops never trains past its
rung) and before it returns or raises (so every report goes out first, in order).

A checkpoint reaches the reporter as a :class:`~flatlab.train.checkpoint.StateSnapshot` (the state
copied in memory when the epoch ended); the sending thread writes its files, sends them and removes them,
so the trial does not wait on the disk either. At most one snapshot waits to be written: a trial that
checkpoints again before the previous one is sent waits for it, so its memory holds at most the live state
and two copies (one being written, one queued).

When Tune stops the trial (ASHA, an interrupted launch), its ``report`` raises ``SystemExit(0)`` in the
sending thread; the trial receives it at its next report or wait and ends the way it would have with
a blocking report.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Container, Dict, Optional

from flatlab.train.checkpoint import StateSnapshot, written

#: ``send(metrics, checkpoint_dir)``, blocking: ``tune.report`` with the folder (``None``: no checkpoint)
#: as a ``tune.Checkpoint``; the folder is removed once ``send`` returns.
Send = Callable[[Dict[str, Any], Optional[str]], None]


class BackgroundReporter:
    """Queue a trial's reports; a daemon thread sends them with ``send`` in the order they came.

    Args:
        send: the blocking report (``tune.report`` with the folder as a ``tune.Checkpoint``).
        wait_at: epochs (``metrics["epoch"]``) whose report must have been taken by Tune before the
            trial goes on (its scheduler's decision epochs).

    A checkpoint is written to a temporary folder in the sending thread, sent, and the folder removed
    (Tune has copied it into the trial's storage by then). The first exception of ``send`` or of a write
    (``SystemExit`` when Tune stops the trial) is raised in the trial's thread at its next call.
    """

    def __init__(self, send: Send, wait_at: Container[int] = ()) -> None:
        self._send, self._wait_at = send, wait_at
        self._queue: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._sent = threading.Condition()
        self._queued = self._done = 0
        self._last_checkpoint = 0  # the position (1-based) of the latest queued report with a checkpoint
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="flatlab-report", daemon=True)
        self._thread.start()

    def __call__(self, metrics: Dict[str, Any], checkpoint: Optional[StateSnapshot]) -> None:
        """Queue one report (``checkpoint``: the state to send with it, or ``None``); wait first until the
        previous checkpoint is sent, if one is still queued, and afterwards until this report is sent
        when its epoch is one of ``wait_at``.

        Raises:
            BaseException: the first error of an earlier send (``SystemExit`` when Tune stopped the trial).
        """
        self._raise_error()
        if checkpoint is not None:
            self._wait_for(self._last_checkpoint)  # at most one snapshot waits in memory
            self._last_checkpoint = self._queued + 1
        self._queued += 1
        self._queue.put((metrics, checkpoint))
        if metrics.get("epoch") in self._wait_at:
            self.flush()

    def flush(self) -> None:
        """Wait until every queued report is sent.

        Raises:
            BaseException: the first error of a send.
        """
        self._wait_for(self._queued)

    def _wait_for(self, n: int) -> None:
        """Wait until the first ``n`` queued reports are sent (raises the first error of a send)."""
        with self._sent:
            while self._done < n and self._error is None:
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
        """After an error: drop what is still queued (snapshots are in memory: nothing on disk)."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            metrics, checkpoint = item
            try:
                with written(checkpoint) as folder:  # removed once sent (Tune copied it) or failed
                    self._send(metrics, folder)
            except BaseException as exc:  # noqa: BLE001 - SystemExit included: the trial must see it
                error: Optional[BaseException] = exc
            else:
                error = None
            if error is not None:
                self._discard()
            with self._sent:
                self._error = error
                self._done += error is None
                self._sent.notify_all()
            if error is not None:
                return
