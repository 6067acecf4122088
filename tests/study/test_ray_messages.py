"""Ray's "A worker died" broadcast reaches the study's log file, not the terminal."""

import inspect
import os
import signal
import time

import pytest

from flatlab.study.ray_compat import route_ray_errors_to_log


def test_the_printer_ray_uses_is_the_one_replaced():
    import ray._private.worker as w

    assert "print_to_stdstream(" in inspect.getsource(
        w.listen_error_messages
    )  # a Ray upgrade that changes it fails here
    before = w.print_to_stdstream
    try:
        assert route_ray_errors_to_log() and route_ray_errors_to_log()  # idempotent
        assert w.print_to_stdstream.__wrapped__ is getattr(before, "__wrapped__", before)
    finally:
        w.print_to_stdstream = before


@pytest.mark.integration
@pytest.mark.slow
def test_killed_worker_message_goes_to_the_log_file_only(tmp_path, capfd, monkeypatch):
    import ray
    import ray._private.worker as w

    from flatlab.study.driver_log import setup_file_logging
    from flatlab.study.ray_start import init_ray
    from flatlab.study.runner import RunOptions

    before = w.print_to_stdstream
    monkeypatch.setenv("RAY_ADDRESS", "local")  # a new local instance, never a Ray head found running on this machine

    @ray.remote(max_retries=0)
    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    try:
        init_ray(RunOptions(), f"sqlite:///{tmp_path / 'm.db'}")
        setup_file_logging(tmp_path)
        with pytest.raises(ray.exceptions.WorkerCrashedError):
            ray.get(die.remote())
        log = tmp_path / "logs" / "flatlab.log"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "A worker died" not in log.read_text():
            time.sleep(0.5)
    finally:
        ray.shutdown()
        w.print_to_stdstream = before
    assert "A worker died or was killed" in log.read_text()
    out, err = capfd.readouterr()
    assert "A worker died" not in out and "A worker died" not in err, out + err
