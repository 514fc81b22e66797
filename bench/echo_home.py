"""A throwaway covenant home with one python3 echo agent, shared by the listener benches (triggers, A2A)."""

from __future__ import annotations

import os
import socket
import textwrap
from dataclasses import dataclass
from pathlib import Path

from daemon_dispatch import covenant_cli, throwaway_home

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

    def add_python_agent(self, name: str, source: str) -> None:
        """Install ``source`` as the python3 agent ``NAME@local``, with 600 s of CPU per task."""
        folder = self.home / "agents" / name
        folder.mkdir()
        (folder / f"{name}.py").write_text(source)
        (folder / f"{name}.py").chmod(0o644)
        (folder / "agent.toml").write_text(f'[agent]\nid = "{name}@local"\nname = "{name}"\nversion = "0.1.0"\n'
                                           f'runtime = "python3"\nentry = "{name}.py"\n[resources]\ncpu_ms_per_task = 600000\n')

    def extend_section(self, section: str, lines: str) -> None:
        """Put ``lines`` at the top of covenant.toml's ``[section]`` table (``init`` wrote one for each)."""
        config = self.home / "covenant.toml"
        config.write_text(config.read_text().replace(f"[{section}]\n", f"[{section}]\n{lines}", 1))

    def add_config(self, text: str) -> None:
        with open(self.home / "covenant.toml", "a") as config:
            config.write(textwrap.dedent(text))


def echo_home(prefix: str, extra_env: dict[str, str]) -> EchoHome:
    """`covenant init` as bench@local in a 0711 temp dir, agent echo@local installed; this process's env points at it."""
    tmp, home, socket_path, env = throwaway_home(prefix, extra_env)
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
