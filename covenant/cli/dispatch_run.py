"""What ``covenant dispatch`` does once its arguments are parsed, without click.

Both the click command and the fast path of :func:`covenant.cli.main.main` call
:func:`dispatch_and_exit`, so the output and exit codes cannot drift apart.
Kept light on purpose: no click, trio, pydantic, psutil, yaml, http.client or ssl.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, NoReturn

from covenant.cli._output import echo, fail, print_json, run_standalone
from covenant.cli.dispatch_args import DispatchArgs
from covenant.client import DaemonClient
from covenant.errors import CovenantError, ExitCode
from covenant.home import Home
from covenant.policy.identities import ensure_user_identity
from covenant.policy.signing import new_intent, sign_intent

if TYPE_CHECKING:
    import threading

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


def dispatch_and_exit(home: Home, text: str, agent_id: str | None, priority: str, parent: str | None,
                      as_json: bool, dry_run: bool) -> NoReturn:
    """Sign ``text``, send it, print the answer and exit with DESIGN.md §7's code.

    A CovenantError from the libraries becomes ``covenant: error: …`` and its exit code.
    """
    try:
        identity, created = ensure_user_identity()
        if created:
            echo(f"covenant: created your identity {identity.display} ({identity.pubkey})", err=True)
        intent = new_intent(text, issuer_display=identity.display, issuer_pubkey=identity.pubkey,
                            agent=agent_id, priority=priority, parent=parent)
        body = {"intent": intent, "signature": sign_intent(identity.key, intent), "dry_run": dry_run}
        with DaemonClient(home.socket_path) as client, _Spinner(agent_id or "dispatching"):
            outcome = client.request("POST", "/v1/dispatch", body)
    except CovenantError as exc:
        fail(exc.message, exc.exit_code)
    if as_json:
        print_json(outcome)
    if dry_run:
        if not as_json:
            echo(outcome["message"])
            echo(json.dumps(outcome["decision"], indent=2, sort_keys=True))
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
    home = Home.resolve(args.home)
    run_standalone(lambda: dispatch_and_exit(home, args.text, args.agent_id, args.priority, args.parent,
                                             args.as_json, args.dry_run))
