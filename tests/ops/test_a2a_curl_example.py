"""docs/a2a.md's first exchange with curl, run as written against a real daemon (issue 39 item 17)."""

from __future__ import annotations

import json
import re
import subprocess

from tests.a2a.conftest import serve_a2a
from tests.conftest import REPO_ROOT, require_tool
from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401  (the fixture)

_SAMPLE_TASK = "1c6932fe-20a6-43b2-ad3f-8790fd6fea8f"


def _shell_blocks() -> list[str]:
    """The ```sh blocks of the section, as a reader would paste them."""
    page = (REPO_ROOT / "docs" / "a2a.md").read_text()
    section = page.split("### A first exchange with curl\n", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def test_the_curl_example_works_as_written(daemon: DaemonProcess) -> None:
    require_tool("curl")
    blocks = _shell_blocks()
    assert len(blocks) == 3 and all("127.0.0.1:8790/a2a/triage" in block for block in blocks)
    daemon.add_agent("triage", "echo.py")
    served = serve_a2a(daemon, expose=("triage",))
    daemon.start()

    def run(block: str) -> str:
        script = block.replace("127.0.0.1:8790", f"127.0.0.1:{served.port}").replace("TOKEN=…", "true")
        done = subprocess.run(["bash", "-euc", script], env={**daemon.env, "TOKEN": served.token},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (script, done.stderr)
        return done.stdout

    card = json.loads(run(blocks[0]))
    assert card["name"] == "triage" and card["supportedInterfaces"][0]["url"] == served.url("triage")
    task = json.loads(run(blocks[1]))["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"] == [{"text": "my invoice is wrong"}]

    out = run(blocks[2].replace(_SAMPLE_TASK, task["id"]))  # two JSON answers, then the stream's events
    sent, end = json.JSONDecoder().raw_decode(out)
    got, end = json.JSONDecoder().raw_decode(out, end)
    stream = out[end:]
    assert sent["task"]["artifacts"][0]["parts"] == [{"text": "my invoice is wrong"}]
    assert got["id"] == task["id"] and got["status"]["state"] == "TASK_STATE_COMPLETED"
    events = [json.loads(line.removeprefix("data: ")) for line in stream.splitlines() if line.startswith("data: ")]
    assert [next(iter(e)) for e in events] == ["task", "artifactUpdate", "statusUpdate"]
    assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    shown = daemon.cli("show", task["id"], check=True).stdout
    assert "triage@local" in shown and " ok" in shown
