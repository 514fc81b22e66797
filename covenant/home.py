"""The COVENANT_HOME layout.

Kept free of heavy imports (no pydantic, trio, yaml): ``covenant dispatch``
uses it to find the socket and the user's key. The typed daemon config lives
in :mod:`covenant.config`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from covenant.errors import ConfigError

__all__ = ["Home", "user_identity_path", "read_raw_config"]

CONFIG_NAME = "covenant.toml"
DEFAULT_SOCKET = "run/covenant.sock"
"""The control socket, relative to the home: ``run/`` is 0750, out of agent uids' reach."""


def read_raw_config(path: Path) -> dict[str, Any]:
    """Read covenant.toml as a plain dict; a missing file is an empty config."""
    import tomllib  # here, not at the top: `covenant dispatch` with COVENANT_SOCKET set never reads it

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}; fix the syntax there", path=str(path)) from None


def user_identity_path() -> Path:
    """``$XDG_CONFIG_HOME/covenant/identity.key`` (default ``~/.config``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "covenant" / "identity.key"


class Home(NamedTuple):
    """Paths inside one covenant home. Does no I/O until asked.

    A NamedTuple rather than a frozen dataclass: ``dataclasses`` imports
    ``inspect`` (~10 ms), and ``covenant dispatch`` imports this module.
    """

    root: Path

    @classmethod
    def resolve(cls, explicit: str | os.PathLike[str] | None = None) -> "Home":
        """``--home`` beats env ``COVENANT_HOME`` beats ``~/.covenant``."""
        chosen = explicit or os.environ.get("COVENANT_HOME") or os.path.join(os.path.expanduser("~"), ".covenant")
        return cls(Path(chosen).absolute())

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
        value = raw.get(key, default)
        if not isinstance(value, str) or not value:
            raise ConfigError(
                f"{self.config_path}: {key}: must be a non-empty string in quotes, like {key} = \"{default}\", "
                f"got {value!r}",
                field=key,
            )
        path = Path(value)
        return path if path.is_absolute() else self.root / path

    @property
    def agents_dir(self) -> Path:
        """``agents_dir`` from covenant.toml (relative to the home), default ``agents``."""
        return self._path_setting(self.raw_config(), "agents_dir", "agents")

    @property
    def socket_path(self) -> Path:
        """env ``COVENANT_SOCKET`` beats systemd's ``$RUNTIME_DIRECTORY/covenant.sock`` beats ``socket``
        in covenant.toml beats ``<home>/run/covenant.sock``.

        covenant.toml is 0600 (the daemon's): a user who cannot read it gets the default path.
        """
        env = os.environ.get("COVENANT_SOCKET")
        if env:
            return Path(env)
        runtime_dir = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
        if runtime_dir:
            return Path(runtime_dir) / "covenant.sock"
        try:
            raw = self.raw_config()
        except PermissionError:
            raw = {}
        return self._path_setting(raw, "socket", DEFAULT_SOCKET)
