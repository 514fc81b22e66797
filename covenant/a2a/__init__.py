"""A2A over the network: covenant's agents served to A2A clients (docs/a2a.md).

``config`` is the ``[a2a]`` table, ``wire`` the protocol's JSON (1.0, with 0.3
read and written where a peer speaks it), ``card`` the agent cards, ``server``
the listener's ASGI app, ``tasks`` which task belongs to which client.
"""
