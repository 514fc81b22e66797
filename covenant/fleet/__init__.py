"""The fleet: covenant on many hosts, with NATS JetStream as the engine (docs/fleet.md).

``covenant fleet`` is a process of its own (asyncio and nats-py; the daemon is
trio) that reaches its daemon only through the control socket and holds no
key. Modules, one job each:

- :mod:`~covenant.fleet.config` the ``[fleet]`` section of covenant.toml;
- :mod:`~covenant.fleet.subjects` the fixed names: streams, subjects, consumers, headers;
- :mod:`~covenant.fleet.answers` the answer documents and their exit codes (pure);
- :mod:`~covenant.fleet.connect` a NATS connection from ``[fleet]`` (credentials, TLS);
- :mod:`~covenant.fleet.streams` the streams, consumers and bucket, made idempotently;
- :mod:`~covenant.fleet.daemon_link` the asyncio client of the control socket;
- :mod:`~covenant.fleet.host_entry` this host's entry in ``COVENANT_HOSTS``;
- :mod:`~covenant.fleet.capacity` how many intents each agent may pull now;
- :mod:`~covenant.fleet.delivery` one delivered intent, from pull to acknowledgement;
- :mod:`~covenant.fleet.heads` audit heads: published, and checked by ``audit verify --fleet``;
- :mod:`~covenant.fleet.process` the per-host process that ties them together;
- :mod:`~covenant.fleet.client` what the CLI does: dispatch, status, show.

Only :mod:`~covenant.fleet.config` is imported by the rest of covenant (covenant.toml
is read as a whole); nothing here imports nats until a fleet command runs.
"""
