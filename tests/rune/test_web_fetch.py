"""rune@web-fetch through a real daemon, replica and scripted model, against a local HTTP server."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.daemon.conftest import DaemonProcess
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import KEY_VALUE, add_rune_agent, configure, outcome_of
from tests.rune.test_file_tools import tool_events, tool_results

BIG = 200_000
BOMB = gzip.compress(bytes(50_000_000), compresslevel=9)


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.server.seen.append((self.path, dict(self.headers)))
        if self.path == "/redirect-meta":
            self._send(302, b"", {"Location": "http://169.254.169.254/latest/meta-data/"})
        elif self.path == "/redirect-ok":
            self._send(302, b"", {"Location": "/"})
        elif self.path == "/bomb":  # 50 MB of zeros in about 50 KB, sent compressed whatever was asked
            self._send(200, BOMB, {"Content-Type": "text/plain", "Content-Encoding": "gzip"})
        elif self.path == "/big":
            self._send(200, b"x" * BIG, {"Content-Type": "text/plain"})
        else:
            self._send(200, b"hello from the test server", {"Content-Type": "text/plain; charset=utf-8"})

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    seen: list[tuple[str, dict[str, str]]]


@pytest.fixture
def web() -> Iterator[_Server]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def start(d: DaemonProcess, fake: FakeModelServer, extra: str = "") -> None:
    configure(d, ("fake", fake), extra=extra)
    add_rune_agent(d, toolset=("rune@web-fetch",), max_steps=6)
    d.start()
    d.cli("grant", "tester@test", "tool.web_fetch", check=True)


def dispatch(d: DaemonProcess) -> dict:
    result = d.cli("dispatch", "fetch", "--agent", "chat@local", "--json")
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome["outcome"] == "ok", outcome
    return outcome


def test_loopback_metadata_and_other_schemes_are_refused_by_default(
    daemon: DaemonProcess, fake_model: FakeModelServer, web: _Server
) -> None:
    start(daemon, fake_model)
    port = web.server_address[1]
    urls = [
        f"http://127.0.0.1:{port}/",
        f"https://127.0.0.1:{port}/",
        f"http://localhost:{port}/",
        f"http://[::ffff:127.0.0.1]:{port}/",
        "http://169.254.169.254/latest/meta-data/",
        "https://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "file:///etc/passwd",
    ]
    fake_model.script(Reply.tools(*[ToolCall("web-fetch", {"url": u}) for u in urls]), Reply(text="nothing"))
    outcome = dispatch(daemon)
    results = tool_results(fake_model, 1)
    assert [r.get("error", {}).get("code") for r in results] == ["address_refused"] * len(urls), results
    assert not web.seen, "a refused fetch reached the server"
    events = tool_events(daemon, outcome["intent_id"])
    assert [(e["outcome"], e["error_code"]) for e in events] == [("denied", "address_refused")] * len(urls)
    assert daemon.stop() == 0


def test_allowed_by_config_with_caps_and_redirects_checked_again(
    daemon: DaemonProcess, fake_model: FakeModelServer, web: _Server
) -> None:
    start(daemon, fake_model, extra='[tools.web_fetch]\nallow = ["127.0.0.1/32"]\nmax_bytes = 1000\n')
    base = f"http://127.0.0.1:{web.server_address[1]}"
    fake_model.script(
        Reply.tools(*[ToolCall("web-fetch", {"url": base + p})
                      for p in ("/", "/redirect-ok", "/big", "/redirect-meta", "/bomb")]),
        Reply(text="fetched"),
    )
    dispatch(daemon)
    plain, redirected, big, meta, bomb = tool_results(fake_model, 1)
    assert bomb["encoding"] == "base64" and bomb["bytes"] == 1000 and bomb["truncated"] is True  # never inflated
    assert plain["status"] == 200 and plain["content"] == "hello from the test server" and plain["truncated"] is False
    assert redirected["content"] == plain["content"] and redirected["redirects"] == [base + "/redirect-ok"]
    assert big["bytes"] == 1000 and big["truncated"] is True
    assert meta["error"]["code"] == "address_refused" and "169.254.169.254" in meta["error"]["message"]
    assert {path for path, _ in web.seen} == {"/", "/redirect-ok", "/big", "/redirect-meta", "/bomb"}
    for _path, headers in web.seen:
        lowered = {k.lower(): v for k, v in headers.items()}
        assert "authorization" not in lowered and "cookie" not in lowered
        assert KEY_VALUE not in repr(headers)
        assert lowered["host"] == base.removeprefix("http://") and lowered["accept-encoding"] == "identity"
    assert daemon.stop() == 0


def _self_signed(tmp_path) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_https_keeps_the_name_for_sni_and_the_certificate_while_connecting_to_the_checked_address(
    daemon: DaemonProcess, fake_model: FakeModelServer, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import socket
    import ssl

    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    names: list[str | None] = []
    context.sni_callback = lambda conn, name, ctx: names.append(name)  # type: ignore[assignment,func-returns-value]
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    peers: list[str] = []

    def serve() -> None:
        conn, peer = listener.accept()
        peers.append(peer[0])
        try:
            context.wrap_socket(conn, server_side=True).close()
        except (ssl.SSLError, OSError):
            pass  # the client refuses our self-signed certificate: what we expect
        finally:
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    start(daemon, fake_model, extra='[tools.web_fetch]\nallow = ["localhost"]\n')
    fake_model.script(Reply.tools(ToolCall("web-fetch", {"url": f"https://localhost:{port}/"})), Reply(text="tls"))
    dispatch(daemon)
    (result,) = tool_results(fake_model, 1)
    thread.join(timeout=30)
    listener.close()
    assert result["error"]["code"] == "fetch_failed" and "certificate" in result["error"]["message"].lower(), result
    assert names == ["localhost"] and peers == ["127.0.0.1"]  # SNI kept the name; the socket went to the checked address
    assert daemon.stop() == 0
