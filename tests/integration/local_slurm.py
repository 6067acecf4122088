"""A real SLURM on this machine for the tests: munged, slurmctld and one slurmd, started as root from
Debian's packages (slurmctld, slurmd, slurm-client, munge; `make slurm`) under a temporary folder.

One node, ``localhost`` at 127.0.0.1, with this machine's CPUs. Every daemon binds 127.0.0.1 only
(``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny``), on free ports, with its own munge key,
socket, state and spool, so it shares nothing with another SLURM on the machine. No cgroups are
required (``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``), so it runs in a container.
:meth:`LocalSlurm.stop` cancels its jobs, stops the daemons and ends every process that still carries
its configuration, each by its process id.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional

from flatlab_testing import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun")
NODE = "localhost"


def find(tool: str) -> Optional[str]:
    """The path of ``tool`` (PATH, then /usr/sbin and /usr/bin, where Debian puts SLURM's daemons)."""
    found = shutil.which(tool)
    if found:
        return found
    for folder in ("/usr/sbin", "/usr/bin"):
        if os.access(f"{folder}/{tool}", os.X_OK):
            return f"{folder}/{tool}"
    return None


def unavailable() -> Optional[str]:
    """One line saying why a local SLURM cannot run here, or ``None`` when it can."""
    missing = [t for t in DAEMONS + CLIENTS if find(t) is None]
    if missing:
        return (
            f"SLURM is not installed ({', '.join(missing)} not found); `make slurm` installs Debian's slurmctld, "
            f"slurmd, slurm-client and munge as root"
        )
    if os.geteuid() != 0:
        return "a local SLURM runs slurmd and munged as root; this test is not root"
    return None


def node_hardware() -> str:
    """This machine's CPU layout as ``slurmd -C`` reports it (CPUs, boards, sockets, cores, threads)."""
    out = subprocess.run([find("slurmd"), "-C"], capture_output=True, text=True, timeout=60, check=True).stdout
    words = out.split()
    keep = ("CPUs=", "Boards=", "SocketsPerBoard=", "CoresPerSocket=", "ThreadsPerCore=")
    return " ".join(w for w in words if w.startswith(keep))


class LocalSlurm:
    """The cluster: ``env`` (``SLURM_CONF`` for the clients), ``cpus``, :meth:`sbatch`, :meth:`state`,
    :meth:`wait_gone`, :meth:`processes`, :meth:`stop`."""

    def __init__(self) -> None:
        # short: munge's socket path and Ray's, under FLATLAB_RAY_TMPDIR, are limited in length
        self.dir = Path(tempfile.mkdtemp(prefix="fls", dir="/tmp"))
        self.dir.chmod(0o755)  # munged wants its socket's folders searchable by all
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._pids: Dict[str, int] = {}

    # --- set-up -------------------------------------------------------------------------------------------
    def start(self) -> "LocalSlurm":
        d = self.dir
        for sub, mode in (("key", 0o700), ("run", 0o755), ("state", 0o700), ("spool", 0o755), ("log", 0o755)):
            (d / sub).mkdir(mode=mode)
        key = d / "key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = d / "run" / "munge.sock"
        self._run(
            find("munged"),
            f"--key-file={key}",
            f"--socket={self.munge_socket}",
            f"--pid-file={d / 'key' / 'munged.pid'}",
            f"--log-file={d / 'log' / 'munged.log'}",
            f"--seed-file={d / 'key' / 'munged.seed'}",
        )
        self._pids["munged"] = int((d / "key" / "munged.pid").read_text())
        hardware = node_hardware()
        self.cpus = int(hardware.split("CPUs=")[1].split()[0])
        self.conf.write_text("\n".join([*self._common_lines(), *self._site_lines(hardware), ""]))
        self._start_daemons()
        deadline = time.monotonic() + 90
        while set(self._client("sinfo", "-h", "-N", "-o", "%T").stdout.split()) != {"idle"}:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the local SLURM's nodes did not become idle within 90 s\n{self.logs()}")
            time.sleep(1)
        return self

    def _common_lines(self) -> List[str]:
        """slurm.conf's lines that do not depend on where the daemons run."""
        d = self.dir
        return [
            f"ClusterName=fl{uuid.uuid4().hex[:8]}",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "ReturnToService=2",
            "KillWait=30",  # SLURM's default: TERM, then KILL 30 s later
        ]

    def _site_lines(self, hardware: str) -> List[str]:
        """The controller, the node and where its slurmd keeps its files: one node on 127.0.0.1."""
        d = self.dir
        return [
            "SlurmctldHost=localhost",
            "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",  # bind 127.0.0.1, not every interface
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmdPidFile={d / 'run' / 'slurmd.pid'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd.log'}",
            f"NodeName={NODE} NodeAddr=127.0.0.1 {hardware} RealMemory=1000 State=UNKNOWN",
            f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        ]

    def _start_daemons(self) -> None:
        self._run(find("slurmctld"), "-f", str(self.conf), "-i")
        self._pids["slurmctld"] = self._pid_file(self.dir / "run" / "slurmctld.pid")
        self._run(find("slurmd"), "-f", str(self.conf), "-N", NODE)
        self._pids["slurmd"] = self._pid_file(self.dir / "run" / "slurmd.pid")

    def _run(self, *cmd: str) -> None:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=self.env)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()}\n{self.logs()}")

    def _pid_file(self, path: Path) -> int:
        deadline = time.monotonic() + 30
        while not path.exists() or not path.read_text().strip():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} was not written within 30 s\n{self.logs()}")
            time.sleep(0.2)
        return int(path.read_text())

    def _client(self, tool: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([find(tool), *args], capture_output=True, text=True, timeout=60, env=self.env)

    def logs(self, lines: int = 15) -> str:
        out = []
        for log in sorted([*self.dir.glob("log/*.log"), *self.dir.glob("nodes/*/*.log")]):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.relative_to(self.dir)}\n" + "\n".join(tail))
        return "\n".join(out)

    # --- jobs ---------------------------------------------------------------------------------------------
    def sbatch(self, *args: str, env: Dict[str, str]) -> str:
        """Submit; returns the job id. ``env``: the environment sbatch passes on to the job."""
        res = subprocess.run(
            [find("sbatch"), "--parsable", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "SLURM_CONF": str(self.conf)},
        )
        if res.returncode != 0:
            raise RuntimeError(f"sbatch exited {res.returncode}: {res.stderr.strip()}")
        return res.stdout.strip().split(";")[0]

    def state(self, job: str) -> Optional[str]:
        """The job's state while squeue lists it (PENDING, RUNNING, COMPLETING ...), else ``None``."""
        out = self._client("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
        return out or None

    def scancel(self, job: str, *options: str) -> None:
        """``scancel [options] job`` (plain: every process of the job gets TERM, then KILL after KillWait)."""
        res = self._client("scancel", *options, job)
        if res.returncode != 0:
            raise RuntimeError(f"scancel {' '.join(options)} {job} exited {res.returncode}: {res.stderr.strip()}")

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        """``scontrol ARGS`` (requeue, update ...), its exit status and output."""
        return self._client("scontrol", *args)

    def wait_gone(self, job: str, timeout: float) -> None:
        """Until squeue no longer lists the job; raises TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.state(job) is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job} still {self.state(job)} after {timeout:g} s")
            time.sleep(2)

    def processes(self, job: Optional[str] = None) -> List[int]:
        """Ids of the processes started for this cluster's jobs (or for job ``job``): those whose
        environment carries this cluster's SLURM_CONF (sbatch passes it on to every process of a job)."""
        mine = f"SLURM_CONF={self.conf}".encode()
        want = f"SLURM_JOB_ID={job}".encode() if job is not None else None
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mine in environ and (want is None or want in environ):
                found.append(int(entry))
        return found

    # --- tear-down ----------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel every job, stop slurmd, slurmctld and munged, end what is left of the jobs, remove the
        folder. Each step runs even when an earlier one fails."""
        try:
            self._client("scancel", "--full", "-u", "root")
            deadline = time.monotonic() + 60
            while self._client("squeue", "-h").stdout.strip() and time.monotonic() < deadline:
                time.sleep(2)
        except Exception:  # noqa: BLE001 - the daemons may be down already
            pass
        for name in reversed(list(self._pids)):  # the slurmds, slurmctld, then munged
            _end(self._pids.pop(name))
        for pid in self.processes():  # a job's process that outlived its job (there should be none)
            _end(pid, grace=0)
        shutil.rmtree(self.dir, ignore_errors=True)


def _end(pid: int, grace: float = 15.0) -> None:
    """SIGTERM ``pid``, then SIGKILL after ``grace`` seconds if it still runs."""
    try:
        os.kill(pid, signal.SIGTERM if grace else signal.SIGKILL)
    except OSError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
