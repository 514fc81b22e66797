"""Triggers: schedules that fire intents on their own (docs/triggers.md).

A firing is an intent the daemon signs on its issuer's behalf
(:mod:`covenant.triggers.onbehalf`) and sends through the same
``Daemon.dispatch`` path as any other: verify, route, that issuer's grants, audit.
"""

__all__: list[str] = []
