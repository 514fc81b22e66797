"""What ``covenant dispatch`` does once its arguments are parsed, without click.

Both the click command and the fast path of :func:`covenant.cli.main.main` call
:func:`dispatch_and_exit`, so the output and exit codes cannot drift apart.
Kept light on purpose: no click, trio, pydantic, psutil, yaml, http.client or ssl.
"""

from __future__ import annotations

import sys
import time

from covenant.cli._output import echo, echo_json, fail, neutralize, print_json, run_standalone
from covenant.cli.dispatch_args import DispatchArgs
from covenant.client import DaemonClient, RemoteError
from covenant.errors import CovenantError, ExitCode
from covenant.home_paths import home_dir, socket_file
from covenant.json_fast import dumps
from covenant.policy.identities import ensure_user_identity
from covenant.policy.signing import new_intent, sign_intent

TYPE_CHECKING = False  # typing's constant, without importing typing on the dispatch path (issue 38)
if TYPE_CHECKING:
    import threading
    from typing import Any, NoReturn

__all__ = ["dispatch_and_exit", "run_fast"]


class _Spinner:
    """Elapsed time on stderr while waiting, only when stderr is a terminal (threading only then)."""

    FRAMES = "|/-\\"

    def __init__(self, label: str) -> None:
        self._label = label
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "_Spinner":
        if sys.stderr.isatty():
            import threading

            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._spin, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()

    def _spin(self) -> None:
        start = time.monotonic()
        frame = 0
        while not self._stop.wait(0.1):
            sys.stderr.write(f"\r{self.FRAMES[frame % 4]} {self._label} {time.monotonic() - start:5.1f}s")
            sys.stderr.flush()
            frame += 1


def _valid_session(session_id: str) -> bool:
    return 0 < len(session_id) <= 128 and all(c.isascii() and (c.isalnum() or c in "._-") for c in session_id)


def _stream(client: DaemonClient, body: dict[str, Any], as_json: bool) -> tuple[dict[str, Any], bool]:
    """Print a streamed dispatch as it arrives; return (the outcome document, whether it streamed).

    An error event raises RemoteError.

    Text: the answer's tokens on stdout as they come, no framing; tool events as
    lines on stderr. ``--json``: every event as one JSON line on stdout.
    """
    wrote_text = False
    for event, data in client.post_events("/v1/dispatch", body):
        if event == "response":  # the agent does not stream: an ordinary answer
            return data, False
        if as_json:
            echo_json(dumps({"event": event, **data}, ensure_ascii=False, sort_keys=True))
        if event == "done":
            if data.get("input_required") and not as_json:  # rune@ask-user's question is no streamed token
                sys.stdout.write(("\n" if wrote_text else "") + neutralize(str(data.get("text") or "")))
                wrote_text = True
            if wrote_text and not as_json:
                sys.stdout.write("\n")
                sys.stdout.flush()
            return data, True
        if event == "error":
            error = data.get("error") or {}
            details = {k: v for k, v in error.items() if k not in ("code", "message")}
            raise RemoteError(str(error.get("code")), str(error.get("message")), 200, details)
        if as_json:
            continue
        if event == "token":
            sys.stdout.write(neutralize(str(data.get("text") or "")))
            sys.stdout.flush()
            wrote_text = True
        elif event == "tool_start":
            echo(f"[tool] {data.get('name')} …", err=True)
        elif event == "tool_done":
            echo(f"[tool] {data.get('name')} {'ok' if data.get('ok') else 'error'}", err=True)
    raise RemoteError("stream_ended", "the daemon's event stream ended without an outcome", 200, {})


def _step_decision(step: dict[str, Any]) -> str:
    """``allowed``, or why not with the fix: the missing actions and the grant command, or what stops it."""
    if step["decision"] == "allow":
        return "allowed"
    if step["missing"]:
        return f"DENIED: missing {', '.join(step['missing'])} ({step['hint']})"
    return f"DENIED: {step['reason']}: {step['message']}"


def _step_line(step: dict[str, Any], indent: str) -> str:
    route = f"{step['agent_ref']} -> {step['agent'] or 'no agent'}"
    after = f", after {', '.join(step['depends_on'])}" if step.get("depends_on") else ""
    branch = f", if {step['condition']}" if step.get("condition") else ""
    needs = ", ".join(step["required"]) or "no capabilities"
    return f"{indent}{' > '.join(step['path'])}: {route}{after}{branch}; needs {needs}; {_step_decision(step)}"


def _workflow_plan_lines(plan: dict[str, Any]) -> list[str]:
    """A workflow's dry-run plan for people: one line per step, grouped by wave, with its route and decision
    (the steps of a workflow a step runs, indented below it)."""
    lines = [f"workflow {plan['workflow']} (timeout {plan['timeout_ms']} ms, output {plan['output_step'] or 'the last step'})"]
    for number, wave in enumerate(plan["waves"]):
        lines.append(f"  wave {number}:")
        for step in wave:
            lines.append(_step_line(step, "    "))
            lines.extend(_step_line(nested, "      ") for nested in step["nested"])
    lines.append(f"  capabilities needed in all: {', '.join(plan['capabilities']) or 'none'}")
    denied = plan["denied"]
    lines.append("  every step may run" if not denied else
                 f"  the workflow would be refused: {len(denied)} step{'s' if len(denied) != 1 else ''} may not run "
                 f"({', '.join(denied)})")
    return lines


