"""BackgroundReporter: reports go out in order from their own thread while the trial trains on; the trial
waits at its decision epochs and before it ends; a send's error (SystemExit when Tune stops the trial)
reaches the trial at its next call; a checkpoint is written in the sending thread (the state as it was
when queued), its folder removed once sent, and at most one waits to be written."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from flatlab.study.reporter import BackgroundReporter
from flatlab.train.checkpoint import load_state, snapshot_state


class Gate:
    """A blocking send that waits for ``release()`` before each report (as Tune's session does)."""

    def __init__(self, fail_at: int = 0, exc: BaseException = None) -> None:
        self.sent, self.fail_at, self.exc = [], fail_at, exc or SystemExit(0)
        self.go = threading.Semaphore(0)
        self.folders_seen, self.folders, self.states = [], [], []

    def __call__(self, metrics, folder):
        self.go.acquire()
        if metrics["epoch"] == self.fail_at:
            raise self.exc
        if folder is not None:
            self.folders_seen.append(os.path.isdir(folder))
            self.folders.append(folder)
            self.states.append(load_state(folder))
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


def test_a_checkpoint_is_the_state_when_queued_written_in_the_thread_and_removed_once_sent():
    gate = Gate()
    r = BackgroundReporter(gate)
    w = torch.zeros(3)
    r({"epoch": 1}, snapshot_state({"w": w, "epoch": 1}))
    w.add_(1.0)  # training goes on before the report is sent
    r({"epoch": 2}, None)
    gate.release(2)
    r.close()
    assert gate.sent == [1, 2] and gate.folders_seen == [True]
    assert torch.equal(gate.states[0]["w"], torch.zeros(3)) and gate.states[0]["epoch"] == 1
    assert not os.path.exists(gate.folders[0])


def test_a_second_checkpoint_waits_until_the_first_is_sent():
    gate = Gate()
    r = BackgroundReporter(gate)
    r({"epoch": 1}, snapshot_state({"epoch": 1}))
    r({"epoch": 2}, None)  # a report without a checkpoint never waits
    done = threading.Event()
    t = threading.Thread(target=lambda: (r({"epoch": 3}, snapshot_state({"epoch": 3})), done.set()))
    t.start()
    assert not done.wait(0.3)  # checkpoint 1 is still queued: at most one snapshot waits in memory
    gate.release()  # epoch 1 (and its checkpoint) goes out
    assert done.wait(5)
    gate.release(2)
    r.close()
    assert gate.sent == [1, 2, 3] and [s["epoch"] for s in gate.states] == [1, 3]


def test_a_stop_reaches_the_trial_at_its_next_call():
    gate = Gate(fail_at=2)
    r = BackgroundReporter(gate)
    r({"epoch": 1}, snapshot_state({"epoch": 1}))
    r({"epoch": 2}, None)
    r({"epoch": 3}, None)
    gate.release(3)
    with pytest.raises(SystemExit):
        r.flush()
    with pytest.raises(SystemExit):
        r({"epoch": 4}, snapshot_state({"epoch": 4}))
    assert gate.sent == [1] and gate.folders_seen == [True]
    assert not os.path.exists(gate.folders[0])  # the sent folder is removed


def test_a_failed_write_reaches_the_trial(monkeypatch):
    gate = Gate()
    snap = snapshot_state({"epoch": 1})
    monkeypatch.setattr(snap, "write", lambda folder: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    r = BackgroundReporter(gate)
    r({"epoch": 1}, snap)
    with pytest.raises(OSError, match="No space left"):
        r.close()
    assert gate.sent == []  # nothing was sent without its checkpoint


def test_an_error_of_a_send_is_raised_by_close():
    gate = Gate(fail_at=1, exc=RuntimeError("storage unreachable"))
    r = BackgroundReporter(gate)
    r({"epoch": 1}, None)
    gate.release()
    with pytest.raises(RuntimeError, match="storage unreachable"):
        r.close()
