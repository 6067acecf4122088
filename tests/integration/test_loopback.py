"""A local `flatlab run` opens no socket to the network: every listening socket of its Ray instance is on
loopback (the launch's own process tree: driver, GCS, raylet, object manager, agents, trial workers)."""

import ipaddress
import subprocess
import time

import pytest
import ray  # noqa: F401  (its bundled psutil goes on sys.path)

# isort: split
import psutil  # after ray, which puts the psutil it bundles on sys.path

from flatlab_testing import BIN, env, write_study

pytestmark = [pytest.mark.integration]


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1, and IPv4-mapped loopback (``::ffff:127.0.0.1``: a v6 socket bound to it accepts
    only loopback traffic); ``0.0.0.0``/``::`` (every interface) are not."""
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def test_is_loopback_by_hand():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not any(is_loopback(a) for a in ("0.0.0.0", "::", "192.0.2.2", "::ffff:192.0.2.2"))


def listening(root_pid: int) -> dict:
    """``{(ip, port): process description}`` of the sockets listening in ``root_pid``'s process tree."""
    found = {}
    try:
        procs = [psutil.Process(root_pid), *psutil.Process(root_pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for p in procs:
        try:
            name = " ".join(p.cmdline()[:2])[-80:]
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    found[(c.laddr.ip, c.laddr.port)] = name
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.slow
def test_a_local_launch_listens_on_loopback_only(tmp_path):
    study = write_study(
        tmp_path / "lo.py",
        """
STUDY = Study(
    name="lo",
    workload="digits",
    workload_params={"width": 16},
    arms=(Arm("sgd", space={"lr": sp.loguniform(0.01, 0.3)}),),
    num_trials=2,
    max_epochs=6,
    scheduler="fifo",
)
""",
    )
    proc = subprocess.Popen(
        [str(BIN / "flatlab"), "run", str(study), "--root", str(tmp_path / "root"), "--num-cpus", "2"],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: dict = {}
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        seen.update(listening(proc.pid))
        time.sleep(0.3)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out
    kinds = " ".join(seen.values())
    # the instance was seen at work: its GCS, raylet, agents and a trial's worker
    for part in ("gcs_server", "raylet", "DashboardAgent", "RuntimeEnvAgent", "run_trial"):
        assert part in kinds, (part, seen)
    exposed = {k: v for k, v in seen.items() if not is_loopback(k[0])}
    assert not exposed, f"listening beyond loopback: {exposed}"
