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


def did_you_mean(name: object, valid: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the valid names closest to a misspelt ``name``, else ``""``.

    Close = difflib's similarity ratio >= 0.6 (``kapa`` -> ``kappa``, ``admire`` -> ``adamw_ire``), or, for
    names of 3+ characters, contained in a valid name. A ``name`` that is not a string gets no hint.
    """
    if not isinstance(name, str):
        return ""
    valid = [v for v in valid if isinstance(v, str)]
    close = difflib.get_close_matches(name, valid, n=2, cutoff=0.6)
    if not close and len(name) >= 3:
        close = [v for v in valid if name.lower() in v.lower()][:2]
    if not close:  # a valid name inside a longer one: search_space -> space
        close = [v for v in valid if len(v) >= 4 and v.lower() in name.lower()][:2]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
