"""Small builders for manifest tests: a valid agent.toml and a valid Rune package."""

from __future__ import annotations

import os
from pathlib import Path

VALID_TOML = """\
[agent]
id      = "demo@local"
name    = "demo"
version = "0.1.0"
runtime = "python3"
entry   = "main.py"

[capabilities]
required = ["tool.text_stats"]
optional = ["memory.write"]

[resources]
cpu_ms_per_task = 5000
memory_mb       = 64
disk_mb         = 10
network         = "off"

[settlement]
budget_credits_per_hour = 10
priority                = "high"

[routing]
keywords = ["demo", "count"]
"""

VALID_RUNEFILE = """\
name: helper
version: 0.1.0
instructions: |
  Be helpful.
default_model: default
toolset:
  - rune@web-fetch
  - search_kb
routing_hints:
  keywords: [help, kb]
timeout_ms: 45000
models:
  model_mapping:
    default: some-model
"""

VALID_TOOL = """\
name: search_kb
module: tools/search_kb.py
"""

VALID_WORKFLOW = """\
name: flow
version: 0.1.0
steps:
  - id: a
    agent_ref: local://helper
  - id: b
    agent_ref: local://helper
    input_template: "{{ steps.a.output }}"
    depends_on: [a]
"""


def write_agent(folder: Path, text: str = VALID_TOML, *, filename: str = "agent.toml", entry: str = "main.py") -> Path:
    """Write a manifest and a readable entry script next to it; returns the manifest path."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / entry
    if not script.exists():
        script.write_text("print('hi')\n")
        os.chmod(script, 0o755)
    path = folder / filename
    path.write_text(text)
    return path


def write_rune(
    folder: Path,
    runefile: str = VALID_RUNEFILE,
    *,
    tools: dict[str, str] | None = None,
    workflow: str | None = None,
) -> Path:
    """Write a Rune package (Runefile, tools/*.yaml with their modules, workflow.yaml)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Runefile").write_text(runefile)
    tools_dir = folder / "tools"
    tools_dir.mkdir(exist_ok=True)
    (tools_dir / "search_kb.py").write_text("print('kb')\n")
    for name, text in ({"search_kb.yaml": VALID_TOOL} if tools is None else tools).items():
        (tools_dir / name).write_text(text)
    if workflow is not None:
        (folder / "workflow.yaml").write_text(workflow)
    return folder
