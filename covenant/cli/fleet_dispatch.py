"""``covenant dispatch --fleet``: sign as for a local dispatch, route over the live hosts, publish, wait.

Imported only for ``--fleet``, so the plain dispatch path never loads nats-py or
pydantic. Output and exit codes are those of a local dispatch: the agent's text
(``--json``: the answer message, with ``host`` and ``deliveries``); 5 also when
NATS is unreachable, no live host runs the agent, or no answer came in time;
4 for ``delivery_exhausted``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, NoReturn

from covenant.cli._output import echo, fail, print_json
from covenant.errors import CovenantError, ExitCode

__all__ = ["fleet_dispatch_and_exit"]


def _timeout(text: str | None, skew_s: int) -> float:
    from covenant.fleet.client import default_timeout_s

    if text is None:
        return default_timeout_s(skew_s)
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 86_400:
        fail(f"--timeout {text!r}: give the seconds to wait, a number from 0 to 86400", ExitCode.USAGE)
    return value


async def _dispatch(home_root: str, text: str, agent_id: str | None, priority: str, parent: str | None,
                    timeout: str | None) -> dict[str, Any]:
    from covenant.config import load_config
    from covenant.fleet.client import FleetClient
    from covenant.home import Home
    from covenant.policy.identities import ensure_user_identity
    from covenant.policy.signing import new_intent, sign_intent

    home = Home.resolve(home_root)
    config = load_config(home)
    fleet = config.fleet.require(home.config_path)
    wait_s = _timeout(timeout, config.policy.skew_s)
    identity, created = ensure_user_identity()
    if created:
        echo(f"covenant: created your identity {identity.display} ({identity.pubkey})", err=True)
    async with FleetClient(fleet) as client:
        routed, _how = await client.route(text, agent_id, config.default_agent)
        intent = new_intent(text, issuer_display=identity.display, issuer_pubkey=identity.pubkey,
                            agent=routed, priority=priority, parent=parent)
        body = {"intent": intent, "signature": sign_intent(identity.key, intent)}
        return await client.dispatch(body, routed, wait_s)


def fleet_dispatch_and_exit(home_root: str, text: str, agent_id: str | None, priority: str, parent: str | None,
                            as_json: bool, timeout: str | None, *, dry_run: bool, session_id: str | None,
                            stream: bool) -> NoReturn:
    """Dispatch over the fleet, print the answer as a local dispatch would, exit with its code."""
    from covenant.fleet.answers import exit_code

    for given, flag in ((dry_run, "--dry-run"), (session_id is not None, "--session"), (stream, "--stream")):
        if given:
            fail(f"{flag} runs against one daemon; use it without --fleet (a host's own daemon: "
                 "`covenant --home H dispatch`)", ExitCode.USAGE)
    try:
        answer = asyncio.run(_dispatch(home_root, text, agent_id, priority, parent, timeout))
    except CovenantError as exc:
        fail(exc.message, exc.exit_code)
    code = exit_code(answer)
    if as_json:
        print_json(answer)
        sys.exit(code)
    error = answer.get("error")
    host = answer.get("host") or "?"
    if isinstance(error, dict):
        fail(f"{host}: {error.get('code')}: {error.get('message')}", code)
    if answer.get("outcome") in ("ok", "agent_error"):
        echo(answer.get("text") or "")
    if code != ExitCode.OK:
        detail = answer.get("error") or answer.get("text") or ""
        fail(f"{answer.get('agent')} on {host}: {answer.get('outcome')}: {detail}".rstrip(": "), code)
    sys.exit(code)
