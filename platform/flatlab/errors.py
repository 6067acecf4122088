"""flatlab's error types.

Every user-facing error states the rule, the offending value and, where it helps, the allowed values.
They subclass ``ValueError``/``KeyError`` so callers that catch the builtin types keep working.
"""

from __future__ import annotations

import difflib
from typing import Iterable


class FlatlabError(Exception):
    """Base class of every error flatlab raises on purpose."""


class ConfigError(FlatlabError, ValueError):
    """A study, search space or hyperparameter value breaks a rule (raised before anything starts)."""


class UnknownNameError(FlatlabError, KeyError):
    """A registry lookup with a name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message; keep it readable
        return str(self.args[0]) if self.args else ""


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest valid names to a misspelt ``name``, else ``""``.

    Close = difflib's similarity ratio >= 0.6, or ``name`` is a prefix of / contained in a valid name
    (``admire`` -> ``adamw_ire``).
    """
    valid = list(valid)
    close = difflib.get_close_matches(name, valid, n=2, cutoff=0.6)
    if not close:
        close = [v for v in valid if name and name.lower() in v.lower()][:2]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
