"""Which remote URLs agents may reach: ``[a2a] remotes``, matched by scheme, host, port and path segments.

A URL is under a prefix when its scheme and host are equal (host compared
case-insensitively, IDNA-encoded), its port is equal once default ports are
made explicit, and the prefix's path segments are the first segments of its
path. ``https://a.example/a2a/x`` therefore allows ``…/a2a/x`` and
``…/a2a/x/card`` but never ``…/a2a/xy`` (no string prefixes) nor
``https://a.example.evil.test/``. URLs with user info, a query or a fragment, or
with ``.``/``..`` segments (percent-encoded too) are refused outright.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = ["RemotePrefix", "allowed", "token_for"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class RemotePrefix:
    scheme: str
    host: str
    port: int
    segments: tuple[str, ...]

    @classmethod
    def parse(cls, url: str) -> RemotePrefix:
        """ValueError (saying what is wrong) for anything but a plain http(s) URL."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"{url!r} is not a URL: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise ValueError(f"{url!r}: only http and https URLs are allowed")
        if not parts.hostname:
            raise ValueError(f"{url!r} has no host")
        if "@" in parts.netloc:
            raise ValueError(f"{url!r}: a URL with user information is refused")
        if parts.query or parts.fragment or url.endswith(("?", "#")):
            raise ValueError(f"{url!r}: a query or fragment is refused")
        try:
            host = parts.hostname.encode("idna").decode("ascii").lower()
        except UnicodeError:
            raise ValueError(f"{url!r}: the host is not a valid name") from None
        segments = tuple(s for s in parts.path.split("/") if s)
        if any(unquote(s) in (".", "..") or "/" in unquote(s) or "\\" in unquote(s) for s in segments):
            raise ValueError(f"{url!r}: dot segments and encoded slashes are refused")
        return cls(scheme, host, port if port is not None else _DEFAULT_PORTS[scheme], segments)

    def covers(self, other: RemotePrefix) -> bool:
        return ((self.scheme, self.host, self.port) == (other.scheme, other.host, other.port)
                and other.segments[: len(self.segments)] == self.segments)


def _parse(url: str) -> RemotePrefix | None:
    try:
        return RemotePrefix.parse(url)
    except ValueError:
        return None


def allowed(url: str, remotes: Iterable[str]) -> bool:
    """True when ``url`` is a plain http(s) URL under one of ``remotes``."""
    target = _parse(url)
    return target is not None and any((p := _parse(r)) is not None and p.covers(target) for r in remotes)


def token_for(url: str, remote_tokens: Mapping[str, str], environ: Mapping[str, str]) -> str | None:
    """The bearer for ``url``: the longest matching prefix's variable from the daemon's env, when set."""
    target = _parse(url)
    if target is None:
        return None
    best: tuple[int, str] | None = None
    for prefix, env in remote_tokens.items():
        parsed = _parse(prefix)
        if parsed is not None and parsed.covers(target) and (best is None or len(parsed.segments) > best[0]):
            best = (len(parsed.segments), env)
    return (environ.get(best[1]) or None) if best is not None else None
