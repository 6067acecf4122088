"""A small name -> entry registry shared by optimizers, workloads and studies."""

from __future__ import annotations

from typing import Callable, Dict, Generic, Iterator, List, Optional, TypeVar

from flatlab.errors import UnknownNameError, did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to entries; lookups of unknown names raise :class:`UnknownNameError` listing the valid ones.

    ``loader`` (optional) is called once, on the first lookup, to import the modules that register the
    built-in entries, so that importing :mod:`flatlab` stays cheap.
    """

    def __init__(self, kind: str, loader: Optional[Callable[[], None]] = None) -> None:
        self.kind = kind
        self._entries: Dict[str, T] = {}
        self._loader = loader
        self._loaded = loader is None

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True
            assert self._loader is not None
            self._loader()

    def register(self, name: str, entry: T, *, overwrite: bool = False) -> T:
        """Register ``entry`` under ``name``; raises ``ValueError`` if the name is taken (unless ``overwrite``)."""
        if not overwrite and name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

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
