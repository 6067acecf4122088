"""The console entry point's quick exit keeps every guarantee of a normal exit except module teardown."""

import subprocess
import sys
import textwrap

import pytest


def _run(body: str) -> subprocess.CompletedProcess:
    code = "from flatlab.cli.main import exit_without_teardown\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_threads_joined_atexit_run_streams_flushed_status_kept():
    res = _run("""
        import atexit, sys, threading, time
        from concurrent.futures import ThreadPoolExecutor
        atexit.register(lambda: print("atexit ran", end=""))
        def late():
            time.sleep(0.3)
            print("thread done;", end="")
        threading.Thread(target=late).start()            # non-daemon: joined first
        ThreadPoolExecutor(max_workers=1).submit(int)    # never shut down: stopped as at a normal exit
        print("buffered;", end="")                        # no newline: only a flush writes it
        exit_without_teardown(3)
        print("not reached")
    """)
    assert res.returncode == 3, res.stderr
    assert res.stdout == "buffered;thread done;atexit ran"


@pytest.mark.parametrize("code, status, stderr", [(None, 0, ""), (0, 0, ""), ("bad input", 1, "bad input\n")])
def test_exit_codes_follow_sys_exit(code, status, stderr):
    res = _run(f"exit_without_teardown({code!r})")
    assert (res.returncode, res.stderr) == (status, stderr)
