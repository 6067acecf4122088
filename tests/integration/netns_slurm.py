"""A SLURM of two nodes on this machine, each in a network namespace of its own, for the tests: the
:class:`local_slurm.LocalSlurm` daemons (munged, slurmctld, a slurmd per node), run as root.

The test's own network, made at start and removed at stop: a bridge in this (the root) namespace with
``SUBNET.254`` (the controller, ``flctl``), and per node a namespace joined to the bridge by a veth pair,
its ``eth0`` at ``SUBNET.i`` (``fln1``, ``fln2``), where SUBNET is a ``10.213.N`` no interface or route of
the machine uses. No other interface or address is touched. Each slurmd runs in its node's namespace with
the node's name as its hostname (a UTS namespace) and, in a mount namespace of its own, a hosts file that
names the controller and the nodes over ``/etc/hosts`` and a folder of its own over ``DIR/node`` (its spool,
log and Ray's temporary files, as a node's local disk). Everything a job starts inherits them. slurmctld
runs in this namespace as ``flctl`` with the same hosts file and binds the bridge's address only; each slurmd
listens inside its namespace.
"""

from __future__ import annotations

import random
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import List, Optional, Tuple

from local_slurm import LocalSlurm, find, unavailable

NODES = ("fln1", "fln2")
CONTROLLER = "flctl"
NETWORK_TOOLS = ("ip", "nsenter", "unshare", "mount", "hostname")


def netns_unavailable() -> Optional[str]:
    """One line saying why namespaced SLURM nodes cannot run here, or ``None`` when they can (root, SLURM,
    ``ip``, ``unshare``, and ``ip netns add`` that works)."""
    why = unavailable()
    if why is not None:
        return why
    missing = [t for t in NETWORK_TOOLS if find(t) is None]
    if missing:
        return f"{', '.join(missing)} not found: the nodes' network namespaces need iproute2 and util-linux"
    probe = f"flprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here ({made.stderr.strip()}): no network namespaces for the nodes"
    _ip("netns", "delete", probe, check=False)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([find("ip"), *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} exited {res.returncode}: {res.stderr.strip()}")
    return res


def _free_subnet() -> str:
    """A ``10.213.N`` that no address or route of this machine's namespace mentions."""
    used = _ip("-o", "addr").stdout + _ip("route").stdout + _ip("-o", "-4", "route", "show", "table", "all").stdout
    taken = {int(n) for n in re.findall(r"10\.213\.(\d+)\.", used)}
    free = [n for n in range(1, 255) if n not in taken]
    if not free:
        raise RuntimeError("every 10.213.N/24 is in use on this machine")
    return f"10.213.{random.choice(free)}"


class NetnsSlurm(LocalSlurm):
    """:class:`LocalSlurm` with the nodes ``fln1`` and ``fln2`` on their own addresses: ``addr`` (node ->
    address), ``netns`` (node -> namespace), ``controller_addr``, :meth:`in_node`, :meth:`leftovers`."""

    def __init__(self) -> None:
        super().__init__()
        tag = f"fl{uuid.uuid4().hex[:6]}"
        self.subnet = _free_subnet()
        self.controller_addr = f"{self.subnet}.254"
        self.addr = {node: f"{self.subnet}.{i}" for i, node in enumerate(NODES, 1)}
        self.netns = {node: f"{tag}{node}" for node in NODES}
        self.bridge = f"{tag}br"
        self.veth = {node: f"{tag}v{i}" for i, node in enumerate(NODES, 1)}
        self._made: List[Tuple[str, str]] = []  # ("link" | "netns", name), in the order made

    def start(self) -> "NetnsSlurm":
        self._network()
        hosts = self.dir / "hosts"
        hosts.write_text(
            "127.0.0.1 localhost\n"
            + f"{self.controller_addr} {CONTROLLER}\n"
            + "".join(f"{self.addr[n]} {n}\n" for n in NODES)
        )
        hosts.chmod(0o644)
        super().start()
        return self

    def _network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        _ip("addr", "add", f"{self.controller_addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for node in NODES:
            ns, veth = self.netns[node], self.veth[node]
            _ip("netns", "add", ns)
            self._made.append(("netns", ns))
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._made.append(("link", veth))
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addr[node]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def _site_lines(self, hardware: str) -> List[str]:
        node_dir = self.dir / "node"  # each slurmd sees its own folder here
        return [
            f"SlurmctldHost={CONTROLLER}({self.controller_addr})",
            "CommunicationParameters=NoCtldInAddrAny",  # slurmctld on the bridge's address only
            f"SlurmdSpoolDir={node_dir / 'spool'}",
            f"SlurmdPidFile={node_dir / 'slurmd.pid'}",
            f"SlurmdLogFile={node_dir / 'slurmd.log'}",
            *(f"NodeName={n} NodeAddr={self.addr[n]} {hardware} RealMemory=1000 State=UNKNOWN" for n in NODES),
            f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
        ]

    def _start_daemons(self) -> None:
        self._run(*self._as_host(CONTROLLER), find("slurmctld"), "-f", str(self.conf), "-i")
        self._pids["slurmctld"] = self._pid_file(self.dir / "run" / "slurmctld.pid")
        (self.dir / "node").mkdir()
        for node in NODES:
            own = self.dir / "nodes" / node
            (own / "spool").mkdir(parents=True)
            self._run(*self.in_node(node), find("slurmd"), "-f", str(self.conf), "-N", node)
            self._pids[f"slurmd {node}"] = self._pid_file(own / "slurmd.pid")

    def in_node(self, node: str) -> List[str]:
        """The command prefix that runs a command as on ``node``: in its network namespace (``nsenter``, which
        keeps this machine's /sys and its cgroups, unlike ``ip netns exec``), with its hostname, the hosts file
        and its own ``DIR/node``."""
        net = [find("nsenter"), f"--net=/run/netns/{self.netns[node]}"]
        return net + self._as_host(node, ("--bind", str(self.dir / "nodes" / node), str(self.dir / "node")))

    def _as_host(self, name: str, mount: Tuple[str, ...] = ()) -> List[str]:
        """The command prefix that runs a command with hostname ``name`` (a UTS namespace) and, in a private
        mount namespace, the test's hosts file over /etc/hosts and ``mount``'s arguments mounted."""
        script = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && '
        script += f'mount {" ".join(mount)} && exec "$@"' if mount else 'exec "$@"'
        return [find("unshare"), "--uts", "--mount", "sh", "-c", script, "sh", name, str(self.dir / "hosts")]

    def stop(self) -> None:
        """:meth:`LocalSlurm.stop`, then remove the veth pairs, namespaces and bridge; raises RuntimeError if any
        is still there 15 s later."""
        try:
            super().stop()
        finally:
            for kind, name in reversed(self._made):
                if kind == "link":
                    _ip("link", "delete", name, check=False)
                else:
                    _ip("netns", "delete", name, check=False)
            deadline = time.monotonic() + 15
            while self.leftovers() and time.monotonic() < deadline:
                time.sleep(0.5)
            left = self.leftovers()
            if left:
                raise RuntimeError(f"the test's network was not removed: {left}")

    def leftovers(self) -> List[str]:
        """The test's links and namespaces that still exist."""
        links = set(re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link").stdout, flags=re.M))
        spaces = {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}
        return [name for kind, name in self._made if name in (links if kind == "link" else spaces)]


def namespace_of(pid: int) -> Optional[str]:
    """The network namespace of process ``pid`` (``net:[inode]``), or None once it is gone."""
    try:
        return str(Path(f"/proc/{pid}/ns/net").readlink())
    except OSError:
        return None
