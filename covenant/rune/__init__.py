"""Hosted Rune agents, the replica side: the host process, the loop, sessions (design/rune-host.md).

Imports nothing from :mod:`covenant.daemon`; the daemon talks to a replica only
through the replica API (:mod:`covenant.rune.host`) and the gateway
(:mod:`covenant.rune.gateway_client`), both over :mod:`covenant.rune.wire`.
"""
