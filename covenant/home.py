"""The COVENANT_HOME layout.

Kept free of heavy imports (no pydantic, trio, yaml). The functions that return
``str`` (:func:`home_dir`, :func:`socket_file`, :func:`user_identity_file`, ...) live
in :mod:`covenant.home_paths`, which ``covenant dispatch`` imports instead of this
module, and are re-exported here. :class:`Home` and the ``*_path`` helpers give
``Path`` objects to everything else. The typed daemon config lives in
:mod:`covenant.config`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple

from covenant.home_paths import (
    CONFIG_NAME,
    home_command,
    home_dir,
    read_raw_config,
    setting_file,
    socket_file,
    user_identity_file,
)

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["Home", "home_dir", "home_command", "socket_file", "user_identity_file", "user_identity_path",
           "read_raw_config"]


def user_identity_path() -> Path:
    """:func:`user_identity_file` as a Path."""
    from pathlib import Path

    return Path(user_identity_file())


class Home(NamedTuple):
    """Paths inside one covenant home. Does no I/O until asked.

    A NamedTuple rather than a frozen dataclass: ``dataclasses`` imports
    ``inspect`` (~10 ms), and ``covenant dispatch`` imports this module.
    """

    root: Path

    @classmethod
    def resolve(cls, explicit: str | os.PathLike[str] | None = None) -> "Home":
        """The home :func:`home_dir` chooses."""
        from pathlib import Path

        return cls(Path(home_dir(explicit)))

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def identity_dir(self) -> Path:
        return self.root / "identity"

    @property
    def daemon_key_path(self) -> Path:
        return self.identity_dir / "daemon.key"

    @property
    def known_identities_path(self) -> Path:
        """Other users' public keys added with ``covenant identity add``."""
        return self.root / "identities.toml"

    @property
    def grants_path(self) -> Path:
        return self.root / "grants.toml"

    @property
    def audit_dir(self) -> Path:
        return self.root / "audit"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def dispatches_dir(self) -> Path:
        return self.state_dir / "dispatches"

    @property
    def workspaces_dir(self) -> Path:
        """``state/workspaces``: one dir per agent, owned by the agent's uid."""
        return self.state_dir / "workspaces"

    @property
    def run_dir(self) -> Path:
        """``run/``: the control socket's dir (0750: the daemon and its group only)."""
        return self.root / "run"

    def raw_config(self) -> dict[str, Any]:
        return read_raw_config(self.config_path)

    def _path_setting(self, raw: dict[str, Any], key: str, default: str) -> Path:
        return self.root.joinpath(setting_file(str(self.root), raw, key, default))

    @property
    def agents_dir(self) -> Path:
        """``agents_dir`` from covenant.toml (relative to the home), default ``agents``."""
        return self._path_setting(self.raw_config(), "agents_dir", "agents")

    @property
    def socket_path(self) -> Path:
        """The control socket: see :func:`socket_file`."""
        return self.root.joinpath(socket_file(str(self.root)))