def _fail_refused(exc: CovenantError, as_json: bool) -> NoReturn:
    """Print a refusal and exit with its code. A workflow refused before it ran (its ``steps`` details) is shown
    whole: with ``--json`` its error document on stdout, and a dry run's plan, every step with its decision."""
    if isinstance(exc.details.get("steps"), list):
        plan = exc.details.get("workflow")
        if as_json:
            print_json(exc.to_json())
        elif isinstance(plan, dict):
            for line in _workflow_plan_lines(plan):
                echo(line)
    fail(exc.message, exc.exit_code)


def _echo_rune_plan(plan: dict[str, Any]) -> None:
    """A Rune agent's dry-run: the provider and model it would use, what is skipped, what is unavailable."""
    models = plan["model"]
    providers = models.get("providers") or []
    if providers:
        echo(f"model: {providers[0]['model']} from provider {providers[0]['provider']} (alias {models.get('alias')})")
        for later in providers[1:]:
            echo(f"  then, on failure: {later['model']} from {later['provider']}")
    else:
        echo(f"model: none usable: {models.get('problem')}")
    for skipped in models.get("skipped") or []:
        echo(f"  skipped provider {skipped['provider']}: {skipped['reason']}")
    for tool in plan.get("unavailable_tools") or []:
        echo(f"unavailable tool {tool['tool']}: {tool['reason']}")


def dispatch_and_exit(home_root: str, text: str, agent_id: str | None, priority: str, parent: str | None,
                      as_json: bool, dry_run: bool, session_id: str | None = None, stream: bool = False,
                      fleet: bool = False, timeout: str | None = None) -> NoReturn:
    """Sign ``text``, send it to the daemon of the home at ``home_root``, print the answer and exit
    with DESIGN.md §7's code.

    A CovenantError from the libraries becomes ``covenant: error: …`` and its exit code.
    With ``fleet`` the intent goes over NATS instead (:mod:`covenant.cli.fleet_dispatch`, imported
    only then: nats-py stays off the plain dispatch path).
    """
    if fleet:
        from covenant.cli.fleet_dispatch import fleet_dispatch_and_exit

        fleet_dispatch_and_exit(home_root, text, agent_id, priority, parent, as_json, timeout,
                                dry_run=dry_run, session_id=session_id, stream=stream)
    if timeout is not None:
        fail("--timeout is for --fleet (a local dispatch waits for its daemon's answer)", ExitCode.USAGE)
    if session_id is not None and not _valid_session(session_id):
        fail(f"--session {session_id!r}: use 1-128 of A-Za-z0-9._-", ExitCode.USAGE)
    streamed = False
    try:
        identity, created = ensure_user_identity()
        if created:
            echo(f"covenant: created your identity {identity.display} ({identity.pubkey})", err=True)
        intent = new_intent(text, issuer_display=identity.display, issuer_pubkey=identity.pubkey,
                            agent=agent_id, priority=priority, parent=parent)
        body: dict[str, Any] = {"intent": intent, "signature": sign_intent(identity.key, intent), "dry_run": dry_run}
        if session_id is not None:
            body["session_id"] = session_id
        with DaemonClient(socket_file(home_root), home=home_root) as client:
            if stream and not dry_run:
                outcome, streamed = _stream(client, body, as_json)
            else:
                with _Spinner(agent_id or "dispatching"):
                    outcome = client.request("POST", "/v1/dispatch", body)
    except CovenantError as exc:
        _fail_refused(exc, as_json)
    if streamed:
        exit_code = int(outcome["exit_code"])
        if exit_code != ExitCode.OK and not as_json:
            detail = outcome.get("error") or ""
            fail(f"{outcome['agent']}: {outcome['outcome']}: {detail}".rstrip(": "), exit_code)
        sys.exit(exit_code)
    if as_json:
        print_json(outcome)
    if dry_run:
        if not as_json:
            echo(outcome["message"])
            import json  # indented: the json package, which a dispatch that runs never imports

            echo(json.dumps(outcome["decision"], indent=2, sort_keys=True))
            if "rune" in outcome:
                _echo_rune_plan(outcome["rune"])
            if "workflow" in outcome:
                for line in _workflow_plan_lines(outcome["workflow"]):
                    echo(line)
        sys.exit(ExitCode.OK)
    exit_code = int(outcome["exit_code"])
    if not as_json:
        if outcome["outcome"] in ("ok", "agent_error"):
            echo(outcome.get("text") or "")
        if exit_code != ExitCode.OK:
            detail = outcome.get("error") or outcome.get("text") or ""
            fail(f"{outcome['agent']}: {outcome['outcome']}: {detail}".rstrip(": "), exit_code)
    sys.exit(exit_code)


def run_fast(args: DispatchArgs) -> NoReturn:
    """The click-free ``covenant dispatch``: what the click group and command would do, then exit."""
    home_root = home_dir(args.home)
    run_standalone(lambda: dispatch_and_exit(home_root, args.text, args.agent_id, args.priority, args.parent,
                                             args.as_json, args.dry_run, args.session_id, args.stream,
                                             args.fleet, args.timeout))
