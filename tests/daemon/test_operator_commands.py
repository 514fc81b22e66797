"""Operator-facing commands against a real daemon: what they read, print and exit with (issue 16)."""

from __future__ import annotations

import json

from tests.daemon.conftest import DaemonProcess


def test_agents_check_reads_the_files_not_the_daemon(daemon: DaemonProcess) -> None:
    daemon.add_agent("good", "echo.py", keywords=("good",))
    daemon.start()
    # Written after the daemon loaded its registry, and never reloaded: only the files know it.
    broken = daemon.home / "agents" / "broken.toml"
    broken.write_text("[agent\n")
    result = daemon.cli("agents", "check")
    assert result.returncode == 1, result.stderr
    assert str(broken) in result.stdout
    assert "2 manifest(s): 1 valid, 1 rejected" in result.stderr
    as_json = json.loads(daemon.cli("agents", "check", "--json").stdout)
    assert as_json["valid"] is False and as_json["agents"] == ["good@local"]


def test_rejected_edit_withdraws_the_agent_never_old_manifest_with_new_code(daemon: DaemonProcess) -> None:
    manifest = daemon.add_agent("first", "echo.py", keywords=("first",))
    daemon.start()
    assert daemon.cli("dispatch", "first go").stdout.strip() == "first go"
    # An edit of the code and a broken manifest, as one careless change.
    (manifest.parent / "echo.py").write_text(
        "import json, sys\n"
        "intent = json.loads(sys.stdin.readline())\n"
        'print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": "edited", "sources": []}))\n'
    )
    manifest.write_text(manifest.read_text().replace("cpu_ms_per_task = 30000", 'cpu_ms_per_task = "lots"'))

    reloaded = daemon.cli("reload")
    assert reloaded.returncode == 1, reloaded.stdout + reloaded.stderr
    assert f"rejected: {manifest}" in reloaded.stdout and "withdrawn: first@local" in reloaded.stdout
    assert "1 manifest(s) rejected" in reloaded.stderr
    doc = json.loads(daemon.cli("reload", "--json").stdout)
    assert doc["rejected"] == [str(manifest)] and doc["withdrawn"] == [] and "first@local" not in doc["agents"]

    by_keyword = daemon.cli("dispatch", "first go")
    assert by_keyword.returncode == 6
    named = daemon.cli("dispatch", "first go", "--agent", "first@local")
    assert named.returncode == 6 and "withdrawn" in named.stderr and "covenant agents check" in named.stderr

    # A restart gives the same answer: nothing of the old version comes back.
    assert daemon.stop() == 0
    daemon.start()
    assert daemon.cli("dispatch", "first go", "--agent", "first@local").returncode == 6

    manifest.write_text(manifest.read_text().replace('cpu_ms_per_task = "lots"', "cpu_ms_per_task = 30000"))
    fixed = daemon.cli("reload")
    assert fixed.returncode == 0 and "added: first@local" in fixed.stdout
    ran = daemon.cli("dispatch", "first go")
    assert ran.stdout.strip() == "edited", ran.stderr
