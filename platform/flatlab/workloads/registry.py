"""Workload registry: name -> :class:`~flatlab.workloads.base.Workload` subclass."""

from __future__ import annotations

import importlib
from typing import Any, Type

from flatlab.registry import Registry
from flatlab.workloads.base import Workload


def _load_builtins() -> None:
    for mod in (
        "flatlab.workloads.digits",
        "flatlab.workloads.clip",
        "flatlab.workloads.cifar",
        "flatlab.workloads.dtd",
        "flatlab.workloads.fashion_mnist",
        "flatlab.workloads.glue",
        "flatlab.workloads.lm",
        "flatlab.workloads.imagenet",
        "flatlab.workloads.toys",
    ):
        importlib.import_module(mod)


WORKLOADS: Registry[Type[Workload]] = Registry("workload", loader=_load_builtins)


def register_workload(cls: Type[Workload]) -> Type[Workload]:
    """Class decorator: register ``cls`` under ``cls.name``."""
    WORKLOADS.register(cls.name, cls)
    return cls


def get_workload(name: str) -> Type[Workload]:
    """The workload class registered as ``name``; unknown names raise ``UnknownNameError`` with the list."""
    return WORKLOADS.get(name)


def build_workload(name: str, **params: Any) -> Workload:
    """Instantiate workload ``name`` with validated ``params`` (``ConfigError`` on a bad value)."""
    return get_workload(name)(**params)
