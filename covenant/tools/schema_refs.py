"""Tool schemas named by URL (``input_schema_ref: https://…``): fetched by the daemon, cached, pinned if asked.

The Rune spec lets ``input_schema_ref``/``output_schema_ref`` be a path or a URL. A URL is fetched by
the daemon itself (never by an agent), when it serves the agent's toolset, under the rules of
``rune@web-fetch`` for an agent whose network is ``outbound-https-only``:

- ``https`` only; ``http`` only for a host ``[tools.web_fetch] allow`` lists;
- the host is resolved once and every address must pass :class:`~covenant.netpolicy.AddressPolicy`:
  loopback, link-local, private and special ranges are refused unless ``[tools.web_fetch] allow``
  lists them (the daemon's own host is no more reachable through a schema than through web-fetch);
  the connection goes to the checked address, so a second DNS answer is never used;
- no redirects, no proxy, credentials or certificates from the daemon's environment, at most
  :data:`SCHEMA_MAX_BYTES`, within ``[tools.web_fetch] timeout_ms``.

A fragment ``#sha256=<64 hex>`` pins the document: its bytes must have that SHA-256 (the fragment is
never sent). Copies are kept under ``<home>/state/schema-cache/`` (0700, the daemon's): a pinned one
as ``<sha256>.json`` and used without asking the server again; an unpinned one as
``url-<sha256 of the URL>.json``, fetched again each time the toolset is resolved (daemon start,
reload), the kept copy used only when the server cannot be reached. Blocking I/O: call from a thread.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from covenant.config import Config
from covenant.durable import replace_file
from covenant.netpolicy import AddressPolicy

__all__ = ["SchemaUrl", "SchemaFetchError", "parse_schema_url", "SchemaCache", "fetch_schema", "SCHEMA_MAX_BYTES"]

SCHEMA_MAX_BYTES = 256 * 1024
_PIN = re.compile(r"^sha256=([0-9a-f]{64})$")
_USER_AGENT = "covenant-schema-fetch/1"


class SchemaFetchError(Exception):
    """The schema cannot be had; the message says why (for ``tools list`` and the log)."""


@dataclass(frozen=True)
class SchemaUrl:
    url: str
    """Without the fragment: what is fetched."""
    pin: str | None
    """The lowercase hex SHA-256 its bytes must have, or None."""


def parse_schema_url(ref: str) -> SchemaUrl | None:
    """``ref`` as a schema URL, or None when it is not one (then it is a path in the package).

    Raises :class:`SchemaFetchError` for a URL with a fragment that is not a ``sha256=`` pin.
    """
    scheme = ref.split(":", 1)[0].lower()
    if scheme not in ("http", "https") or "://" not in ref:
        return None
    url, _, fragment = ref.partition("#")
    pin = None
    if fragment:
        match = _PIN.match(fragment)
        if match is None:
            raise SchemaFetchError(f"{ref!r}: a schema URL's fragment must be #sha256=<64 lowercase hex> (a pin)")
        pin = match.group(1)
    return SchemaUrl(url, pin)


class SchemaCache:
    """``<home>/state/schema-cache``: the copies of fetched schemas."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, ref: SchemaUrl) -> Path:
        name = ref.pin if ref.pin else "url-" + hashlib.sha256(ref.url.encode()).hexdigest()
        return self.folder / f"{name}.json"

    def get(self, ref: SchemaUrl) -> bytes | None:
        """The kept copy (a pinned one only when its bytes still match the pin), or None."""
        try:
            with open(self._path(ref), "rb") as f:
                data = f.read(SCHEMA_MAX_BYTES + 1)
        except OSError:
            return None
        if len(data) > SCHEMA_MAX_BYTES or (ref.pin and hashlib.sha256(data).hexdigest() != ref.pin):
            return None
        return data

    def put(self, ref: SchemaUrl, data: bytes) -> None:
        """Keep ``data`` for ``ref``: written whole to a new file, then renamed over the old copy."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        replace_file(self._path(ref), data)


def _addresses(url: "httpx.URL", policy: AddressPolicy) -> list[str]:  # noqa: F821 - httpx imported lazily
    if url.scheme not in ("http", "https") or not url.host:
        raise SchemaFetchError(f"{url}: only http(s) URLs with a host can be fetched")
    host = url.host
    listed = policy.host_allowed(host)
    try:
        ipaddress.ip_address(host)
        addresses = [host]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, url.port or (443 if url.scheme == "https" else 80), type=socket.SOCK_STREAM)
        except OSError as exc:
            raise SchemaFetchError(f"{url}: cannot resolve {host!r}: {exc.strerror or exc}") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise SchemaFetchError(f"{url}: {host!r} resolved to no address")
    if not listed:
        for address in addresses:
            why = policy.refusal(address)
            if why is not None:
                raise SchemaFetchError(f"{url}: {host} resolves to {why}; the daemon fetches a schema there only when "
                                       "covenant.toml lists it in [tools.web_fetch] allow")
    if url.scheme == "http" and not (listed or all(policy.listed(a) for a in addresses)):
        raise SchemaFetchError(f"{url}: schemas are fetched over https (http only from a host [tools.web_fetch] allow lists)")
    return addresses


def _download(ref: SchemaUrl, config: Config) -> bytes:
    import httpx  # loaded by the first schema URL, not with the daemon

    settings = config.tools.web_fetch
    url = httpx.URL(ref.url)
    addresses = _addresses(url, AddressPolicy.from_config(settings.allow))
    headers = {"Host": url.netloc.decode("ascii"), "User-Agent": _USER_AGENT, "Accept": "application/schema+json, "
               "application/json, */*", "Accept-Encoding": "identity"}
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    failures: list[str] = []
    with httpx.Client(trust_env=False, follow_redirects=False, timeout=settings.timeout_ms / 1000) as client:
        for address in addresses:  # the checked addresses, never the name again (no second DNS answer)
            request = client.build_request("GET", url.copy_with(host=address), headers=headers, extensions=extensions)
            try:
                response = client.send(request, stream=True)
            except httpx.ConnectError as exc:
                failures.append(f"{address}: {exc}")
                continue
            except httpx.HTTPError as exc:
                raise SchemaFetchError(f"{ref.url}: {type(exc).__name__}: {exc}") from None
            try:
                return _body(ref, response)
            except httpx.HTTPError as exc:
                raise SchemaFetchError(f"{ref.url}: the body broke off: {exc}") from None
            finally:
                response.close()
    raise SchemaFetchError(f"{ref.url}: cannot connect ({'; '.join(failures)})")


def _body(ref: SchemaUrl, response: "httpx.Response") -> bytes:  # noqa: F821 - httpx imported lazily
    """The answer's bytes, read only while within the cap; a non-200 or coded answer is refused."""
    if response.status_code != 200:
        raise SchemaFetchError(f"{ref.url} answered HTTP {response.status_code} (redirects are not followed)")
    if response.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
        raise SchemaFetchError(f"{ref.url} answered a coded body (content-encoding); covenant asks for identity")
    body = bytearray()
    for chunk in response.iter_raw():
        body += chunk
        if len(body) > SCHEMA_MAX_BYTES:
            raise SchemaFetchError(f"{ref.url} is larger than {SCHEMA_MAX_BYTES} bytes")
    return bytes(body)


def fetch_schema(ref: SchemaUrl, config: Config, cache: SchemaCache) -> bytes:
    """The schema's bytes: a pinned copy from the cache, else fetched (and kept); see the module's rules."""
    if ref.pin is not None:
        kept = cache.get(ref)
        if kept is not None:
            return kept
    try:
        data = _download(ref, config)
    except SchemaFetchError:
        kept = cache.get(ref) if ref.pin is None else None
        if kept is not None:
            return kept  # an unpinned schema the server cannot give now: the last copy it gave
        raise
    if ref.pin is not None and hashlib.sha256(data).hexdigest() != ref.pin:
        raise SchemaFetchError(f"{ref.url}: its SHA-256 is {hashlib.sha256(data).hexdigest()}, not the pinned {ref.pin}; "
                               "the document changed (update the pin if the change is wanted)")
    cache.put(ref, data)
    return data
