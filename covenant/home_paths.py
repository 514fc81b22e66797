"""The COVENANT_HOME's paths as ``str``: the part of :mod:`covenant.home` the ``covenant dispatch`` fast path uses.

Apart from :mod:`covenant.home` (which re-exports all of it) because of its :class:`~covenant.home.Home`:
a ``typing.NamedTuple`` whose annotation is a string (``from __future__ import annotations``) calls
the builtin ``compile`` to check it, and the first ``compile`` in a process builds the interpreter's
AST types, some 7.6 million instructions (a quarter of ``python -c pass``; issue 38). This module
defines no NamedTuple and imports no pathlib.
"""

from __future__ import annotations

import os

from covenant.errors import ConfigError

TYPE_CHECKING = False  # typing's constant, without importing typing on the dispatch path (issue 38)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

__all__ = ["CONFIG_NAME", "DEFAULT_SOCKET", "home_dir", "home_command", "read_raw_config", "setting_file",
           "socket_file", "user_identity_file"]

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


def setting_file(root: str, raw: dict[str, Any], key: str, default: str) -> str:
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
    return setting_file(root, raw, "socket", DEFAULT_SOCKET)
