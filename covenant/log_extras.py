"""Which attributes of a ``logging.LogRecord`` a caller added with ``extra=``.

Shared by the daemon's log formatter (:mod:`covenant.logs`) and the audit writer process
(:mod:`covenant.audit.channel`), which must not import covenant.logs: that pulls in the config
models, and with them pydantic.
"""

from __future__ import annotations

import logging

__all__ = ["is_extra"]

# Attributes every LogRecord has; anything else on a record came from `extra`.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def is_extra(key: str) -> bool:
    """Is ``key`` a caller's extra, not a LogRecord attribute nor private (``_``)? ``logging`` refuses
    an ``extra`` that would overwrite an attribute."""
    return key not in _RECORD_ATTRS and not key.startswith("_")
