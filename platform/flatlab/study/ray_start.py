"""Ray for a launch: join the cluster it names, or start a local instance of its own, and check that one
trial fits on a local one."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Dict, Optional

import ray

from flatlab.errors import ConfigError
from flatlab.study.options import RunOptions
from flatlab.study.placement import local_shortfall
from flatlab.study.prepare import scales_that_fit
from flatlab.study.ray_compat import init_local_ray, is_loopback_address, loopback_node_ip, route_ray_errors_to_log
from flatlab.study.spec import Study


def init_ray(opts: RunOptions, tracking_uri: str) -> None:
    """Start Ray for the launch (nothing when this process already did): join ``--address`` (or
    ``RAY_ADDRESS``), else start a local instance; the trials' environment points MLflow at
    ``tracking_uri``."""
    route_ray_errors_to_log()  # Ray's "A worker died ..." broadcasts: to logs/flatlab.log, not the terminal

    if ray.is_initialized():
        return
    env = {"MLFLOW_TRACKING_URI": tracking_uri, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    kwargs: Dict[str, Any] = dict(
        log_to_driver=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": env},
    )
    joined = joined_address(opts)
    if joined:
        # a cluster on this machine's loopback only is joined as 127.0.0.1 (Ray would rewrite the address)
        with loopback_node_ip() if is_loopback_address(joined) else contextlib.nullcontext():
            ray.init(**({"address": opts.address} if opts.address else {}), **kwargs)
    else:
        # always a new local instance, never a `ray start` head that happens to run on this machine; every
        # socket of it on 127.0.0.1
        init_local_ray(num_cpus=opts.num_cpus, include_dashboard=False, **kwargs)


def joined_address(opts: RunOptions) -> Optional[str]:
    """The cluster a launch joins: ``--address``, else ``RAY_ADDRESS`` (inside a Ray Job, the cluster that
    runs it); ``None`` when it starts a local instance of its own (neither, or ``local``)."""
    address = opts.address or os.environ.get("RAY_ADDRESS")
    return None if address in (None, "", "local") else address


def check_local_resources(study: Study, opts: RunOptions) -> None:
    """On a Ray instance this launch started itself, one trial must fit: nothing will add resources
    later, as a cluster's autoscaler may (there the progress line says what pending trials wait for).

    Raises:
        ConfigError: a trial needs more of a resource (a GPU on a CPU machine) than the local Ray has;
            the message names the resource and the ways out.
    """
    if joined_address(opts):
        return
    cluster = ray.cluster_resources()
    if local_shortfall(study.name, study.resources, cluster) is not None:  # name the file's scales that would fit
        scales = scales_that_fit(opts.source, opts.overrides.get("scale"), cluster) if opts.source else []
        raise ConfigError(local_shortfall(study.name, study.resources, cluster, scales))
