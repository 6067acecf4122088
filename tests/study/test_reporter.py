"""BackgroundReporter: reports go out in order from their own thread while the trial trains on; the trial
waits at its decision epochs and before it ends; a send's error (SystemExit when Tune stops the trial)
reaches the trial at its next call; checkpoint folders are removed once sent, or dropped after an error."""

from __future__ import annotations

import os
import threading

import pytest

from flatlab.study.reporter import BackgroundReporter


class Gate:
    """A blocking send that waits for ``release()`` before each report (as Tune's session does)."""

    def __init__(self, fail_at: int = 0, exc: BaseException = None) -> None:
        self.sent, self.fail_at, self.exc = [], fail_at, exc or SystemExit(0)
        self.go = threading.Semaphore(0)
        self.folders_seen = []

    def __call__(self, metrics, folder):
        self.go.acquire()
        if metrics["epoch"] == self.fail_at:
            raise self.exc
        if folder is not None:
            self.folders_seen.append(os.path.isdir(folder))
        self.sent.append(metrics["epoch"])

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.go.release()


def test_reports_do_not_wait_for_the_driver_and_go_out_in_order():
    gate = Gate()
    r = BackgroundReporter(gate)
    for e in range(1, 6):
        r({"epoch": e}, None)  # returns at once although nothing was sent yet
    assert gate.sent == []
    gate.release(5)
    r.close()
    assert gate.sent == [1, 2, 3, 4, 5]


def test_a_decision_epoch_waits_until_it_is_sent():
    gate = Gate()
    r = BackgroundReporter(gate, wait_at={2})
    r({"epoch": 1}, None)
    done = threading.Event()
    t = threading.Thread(target=lambda: (r({"epoch": 2}, None), done.set()))
    t.start()
    assert not done.wait(0.3)  # epoch 2 waits for the decision (its send)
    gate.release(2)
    assert done.wait(5) and gate.sent == [1, 2]
    r.close()


def test_a_stop_reaches_the_trial_at_its_next_call(tmp_path):
    gate = Gate(fail_at=2)
    r = BackgroundReporter(gate)
    folders = []
    for e in (1, 2, 3):
        folder = tmp_path / f"ck{e}"
        folder.mkdir()
        folders.append(folder)
        r({"epoch": e}, str(folder))
    gate.release(3)
    with pytest.raises(SystemExit):
        r.flush()
    with pytest.raises(SystemExit):
        r({"epoch": 4}, None)
    assert gate.sent == [1] and gate.folders_seen == [True]
    assert not any(f.exists() for f in folders)  # sent, failed and dropped folders are all removed


def test_an_error_of_a_send_is_raised_by_close():
    gate = Gate(fail_at=1, exc=RuntimeError("storage unreachable"))
    r = BackgroundReporter(gate)
    r({"epoch": 1}, None)
    gate.release()
    with pytest.raises(RuntimeError, match="storage unreachable"):
        r.close()
