"""Remote A2A agents for the calling-out tests, run as their own process on loopback.

``--mode sdk``: an echo agent served by the official A2A SDK on uvicorn (A2A 1.0, card at
``/a2a/echo/.well-known/agent-card.json``, JSON-RPC at ``/a2a/echo``). A message ``hang`` never
ends. With ``--token`` every request but the card needs ``Authorization: Bearer TOKEN``, and the
answer says whether one came (``auth=yes``).

``--mode legacy``: raftio's layout, A2A 0.3 without a card: JSON-RPC ``message/send`` posted to
``/a2a/echo`` itself answers a completed 0.3 task. ``--big`` answers 1 MiB of text.

    python -m tests.fakes.a2a_remote --mode sdk --port 8123 [--token T]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PATH = "/a2a/echo"


def _sdk_app(port: int, token: str | None, big: bool) -> Any:
    from a2a.helpers.proto_helpers import new_task_from_user_message
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part
    from starlette.applications import Starlette

    class Echo(AgentExecutor):
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            text = context.get_user_input()
            task = context.current_task or new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
            updater = TaskUpdater(event_queue, task.id, task.context_id)
            if text == "hang":
                await asyncio.sleep(3600)
            answer = "x" * (1 << 20) if big else f"echo: {text} (auth={'yes' if token else 'no'})"
            await updater.add_artifact([Part(text=answer)], name="echo")
            await updater.complete()

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            return None

    url = f"http://127.0.0.1:{port}{PATH}"
    card = AgentCard(
        name="remote-echo", description="echoes what it is sent", version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="echo", tags=["echo"])],
    )
    handler = DefaultRequestHandler(agent_executor=Echo(), task_store=InMemoryTaskStore(), agent_card=card)
    routes = [*create_agent_card_routes(card, card_url=f"{PATH}/.well-known/agent-card.json"),
              *create_jsonrpc_routes(handler, rpc_url=PATH)]
    app = Starlette(routes=routes)

    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        if token and scope["type"] == "http" and not scope["path"].endswith("agent-card.json"):
            given = dict(scope.get("headers", [])).get(b"authorization", b"")
            if given != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no"})
                return
        await app(scope, receive, send)

    return guarded


def _legacy_server(port: int, big: bool) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return None

        def do_GET(self) -> None:  # noqa: N802 - no card: raftio's layout
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            text = request["params"]["message"]["parts"][0]["text"]
            answer = "y" * (1 << 20) if big else f"legacy echo: {text}"
            body = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {
                "kind": "task", "id": uuid.uuid4().hex, "contextId": "ctx-legacy",
                "status": {"state": "completed"},
                "artifacts": [{"artifactId": "a1", "parts": [{"kind": "text", "text": answer}]}]}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("sdk", "legacy"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token")
    parser.add_argument("--big", action="store_true")
    args = parser.parse_args()
    if args.mode == "legacy":
        _legacy_server(args.port, args.big).serve_forever()
        return
    import uvicorn

    uvicorn.run(_sdk_app(args.port, args.token, args.big), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
