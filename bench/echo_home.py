"""A throwaway covenant home with one python3 echo agent, shared by the listener benches (triggers, A2A)."""

from __future__ import annotations

import os
import socket
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from daemon_dispatch import checkout_env, covenant_cli

__all__ = ["EchoHome", "echo_home"]

ECHO = '''import json, sys
intent = json.loads(sys.stdin.readline())
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": intent["text"], "sources": []}), flush=True)
'''
MANIFEST = '''[agent]
id = "echo@local"
name = "echo"
version = "0.1.0"
runtime = "python3"
entry = "echo.py"
'''


@dataclass(frozen=True)
class EchoHome:
    tmp: Path
    home: Path
    socket_path: Path
    env: dict[str, str]
    port: int
    """A free loopback TCP port for the listener under test."""

    def add_config(self, text: str) -> None:
        with open(self.home / "covenant.toml", "a") as config:
            config.write(textwrap.dedent(text))


def echo_home(prefix: str, extra_env: dict[str, str]) -> EchoHome:
    """`covenant init` as bench@local in a 0711 temp dir, agent echo@local installed; this process's env points at it."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(tmp, 0o711)  # agents run as other uids: they must traverse to their folder
    home, socket_path = tmp / "home", tmp / "covenant.sock"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "COVENANT_HOME": str(home),
           "COVENANT_SOCKET": str(socket_path), "XDG_CONFIG_HOME": str(tmp / "xdg"), "USER": "bench",
           "LANG": "C.UTF-8", **checkout_env(), **extra_env}
    os.environ.update({k: env[k] for k in ("COVENANT_HOME", "COVENANT_SOCKET", "XDG_CONFIG_HOME")})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    covenant_cli(env, "init", "--display", "bench@local")
    agent_dir = home / "agents" / "echo"
    agent_dir.mkdir(parents=True)
    (agent_dir / "echo.py").write_text(ECHO)
    os.chmod(agent_dir / "echo.py", 0o644)
    (agent_dir / "agent.toml").write_text(MANIFEST)
    return EchoHome(tmp, home, socket_path, env, port)
