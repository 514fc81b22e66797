"""Workflow step overhead: a step (a child intent the daemon makes) against a direct dispatch.

On a throwaway home with a real `covenant daemon`: the python3 echo agent
(agent.toml, ``tool.echo`` required and granted) and two workflow agents whose
steps all call it, one with 1 step and one with 11 steps in a chain. Each round
(interleaved, so load drift on a shared box hits all three alike) times, over the
unix socket with a signed intent:

- ``direct``: a dispatch to the echo agent (the baseline: verify, route, decide,
  audit, spawn the agent, record);
- ``wf1`` and ``wf11``: a dispatch to each workflow.

A step costs ``(wf11 - wf1) / 10``: a child intent built and signed by the
daemon, decided, audited and recorded, plus the same agent spawn. Its overhead
against a direct dispatch is ``step - direct`` (goal: at most 1 ms; the direct
dispatch also pays the socket round trip and signature check a step does not).
The daemon-side part of a step without the agent is ``step`` minus the median
runner time (``record.duration_ms``) of its children.

    .venv/bin/python bench/workflow_steps.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_dispatch import (  # noqa: E402
    REPO, TEXT, granted_identity, manifest, start_daemon, stop_and_clean, throwaway_home,
)
from echo_agents import AGENTS  # noqa: E402

from covenant.client import DaemonClient  # noqa: E402
from covenant.policy.identities import UserIdentity  # noqa: E402
from covenant.policy.signing import new_intent, sign_intent  # noqa: E402

del REPO


def _workflow(name: str, steps: int) -> str:
    lines = [f"name: {name}", "version: 0.1.0", "steps:"]
    for n in range(steps):
        lines += [f"  - id: s{n}", "    agent_ref: local://echo-python3",
                  "    input_template: \"{{ input }}\"" if n == 0 else f"    input_template: \"{{{{ steps.s{n - 1}.output }}}}\""]
        if n:
            lines.append(f"    depends_on: [s{n - 1}]")
    return "\n".join(lines) + "\n"


def _once(socket_path: Path, identity: UserIdentity, agent: str) -> tuple[float, dict]:
    intent = new_intent(TEXT, issuer_display=identity.display, issuer_pubkey=identity.pubkey, agent=agent)
    body = {"intent": intent, "signature": sign_intent(identity.key, intent)}
    start = time.perf_counter()
    with DaemonClient(socket_path, timeout=600) as client:
        outcome = client.request("POST", "/v1/dispatch", body)
    elapsed = time.perf_counter() - start
    if outcome["outcome"] != "ok" or outcome["text"] != TEXT:
        raise SystemExit(f"dispatch to {agent} failed: {outcome}")
    return elapsed, outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="interleaved rounds")
    args = parser.parse_args()
    tmp, home, socket_path, env = throwaway_home("covenant-wf-")
    daemon = None
    try:
        identity = granted_identity(env)
        root = home / "agents" / "echo-python3"
        root.mkdir(parents=True)
        shutil.copy2(AGENTS / "echo.py", root / "echo.py")
        (root / "agent.toml").write_text(manifest("echo-python3@local", "python3", "echo.py"))
        for name, steps in (("wf-one", 1), ("wf-eleven", 11)):
            (home / "agents" / name).mkdir()
            (home / "agents" / name / "workflow.yaml").write_text(_workflow(name, steps))
        daemon = start_daemon(env, socket_path, tmp / "daemon.log")
        for agent in ("echo-python3@local", "wf-one@local", "wf-eleven@local"):
            _once(socket_path, identity, agent)  # warm up
        direct, wf1, wf11, runner = [], [], [], []
        for _ in range(args.runs):
            direct.append(_once(socket_path, identity, "echo-python3@local")[0])
            wf1.append(_once(socket_path, identity, "wf-one@local")[0])
            t, outcome = _once(socket_path, identity, "wf-eleven@local")
            wf11.append(t)
            with DaemonClient(socket_path) as client:
                for child in outcome["record"]["children"]:
                    record = client.request("GET", f"/v1/dispatches/{child['intent']}")
                    runner.append(record["duration_ms"] / 1000)
        med = statistics.median
        step = (med(wf11) - med(wf1)) / 10
        print(f"runs {args.runs}, load {os.getloadavg()[0]:.1f}")
        print(f"direct dispatch (baseline)      p50 {med(direct) * 1000:7.2f} ms")
        print(f"workflow, 1 step                p50 {med(wf1) * 1000:7.2f} ms")
        print(f"workflow, 11 steps              p50 {med(wf11) * 1000:7.2f} ms")
        print(f"one step ((wf11 - wf1) / 10)        {step * 1000:7.2f} ms")
        print(f"step - direct dispatch              {(step - med(direct)) * 1000:+7.2f} ms")
        print(f"step without the agent's run        {(step - med(runner)) * 1000:7.2f} ms (runner p50 {med(runner) * 1000:.2f} ms)")
        return 0
    finally:
        stop_and_clean([daemon], tmp)


if __name__ == "__main__":
    raise SystemExit(main())
