"""Send N signed dispatches concurrently from one httpx async client (on trio); print their ids.

Exits non-zero if any answer is not `ok` or does not echo its own intent.
"""

from __future__ import annotations

import json
import sys

import httpx
import trio

from covenant.policy.identities import load_user_identity
from covenant.policy.signing import new_intent, sign_intent


async def main(socket_path: str, count: int) -> None:
    identity = load_user_identity()
    ids: list[str] = []
    transport = httpx.AsyncHTTPTransport(uds=socket_path)
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(transport=transport, base_url="http://covenant", timeout=600, limits=limits) as client:

        async def one(i: int) -> None:
            text = f"echo burst {i}"
            intent = new_intent(text, issuer_display=identity.display, issuer_pubkey=identity.pubkey)
            response = await client.post("/v1/dispatch", json={"intent": intent, "signature": sign_intent(identity.key, intent)})
            doc = response.json()
            if response.status_code != 200 or doc["outcome"] != "ok" or doc["text"] != text or doc["intent_id"] != intent["id"]:
                raise SystemExit(f"dispatch {i} failed: {response.status_code} {doc}")
            ids.append(intent["id"])

        async with trio.open_nursery() as nursery:
            for i in range(count):
                nursery.start_soon(one, i)
    print(json.dumps(ids))


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
