"""A small name -> entry registry shared by optimizers, measures, workloads and studies.

One registration style: an entry is registered by the module that defines it, at its definition, with
its kind's ``register_<kind>`` (``@register_workload`` on a class; ``@register_measure(name=...)`` on a
compute function; ``register_optimizer(spec)`` on a spec built from another one), and the registry
names those modules (``Registry(kind, modules=...)``), imported on the first lookup so that importing
:mod:`flatlab` stays cheap. A study file's own entries use the same functions (:mod:`flatlab.extensions`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable, Dict, Generic, Iterator, List, Optional, Sequence, Tuple, TypeVar

from flatlab.errors import UnknownNameError, did_you_mean

T = TypeVar("T")

#: The attributes that hold what an entry that is not itself a class or function is made of
#: (``OptimizerSpec.build``, ``Measure.compute``): its definition is theirs.
_BODY = ("build", "compute")


def definition(entry: Any) -> Tuple[str, str, Optional[str]]:
    """Where ``entry`` is defined: ``(module, qualified name, source file or None)`` of the entry (a
    class or function) or of its ``build``/``compute`` function (a spec). A study file executed twice
    defines new objects with the same definition; two different classes have different ones."""
    target = entry
    if not (inspect.isclass(entry) or inspect.isfunction(entry)):
        target = next((getattr(entry, a) for a in _BODY if callable(getattr(entry, a, None))), type(entry))
    while isinstance(target, functools.partial):
        target = target.func
    try:
        path: Optional[str] = inspect.getfile(target)
    except (TypeError, OSError):  # rebuilt from a pickle on a worker: no file
        path = None
    return getattr(target, "__module__", "?"), getattr(target, "__qualname__", repr(target)), path


def describe(entry: Any) -> str:
    """``module.Name (file)`` of ``entry``'s :func:`definition`, for messages."""
    module, qualname, path = definition(entry)
    return f"{module}.{qualname}" + (f" ({path})" if path else "")


def is_builtin(entry: Any) -> bool:
    """Whether ``entry`` is one of flatlab's own (defined in the ``flatlab`` package)."""
    module = definition(entry)[0]
    return module == "flatlab" or module.startswith("flatlab.")


class Registry(Generic[T]):
    """Maps names to entries; lookups of unknown names raise :class:`UnknownNameError` listing the valid ones.

    ``modules`` (optional) names the modules that register the built-in entries; they are imported once,
    on the first lookup.
    """

    def __init__(self, kind: str, modules: Sequence[str] = ()) -> None:
        self.kind = kind
        self.modules = tuple(modules)
        self._entries: Dict[str, T] = {}
        self._loaded = not self.modules

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True
            for module in self.modules:
                importlib.import_module(module)

    def register(self, name: str, entry: T, *, overwrite: bool = False) -> T:
        """Register ``entry`` under ``name``. The same definition registered again (a study file loaded
        twice, an extension installed on a worker) replaces the entry.

        Raises:
            ValueError: ``name`` is taken by a different definition (unless ``overwrite``); the message
                names both.
        """
        old = self._entries.get(name)
        if old is not None and not overwrite and old is not entry:
            same_place = definition(old)[:2] == definition(entry)[:2]
            files = {definition(old)[2], definition(entry)[2]} - {None}
            if not same_place or len(files) > 1:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered by {describe(old)}; {describe(entry)} cannot take "
                    f"the same name: rename one of them"
                )
        self._entries[name] = entry
        return entry

    def register_or_decorate(self, entry: Optional[T], name: str, make: Callable[[Any], T], usage: str) -> Any:
        """The two forms of a ``register_<kind>`` function: given an ``entry``, register it under its
        ``name`` attribute and return it; else return a decorator that registers ``make(<function>)``
        under ``name`` and returns the function unchanged.

        Raises:
            ValueError: neither an entry nor a ``name`` (the message shows ``usage``); a name clash
                (:meth:`register`).
        """
        if entry is not None:
            return self.register(entry.name, entry)
        if not name:
            raise ValueError(f"{usage} as a decorator needs the {self.kind}'s name")

        def decorate(fn: Any) -> Any:
            self.register(name, make(fn))
            return fn

        return decorate

    def extensions(self) -> Dict[str, T]:
        """The registered entries that are not flatlab's own (a study file's, a user module's), by name."""
        return {name: entry for name, entry in self._entries.items() if not is_builtin(entry)}

    def get(self, name: str) -> T:
        """Return the entry for ``name``; raises :class:`UnknownNameError` naming the valid entries."""
        self._ensure_loaded()
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name (a list, a dict) is unknown too
            valid = ", ".join(sorted(self._entries)) or "(none registered)"
            hint = did_you_mean(name, self._entries)
            raise UnknownNameError(f"unknown {self.kind} {name!r}{hint}; valid {self.kind}s: {valid}") from None

    def names(self) -> List[str]:
        """Sorted registered names."""
        self._ensure_loaded()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._ensure_loaded()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._ensure_loaded()
        return len(self._entries)
