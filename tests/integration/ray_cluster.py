"""A multi-node Ray cluster on this machine for the tests, in a process of its own (Ray's own harness,
``ray.cluster_utils.Cluster``; every node on 127.0.0.1, so nothing leaves loopback).

Run as ``python ray_cluster.py HEAD_CPUS WORKERS WORKER_CPUS WORKER_GPUS DASHBOARD_PORT``: starts the head
(with its dashboard and Job API on 127.0.0.1:DASHBOARD_PORT) and the worker nodes (each declaring
``WORKER_GPUS`` fake GPUs), then prints one JSON line
``{"address": ..., "dashboard": URL, "head": node_id, "workers": [node_id, ...]}`` and reads commands from
stdin, one per line, each answered by one JSON line: ``remove NODE_ID`` (kill that node's processes at once, as a lost
machine) and ``add`` (one more worker node). End of input shuts the cluster down.

The cluster's address is not left in ``/tmp/ray/ray_current_cluster`` (where Ray's harness writes it), so a
``ray.init()`` without an address elsewhere on the machine never joins it; it is written in the head's own
Ray folder instead, where a submitted job's supervisor looks for it. The GCS checks the nodes' health every
second and takes a node for dead after 3 missed checks, so a removed node's trials fail within seconds (Ray's
defaults take about half a minute).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile

import ray._common.utils
import ray._private.utils
from ray.cluster_utils import Cluster

from flatlab_testing import free_port

FAST_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 1000,
    "health_check_failure_threshold": 3,
}


def main(head_cpus: int, workers: int, worker_cpus: int, worker_gpus: int, dashboard_port: int) -> None:
    # the head's dashboard agent (which runs submitted jobs) on a free port: Ray's default, 52365, may be
    # another Ray instance's on this machine, and then no job could start
    # The head, too, with a Ray folder of its own, where its address is written: a submitted job's
    # supervisor gives the job's driver the address it finds there ("auto"); without it, Ray takes any
    # Ray instance that runs on this machine (another test's, another user's)
    head_folder = tempfile.mkdtemp(prefix="rh", dir="/tmp")
    nodes, folders = {}, [head_folder]
    cluster = Cluster(
        initialize_head=True,
        head_node_args=dict(
            num_cpus=head_cpus,
            node_ip_address="127.0.0.1",
            include_dashboard=True,
            dashboard_host="127.0.0.1",
            dashboard_port=dashboard_port,
            dashboard_agent_listen_port=free_port(),
            temp_dir=head_folder,
            _system_config=FAST_HEALTH_CHECKS,
        ),
    )
    # The harness writes its address where any `ray.init()` without an address on this machine looks
    # (/tmp/ray/ray_current_cluster): other processes must not join this cluster by accident.
    ray._common.utils.reset_ray_address()
    ray._private.utils.write_ray_address(cluster.address, head_folder)

    def add() -> str:
        # a Ray folder of its own, as on a machine of its own: nodes that share one would each take the
        # others' runtime environments (a submitted job's working directory) for their own and delete them
        folder = tempfile.mkdtemp(prefix="rn", dir="/tmp")  # short: Ray's socket paths live under it
        folders.append(folder)
        node = cluster.add_node(
            num_cpus=worker_cpus, num_gpus=worker_gpus, node_ip_address="127.0.0.1", temp_dir=folder
        )
        nodes[node.node_id] = node
        return node.node_id

    try:
        ids = [add() for _ in range(workers)]
        cluster.wait_for_nodes()
        print(
            json.dumps(
                {
                    "address": cluster.address,
                    "dashboard": f"http://127.0.0.1:{dashboard_port}",
                    "head": cluster.head_node.node_id,
                    "workers": ids,
                }
            ),
            flush=True,
        )
        for line in sys.stdin:
            cmd, _, arg = line.strip().partition(" ")
            if cmd == "remove":
                cluster.remove_node(nodes.pop(arg), allow_graceful=False)
                print(json.dumps({"removed": arg}), flush=True)
            elif cmd == "add":
                node_id = add()
                cluster.wait_for_nodes()
                print(json.dumps({"added": node_id}), flush=True)
            else:
                print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
    finally:
        cluster.shutdown()
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(*map(int, sys.argv[1:6]))
