"""flatlab's error types.

Every user-facing error states the rule, the offending value and, where it helps, the allowed values.
They subclass ``ValueError``/``KeyError`` so callers that catch the builtin types keep working.
"""

from __future__ import annotations


class FlatlabError(Exception):
    """Base class of every error flatlab raises on purpose."""


class ConfigError(FlatlabError, ValueError):
    """A study, search space or hyperparameter value breaks a rule (raised before anything starts)."""


class UnknownNameError(FlatlabError, KeyError):
    """A registry lookup with a name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message; keep it readable
        return str(self.args[0]) if self.args else ""
