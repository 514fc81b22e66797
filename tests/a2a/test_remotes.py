"""[a2a] remotes: scheme, host, port and whole path segments, never a string prefix; hostile URLs refused."""

from __future__ import annotations

import pytest

from covenant.a2a.remotes import RemotePrefix, allowed, token_for

REMOTES = ["https://allowed.example/a2a/x", "http://127.0.0.1:8080/a2a"]


@pytest.mark.parametrize("url", [
    "https://allowed.example/a2a/x",
    "https://allowed.example/a2a/x/",
    "https://ALLOWED.example:443/a2a/x/card",
    "http://127.0.0.1:8080/a2a/echo",
])
def test_urls_under_a_prefix_are_allowed(url: str) -> None:
    assert allowed(url, REMOTES)


@pytest.mark.parametrize("url", [
    "https://allowed.example/a2a/xy",              # a string prefix is not a path prefix
    "https://allowed.example/a2a",                 # above the prefix
    "https://allowed.example@evil.test/a2a/x",     # user info hiding the real host
    "https://allowed.example.evil.test/a2a/x",     # a longer host
    "http://allowed.example/a2a/x",                # another scheme
    "https://allowed.example:8443/a2a/x",          # another port
    "https://allowed.example/a2a/x/%2e%2e/admin",  # an encoded dot segment
    "https://allowed.example/a2a/x/..%2fadmin",    # an encoded slash
    "https://allowed.example/a2a/x?next=evil",     # a query
    "https://allowed.example/a2a/x#frag",          # a fragment
    "ftp://allowed.example/a2a/x",
    "http://127.0.0.1:8081/a2a/echo",
    "http://[::1]:8080/a2a/echo",
    "not a url",
])
def test_anything_else_is_refused(url: str) -> None:
    assert not allowed(url, REMOTES)


def test_nothing_is_allowed_by_default() -> None:
    assert not allowed("https://allowed.example/a2a/x", [])


def test_the_longest_token_prefix_wins_and_an_unset_variable_sends_none() -> None:
    tokens = {"http://127.0.0.1:8080": "ALL", "http://127.0.0.1:8080/a2a/echo": "ECHO"}
    environ = {"ALL": "t-all", "ECHO": "t-echo"}
    assert token_for("http://127.0.0.1:8080/a2a/echo/x", tokens, environ) == "t-echo"
    assert token_for("http://127.0.0.1:8080/a2a/other", tokens, environ) == "t-all"
    assert token_for("http://127.0.0.1:8080/a2a/echo", tokens, {}) is None
    assert token_for("http://127.0.0.1:9999/a2a/echo", tokens, environ) is None


@pytest.mark.parametrize("bad", ["https://user@host/x", "gopher://host/x", "https:///x", "https://host/a?b=c"])
def test_a_configured_prefix_must_be_a_plain_url(bad: str) -> None:
    with pytest.raises(ValueError):
        RemotePrefix.parse(bad)
