"""Deferred imports at a module's boundary: the one way flatlab keeps a heavy or optional library out of
``import flatlab`` until a function needs it.

A module names what it defers at its top, beside its other imports::

    from flatlab.lazy import lazy

    pd = lazy("pandas")
    stats = lazy("scipy.stats")
    open_clip = lazy("open_clip", extra="clip")

and its functions use ``pd.DataFrame`` as they would after ``import pandas as pd``. The library is
imported on the first attribute read (``importlib.import_module``), once per process; every read is
forwarded to the module, so a name the library rebinds later (``ray``'s global node, MLflow's active run)
is read as it is now, never as a copy taken at import; a write (a library switch, a test's monkeypatch)
reaches the module too. Nothing is placed in ``sys.modules`` before that first read, so another module's
plain ``import pandas`` is unaffected. :func:`load` imports one now, for a caller that words a missing
library's error itself.

What it is not for: flatlab's own light modules (import them plainly), code ``torch.compile`` traces (the
proxy is not the module object; the optimizers and the trainer import torch plainly), and a name used in
a class statement or a default argument at import time (that read happens at import: import plainly).

``tests/test_import_graph.py`` reads these ``lazy("...")`` lines as imports, so the layer and cycle
checks see every deferred dependency; it also checks that no function imports a library itself.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, List, Optional

__all__ = ["lazy", "load", "LazyModule"]


class LazyModule(types.ModuleType):
    """A stand-in for the module ``name``, imported on the first attribute read.

    Every read goes through ``importlib.import_module`` (after the first, a lookup in ``sys.modules``), so
    it behaves exactly as an ``import`` written at the point of use: a module a test places in
    ``sys.modules`` is the one read.

    Raises:
        ImportError: at a read, when ``name`` cannot be imported; the message names the module and, when
            ``extra`` was given, the ``pip install 'flatlab[extra]'`` that provides it.
    """

    def __init__(self, name: str, extra: Optional[str] = None) -> None:
        super().__init__(name)  # ModuleType.__init__ fills __dict__ directly, not through __setattr__
        self.__dict__["_lazy_extra"] = extra

    def _lazy_load(self) -> types.ModuleType:
        try:
            return importlib.import_module(self.__name__)
        except ImportError as err:
            extra = self.__dict__["_lazy_extra"]
            hint = f": pip install 'flatlab[{extra}]'" if extra else ""
            raise ImportError(f"{self.__name__} is needed here and cannot be imported{hint} ({err})") from err

    def __getattr__(self, attr: str) -> Any:
        # every name but the proxy's own (ModuleType's __name__, __doc__, ...) is forwarded
        if attr in ("__path__", "__file__", "__wrapped__") and self.__name__ not in sys.modules:
            raise AttributeError(attr)  # introspection (doctest, inspect) must not trigger the import
        return getattr(self._lazy_load(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        # a write (a library switch, a test's monkeypatch) goes to the module, never to the stand-in
        setattr(self._lazy_load(), attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(self._lazy_load(), attr)

    def __dir__(self) -> List[str]:
        return dir(self._lazy_load())

    def __repr__(self) -> str:
        state = "imported" if self.__name__ in sys.modules else "not yet imported"
        return f"<lazy module {self.__name__!r} ({state})>"

    def __reduce__(self):
        return (lazy, (self.__name__, self.__dict__["_lazy_extra"]))


def lazy(name: str, extra: Optional[str] = None) -> types.ModuleType:
    """The module ``name`` (dotted, absolute), imported when first used; see the module docstring.

    Args:
        name: e.g. ``"pandas"``, ``"mlflow.tracking"``, ``"ray.tune.result"``.
        extra: the pyproject extra that installs it, named in the error when it is missing.

    Raises:
        ValueError: ``name`` is empty or relative.
    """
    if not name or name.startswith("."):
        raise ValueError(f"lazy: name must be an absolute module name such as 'pandas', got {name!r}")
    return LazyModule(name, extra)


def load(module: types.ModuleType) -> types.ModuleType:
    """``module`` imported now: the real module behind a :func:`lazy` stand-in (``module`` itself
    otherwise), for a caller that turns a missing library into its own error before it goes on.

    Raises:
        ImportError: the import's own error, as ``import`` raises it (no ``extra`` hint added).
    """
    return importlib.import_module(module.__name__) if isinstance(module, LazyModule) else module
