"""Recognising trio cancellation when it arrives inside an exception group.

trio's nurseries wrap what escapes them in a ``BaseExceptionGroup`` (strict exception groups), even
a lone ``Cancelled``: ``except trio.Cancelled`` does not see a cancellation that came out of a
nursery. Code that must tell "this was cancelled" from "this failed" asks :func:`only_cancelled`.
"""

from __future__ import annotations

import trio

__all__ = ["only_cancelled"]


def only_cancelled(exc: BaseException) -> bool:
    """True when ``exc`` is ``trio.Cancelled``, or a group (nested or not) holding nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)
