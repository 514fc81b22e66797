"""The gateway's own HTTP/1.1 client: the pool, dead kept-alive connections, limits, TLS."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from covenant.models.http import ProviderHttp, TransportError
from tests.fakes import FakeModelServer, Reply
from tests.models.helpers import Recorder, gateway, model_call, provider

USER = {"role": "user", "content": "hello"}
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
JSON = {"content-type": "application/json"}


def one_shot_keepalive_server(answers: list[bytes]) -> tuple[int, threading.Thread, list[int]]:
    """Connection 1 answers once (keep-alive) and then dies when asked again; later connections answer."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    requests_per_connection: list[int] = []

    def serve() -> None:
        with listener:
            for index, answer in enumerate(answers):
                connection, _ = listener.accept()
                with connection:
                    served = 0
                    while True:
                        data = b""
                        while b"\r\n\r\n" not in data:
                            chunk = connection.recv(65536)
                            if not chunk:
                                break
                            data += chunk
                        if not data:
                            break
                        if index == 0 and served == 1:
                            break  # the server dropped the kept-alive connection: no answer
                        connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                           b"content-length: %d\r\n\r\n%s" % (len(answer), answer))
                        served += 1
                        if index > 0:
                            break
                    requests_per_connection.append(served)

    thread = threading.Thread(target=serve)
    thread.start()
    return listener.getsockname()[1], thread, requests_per_connection


async def test_a_kept_alive_connection_the_server_dropped_is_replaced_once() -> None:
    port, thread, served = one_shot_keepalive_server([b'{"n": 1}', b'{"n": 2}'])
    http = ProviderHttp(f"http://127.0.0.1:{port}/v1", max_connections=4)
    try:
        for expected in (b'{"n": 1}', b'{"n": 2}'):
            async with http.post("/v1/chat/completions", JSON, BODY) as response:
                assert response.status == 200
                assert await response.aread() == expected
    finally:
        await http.aclose()
        await trio.to_thread.run_sync(thread.join, 30)
    assert served == [1, 1], "the second request went to a new connection after the first one died"


async def test_a_new_connection_that_fails_is_not_retried() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    http = ProviderHttp(f"http://127.0.0.1:{port}", max_connections=1)
    with pytest.raises(TransportError, match=f"cannot connect to 127.0.0.1:{port}"):
        async with http.post("/x", JSON, BODY):
            pass
    await http.aclose()


async def test_max_connections_bounds_the_connections_and_the_rest_wait(fake_model: FakeModelServer) -> None:
    fake_model.script(*[Reply(text=str(i), delay_s=0.2) for i in range(6)])
    gw = gateway({"a": provider(fake_model, max_connections=2)}, Recorder())
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(gw.chat, model_call("a"), [USER], [])
    finally:
        await gw.aclose()
    assert len(fake_model.requests) == 6 and fake_model.connections_seen == 2


async def test_an_answer_past_the_size_cap_is_refused(fake_model: FakeModelServer) -> None:
    fake_model.script(Reply(text="x" * 5000))
    http = ProviderHttp(fake_model.base_url, max_connections=1, max_response_bytes=1000)
    try:
        with pytest.raises(TransportError, match="larger than 1000 bytes"):
            async with http.post("/v1/chat/completions", JSON, BODY) as response:
                await response.aread()
    finally:
        await http.aclose()


def _certificates(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA, and a server certificate for 127.0.0.1 signed by it: (CA file, server context)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "covenant test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return ca_file, context


@pytest.fixture
def tls_fake(tmp_path: Path) -> Iterator[tuple[FakeModelServer, Path]]:
    ca_file, context = _certificates(tmp_path)
    with FakeModelServer(tls=context) as fake:
        yield fake, ca_file


async def test_https_with_a_trusted_ca_and_an_untrusted_one_falls_back(
    tls_fake: tuple[FakeModelServer, Path], fake_model: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, ca_file = tls_fake
    fake.script(Reply(text="over tls"))
    fake_model.script(Reply(text="plain fallback"))
    recorder = Recorder()
    # Untrusted: the system store does not know the test CA; the attempt fails and the next provider answers.
    gw = gateway({"tls": provider(fake), "plain": provider(fake_model)}, recorder)
    try:
        result = await gw.chat(model_call("tls", "plain"), [USER], [])
    finally:
        await gw.aclose()
    assert result.provider == "plain"
    assert fake.requests == [], "nothing was sent to a server whose certificate did not verify"
    assert [e["http_status"] for e in recorder.calls()] == [None, 200]
    # Trusted through OpenSSL's own variable, read when the gateway makes its TLS context.
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    gw = gateway({"tls": provider(fake)}, Recorder())
    try:
        assert (await gw.chat(model_call("tls"), [USER], [])).text == "over tls"
    finally:
        await gw.aclose()
    assert fake.requests[0].path == "/v1/chat/completions"
