"""The console entry point's exit keeps every guarantee of a normal exit except module teardown."""

import subprocess
import sys
import textwrap

import pytest

from flatlab.cli.main import exit_status


def _run(body: str) -> subprocess.CompletedProcess:
    """Run ``flatlab probe`` through :func:`flatlab.cli.main.main`, the command's body being ``body``."""
    code = (
        "import sys\n"
        "from flatlab.cli.main import app, main\n"
        "@app.command()\n"
        "def probe():\n" + textwrap.indent(textwrap.dedent(body), "    ") + "\n"
        "sys.argv = ['flatlab', 'probe']\n"
        "main()\n"
    )
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
        sys.exit(3)
    """)
    assert res.returncode == 3, res.stderr
    assert res.stdout == "buffered;thread done;atexit ran"


@pytest.mark.parametrize("code, status, stderr", [(None, 0, ""), (0, 0, ""), ("bad input", 1, "bad input\n")])
def test_exit_codes_follow_sys_exit(code, status, stderr):
    res = _run(f"sys.exit({code!r})")
    assert (res.returncode, res.stderr) == (status, stderr)
    assert exit_status(code) == status


def test_an_uncaught_exception_exits_as_python_does():
    res = _run("raise KeyError('boom')")
    assert res.returncode == 1 and "KeyError: 'boom'" in res.stderr
