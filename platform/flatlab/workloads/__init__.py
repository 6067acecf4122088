"""Workloads: the contract (:mod:`.base`), the registry, and the built-in workloads."""

from flatlab.workloads.base import Data, Split, TrainDefaults, Workload
from flatlab.workloads.registry import WORKLOADS, build_workload, get_workload, register_workload

__all__ = [
    "Data",
    "Split",
    "TrainDefaults",
    "Workload",
    "WORKLOADS",
    "build_workload",
    "get_workload",
    "register_workload",
]
