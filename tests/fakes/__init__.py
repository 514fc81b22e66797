"""Test doubles for the one outside service covenant talks to: model providers."""

from tests.fakes.model_server import FakeModelServer, Reply, ToolCall, RecordedRequest

__all__ = ["FakeModelServer", "Reply", "ToolCall", "RecordedRequest"]
