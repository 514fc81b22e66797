"""The COVENANT_HOME layout.

Kept free of heavy imports (no pydantic, trio, yaml): ``covenant dispatch``
uses it to find the socket and the user's key, through the functions that
return ``str`` (:func:`home_dir`, :func:`socket_file`,
:func:`user_identity_file`): importing pathlib costs that command ~3 ms of
its ~50. :class:`Home` and the ``*_path`` helpers give ``Path`` objects to
everything else. The typed daemon config lives in :mod:`covenant.config`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple

from covenant.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["Home", "home_dir", "home_command", "socket_file", "user_identity_file", "user_identity_path",
           "read_raw_config"]

CONFIG_NAME = "covenant.toml"
DEFAULT_SOCKET = "run/covenant.sock"
"""The control socket, relative to the home: ``run/`` is 0750, out of agent uids' reach."""


def read_raw_config(path: str | Path) -> dict[str, Any]:
    """Read covenant.toml as a plain dict; a missing file is an empty config."""
    import tomllib  # here, not at the top: `covenant dispatch` with COVENANT_SOCKET set never reads it

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}; fix the syntax there", path=str(path)) from None


def user_identity_file() -> str:
    """``$XDG_CONFIG_HOME/covenant/identity.key`` (default ``~/.config``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "covenant", "identity.key")


def user_identity_path() -> Path:
    """:func:`user_identity_file` as a Path."""
    from pathlib import Path

    return Path(user_identity_file())


def home_dir(explicit: str | os.PathLike[str] | None = None) -> str:
    """``--home`` beats env ``COVENANT_HOME`` beats ``~/.covenant``; relative to the working directory."""
    chosen = os.fspath(explicit) if explicit else (
        os.environ.get("COVENANT_HOME") or os.path.join(os.path.expanduser("~"), ".covenant"))
    return chosen if os.path.isabs(chosen) else os.path.join(os.getcwd(), chosen)


def home_command(root: str | os.PathLike[str], command: str) -> str:
    """``covenant COMMAND`` as a hint must print it to act on the home at ``root`` when pasted anywhere: with
    ``--home`` when the home was given that way, ``COVENANT_HOME=`` when it came from that variable, bare
    for the default home."""
    import shlex  # here, not at the top: only a hint is ever worded with it

    root = os.fspath(root)
    if root != home_dir():
        return f"covenant --home {shlex.quote(root)} {command}"
    if os.environ.get("COVENANT_HOME"):
        return f"COVENANT_HOME={shlex.quote(root)} covenant {command}"
    return f"covenant {command}"


def _setting_file(root: str, raw: dict[str, Any], key: str, default: str) -> str:
    """A path setting of covenant.toml (relative to the home), default ``default``."""
    value = raw.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"{os.path.join(root, CONFIG_NAME)}: {key}: must be a non-empty string in quotes, like "
            f"{key} = \"{default}\", got {value!r}",
            field=key,
        )
    return os.path.join(root, value)


def socket_file(root: str) -> str:
    """The control socket of the home at ``root``: env ``COVENANT_SOCKET`` beats systemd's
    ``$RUNTIME_DIRECTORY/covenant.sock`` beats ``socket`` in covenant.toml beats ``<home>/run/covenant.sock``.

    covenant.toml is 0600 (the daemon's): a user who cannot read it gets the default path.
    """
    env = os.environ.get("COVENANT_SOCKET")
    if env:
        return env
    runtime_dir = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if runtime_dir:
        return os.path.join(runtime_dir, "covenant.sock")
    try:
        raw = read_raw_config(os.path.join(root, CONFIG_NAME))
    except PermissionError:
        raw = {}
    return _setting_file(root, raw, "socket", DEFAULT_SOCKET)


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
        return self.root.joinpath(_setting_file(str(self.root), raw, key, default))

    @property
    def agents_dir(self) -> Path:
        """``agents_dir`` from covenant.toml (relative to the home), default ``agents``."""
        return self._path_setting(self.raw_config(), "agents_dir", "agents")

    @property
    def socket_path(self) -> Path:
        """The control socket: see :func:`socket_file`."""
        return self.root.joinpath(socket_file(str(self.root)))
