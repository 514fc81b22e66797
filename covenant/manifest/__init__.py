"""Agent manifests: ``agent.toml``, Rune packages and the registry scan.

Import the submodules directly (``covenant.manifest.registry``,
``covenant.manifest.agent_toml``, ...): this package stays empty so that
importing one of them never pulls in yaml or the others.
"""

__all__: list[str] = []
