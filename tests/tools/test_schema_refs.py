"""Schema URLs: their form, the address rules, the cache (issue 37 item 6). A real HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from covenant.config import Config
from covenant.tools.schema_refs import SchemaCache, SchemaFetchError, SchemaUrl, fetch_schema, parse_schema_url

ALLOW_LOOPBACK = Config.model_validate({"tools": {"web_fetch": {"allow": ["127.0.0.1"]}}})


def test_what_is_a_schema_url() -> None:
    pin = "ab" * 32
    assert parse_schema_url("schemas/in.json") is None and parse_schema_url("https:relative") is None
    assert parse_schema_url(f"https://example.org/s.json#sha256={pin}") == SchemaUrl("https://example.org/s.json", pin)
    assert parse_schema_url("HTTP://example.org/s.json") == SchemaUrl("HTTP://example.org/s.json", None)
    for bad in ("https://example.org/s.json#top", f"https://example.org/s#sha256={pin.upper()}", "https://e.org/#sha256=ab"):
        with pytest.raises(SchemaFetchError, match="sha256="):
            parse_schema_url(bad)


@pytest.mark.parametrize(("url", "fragment"), [
    ("http://127.0.0.1:9/s.json", "loopback"),
    ("http://10.0.0.1:9/s.json", "private"),
    ("http://169.254.169.254/latest", "link-local"),
    ("http://[::1]:9/s.json", "loopback"),
    ("http://[::ffff:127.0.0.1]:9/s.json", "loopback"),
])
def test_the_daemon_fetches_no_schema_from_the_hosts_own_or_private_addresses(tmp_path: Path, url: str, fragment: str) -> None:
    with pytest.raises(SchemaFetchError, match=fragment):
        fetch_schema(SchemaUrl(url, None), Config(), SchemaCache(tmp_path))
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_an_unpinned_schema_is_fetched_again_and_its_last_copy_used_only_when_the_server_is_gone(tmp_path: Path) -> None:
    documents = [b'{"type": "object"}', b'{"type": "object", "required": ["a"]}']

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = documents[0] if self.path == "/s.json" else b"x" * (256 * 1024 + 1)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    cache = SchemaCache(tmp_path / "cache")
    ref = SchemaUrl(f"{base}/s.json", None)
    try:
        assert fetch_schema(ref, ALLOW_LOOPBACK, cache) == documents[0]
        documents.pop(0)
        assert fetch_schema(ref, ALLOW_LOOPBACK, cache) == documents[0]  # asked again: the new document
        with pytest.raises(SchemaFetchError, match="larger than"):
            fetch_schema(SchemaUrl(f"{base}/big.json", None), ALLOW_LOOPBACK, cache)
    finally:
        server.shutdown()
        server.server_close()
    assert fetch_schema(ref, ALLOW_LOOPBACK, cache) == documents[0]  # the server is gone: its last copy
    [kept] = (tmp_path / "cache").iterdir()
    assert kept.name == f"url-{hashlib.sha256(ref.url.encode()).hexdigest()}.json" and kept.stat().st_mode & 0o077 == 0
    with pytest.raises(SchemaFetchError, match="cannot connect"):  # pinned: never an unchecked copy
        fetch_schema(SchemaUrl(ref.url, hashlib.sha256(b"{}").hexdigest()), ALLOW_LOOPBACK, cache)
