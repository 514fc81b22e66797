"""Hostile: faults that used to lose a dispatch's record, against one real root daemon (issue 35, item 4).

An agent that leaves a 1,000-level tree in its HOME and /tmp, fills /tmp with empty files, or answers with a
lone surrogate; an A2A message and a signed webhook body with one; an intent that claims another display
name. Each dispatch that was accepted keeps its record, ``agent.exited`` and ``intent.completed``; nothing of
an agent outlives its dispatch; the audit log verifies after every fault. The daemon logs to a file
(``--log-target file:``), whose mode is checked too.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from covenant.client import DaemonClient
from covenant.policy.identities import load_user_identity
from covenant.policy.signing import new_intent, sign_intent
from covenant.runtime.mountns import DEFAULT_TMP_INODES, INODES_PER_MIB, MIN_TMP_INODES
from covenant.triggers.webhooks import signature_header
from tests.a2a.conftest import free_port
from tests.daemon.conftest import DaemonProcess, daemon_home
from tests.security.conftest import processes_of_uid

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="agents run as uids of their own only under a root daemon"),
              pytest.mark.xdist_group("fault-records")]  # one worker: the module's daemon is started once

LEAVER = Path(__file__).parent / "agents" / "leaver.py"
DISK_MB = 8
HOOK_SECRET = "whsec-" + secrets.token_hex(12)
A2A_TOKEN = "tok-" + secrets.token_hex(16)


@dataclass
class Faulty:
    daemon: DaemonProcess
    log_file: Path
    hook_port: int
    a2a_port: int

    def dispatch(self, text: str, agent: str = "leaver@local") -> tuple[int, dict]:
        done = self.daemon.cli("dispatch", text, "--agent", agent, "--json", timeout=180)
        assert done.stdout.strip(), done.stderr
        return done.returncode, json.loads(done.stdout)

    def report(self, text: str) -> tuple[dict, dict]:
        code, outcome = self.dispatch(text)
        assert code == 0 and outcome["outcome"] == "ok", outcome
        return outcome, json.loads(outcome["text"])

    def report_over_disk(self, text: str) -> tuple[dict, dict]:
        """A run that ends ``disk_exceeded`` (exit 4): its report from the last line of its stderr."""
        code, outcome = self.dispatch(text)
        assert code == 4 and outcome["outcome"] == "disk_exceeded", outcome
        line = outcome["record"]["stderr_tail"].splitlines()[-1]
        assert line.startswith("report "), outcome["record"]["stderr_tail"]
        return outcome, json.loads(line.removeprefix("report "))

    def events(self, intent: str) -> list[str]:
        lines = self.daemon.cli("audit", "tail", "--json", "-n", "1000000", check=True).stdout.splitlines()
        return [r["type"] for r in map(json.loads, lines) if r["data"].get("intent") == intent]

    def audit(self, type_: str) -> list[dict]:
        lines = self.daemon.cli("audit", "tail", "--json", "-n", "1000000", "--type", type_, check=True).stdout.splitlines()
        return [json.loads(line)["data"] for line in lines]

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def assert_recorded(self, outcome: dict) -> None:
        """The record is stored, the audit log holds the dispatch's end, and verifies; nothing of it runs."""
        intent = outcome["intent_id"]
        shown = self.daemon.cli("show", intent, "--json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["outcome"] == outcome["outcome"], shown.stderr
        types = self.events(intent)
        assert types.count("agent.exited") == 1 and types.count("intent.completed") == 1, types
        assert "audit.error" not in types
        assert self.daemon.cli("audit", "verify").returncode == 0
        uid = outcome["record"]["uid"]
        assert uid is not None and processes_of_uid(uid) == []


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faulty]:
    with daemon_home(tmp_path_factory.mktemp("faults")) as d:
        folder = d.home / "agents" / "leaver"
        folder.mkdir(parents=True)
        shutil.copy(LEAVER, folder / "leaver.py")
        (folder / "leaver.py").chmod(0o644)
        (folder / "agent.toml").write_text(
            '[agent]\nid = "leaver@local"\nname = "leaver"\nversion = "0.1.0"\nruntime = "python3"\n'
            f'entry = "leaver.py"\n\n[resources]\ncpu_ms_per_task = 60000\nmemory_mb = 512\ndisk_mb = {DISK_MB}\n'
            'network = "off"\n')
        d.add_agent("echo", "echo.py")
        logs = d.home.parent / "logs"
        logs.mkdir()
        faulty = Faulty(d, logs / "covenant.log", free_port(), free_port())
        d.env.update(HOOK_SECRET=HOOK_SECRET, A2A_TOKEN=A2A_TOKEN)
        d.write_config(f"""
            [runtime]
            python3 = "/usr/bin/python3"
            kill_grace_ms = 500

            [isolation]
            require = true
            max_processes = 48

            [webhooks]
            listen = "127.0.0.1:{faulty.hook_port}"

            [[webhooks.routes]]
            path = "/hooks/echo"
            agent = "echo@local"
            issuer = "tester@test"
            secret_env = "HOOK_SECRET"

            [a2a]
            listen = "127.0.0.1:{faulty.a2a_port}"
            expose = ["echo"]

            [[a2a.clients]]
            name = "ci"
            token_env = "A2A_TOKEN"
            issuer = "tester@test"
        """)
        d.start("--log-target", f"file:{faulty.log_file}")
        yield faulty
        assert d.stop() == 0, faulty.log()[-3000:]
        assert "Traceback" not in faulty.log() and "internal error" not in faulty.log()
        assert d.cli("audit", "verify").returncode == 0
        low, high = d.uid_range
        left = [p.pid for p in psutil.process_iter(["uids"]) if low <= p.info["uids"].real <= high]
        assert left == [], f"processes of the home's agent uids outlived the daemon: {left}"


def test_a_1000_level_tree_in_home_and_tmp_keeps_the_record_and_is_removed(faulty: Faulty) -> None:
    _, before = faulty.report("look")
    outcome, report = faulty.report("deep 1000")
    assert "d" in report["home"] and "d" in report["tmp"]  # it was there when the agent answered
    assert outcome["record"]["cleanup"] == {"complete": True, "reason": None}
    faulty.assert_recorded(outcome)
    shown = faulty.daemon.cli("show", outcome["intent_id"], check=True).stdout
    assert "  cleanup  everything it left was removed" in shown, shown
    _, after = faulty.report("look")
    assert after["home"] == [] and after["tmp"] == before["tmp"]  # a fresh HOME; /tmp as it was made
    assert "could not be removed" not in faulty.log() and "could not all be removed" not in faulty.log()


def test_empty_files_past_the_inode_cap_are_refused_and_cleaned(faulty: Faulty) -> None:
    """150,000 empty files take no block: the tmpfs caps inodes, and /tmp is emptied though it reports 0 bytes."""
    cap = min(DEFAULT_TMP_INODES, max(MIN_TMP_INODES, DISK_MB * INODES_PER_MIB))
    _, before = faulty.report("look")
    outcome, report = faulty.report_over_disk("files")
    assert "filled its private /tmp" in outcome["error"], outcome["error"]
    assert report["error"] == "No space left on device" and report["made"] < cap, report
    faulty.assert_recorded(outcome)
    _, after = faulty.report("look")
    assert after["tmp_count"] == before["tmp_count"]


def test_an_answer_with_a_lone_surrogate_escape_keeps_its_record(faulty: Faulty) -> None:
    code, outcome = faulty.dispatch("escape")
    assert code == 0 and outcome["outcome"] == "ok" and outcome["text"] == "half \ufffd a pair", outcome
    faulty.assert_recorded(outcome)
    (completed,) = [e for e in faulty.audit("intent.completed") if e["intent"] == outcome["intent_id"]]
    assert completed["outcome"] == "ok" and completed["result"]["bytes"] == len("half \ufffd a pair".encode())


def test_an_answer_with_a_lone_surrogates_raw_bytes_is_a_protocol_error_with_its_record(faulty: Faulty) -> None:
    code, outcome = faulty.dispatch("raw")
    assert code == 4 and outcome["outcome"] == "protocol_error", outcome
    assert "utf-8" in outcome["error"].lower()
    faulty.assert_recorded(outcome)


def _signed_post(faulty: Faulty, body: bytes) -> httpx.Response:
    header = signature_header(HOOK_SECRET.encode(), int(time.time()), body)
    return httpx.post(f"http://127.0.0.1:{faulty.hook_port}/hooks/echo", content=body, timeout=60,
                      headers={"content-type": "application/json", "Covenant-Signature": header})


def test_a_signed_webhook_body_with_a_lone_surrogate_is_a_400_logged_and_audited(faulty: Faulty) -> None:
    before = len([e for e in faulty.audit("webhook.request") if e["outcome"] == "bad_body"])
    refused = _signed_post(faulty, b'{"text": "half \\ud800"}')
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "bad_body", refused.text
    assert "lone surrogate" in refused.json()["error"]["message"]
    raw = _signed_post(faulty, b'{"text": "half \xed\xa0\x80"}')  # not UTF-8 at all
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "bad_body", raw.text
    refusals = [e for e in faulty.audit("webhook.request") if e["outcome"] == "bad_body"]
    assert len(refusals) == before + 2 and {e["status"] for e in refusals} == {400}
    assert faulty.log().count('msg="webhook request refused"') >= 2 and "code=bad_body" in faulty.log()
    accepted = _signed_post(faulty, b'{"text": "still here"}')
    assert accepted.status_code == 200 and accepted.json()["outcome"] == "ok", accepted.text


def test_an_a2a_message_with_a_lone_surrogate_is_a_400_logged_and_audited(faulty: Faulty) -> None:
    url = f"http://127.0.0.1:{faulty.a2a_port}/a2a/echo"
    headers = {"Authorization": f"Bearer {A2A_TOKEN}", "content-type": "application/json"}

    def send(text_json: bytes) -> httpx.Response:
        body = (b'{"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": {"messageId": "m-'
                + secrets.token_hex(4).encode() + b'", "role": "ROLE_USER", "parts": [{"text": ' + text_json + b"}]}}}")
        return httpx.post(url, content=body, headers=headers, timeout=60)

    for text in (b'"half \\ud800"', b'"half \xed\xa0\x80"'):
        refused = send(text)
        assert refused.status_code == 400 and "lone surrogate" in refused.text, refused.text
    refusals = [e for e in faulty.audit("a2a.request") if e["outcome"] == "bad_body"]
    assert len(refusals) == 2 and all(e["client"] == "ci" and e["status"] == 400 for e in refusals)
    assert faulty.log().count('msg="a2a request refused"') >= 2
    served = send(b'"still here"')
    assert served.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", served.text


def test_the_control_socket_refuses_a_body_with_a_lone_surrogate(faulty: Faulty) -> None:
    body = b'{"intent": {"text": "half \\ud800"}, "signature": "00"}'
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(faulty.daemon.socket))
        s.sendall(b"POST /v1/dispatch HTTP/1.1\r\nHost: covenant\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ") and b'"bad_request"' in answer and b"lone surrogate" in answer, answer
    _, report = faulty.report("look")
    assert report["mode"] == "look"  # still serving


def test_the_log_names_the_keys_identity_never_a_claimed_display_name(faulty: Faulty, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", faulty.daemon.env["XDG_CONFIG_HOME"])
    me = load_user_identity()
    intent = new_intent("look", issuer_display="bob@impostor", issuer_pubkey=me.pubkey, agent="leaver@local")
    with DaemonClient(faulty.daemon.socket, timeout=120) as client:
        answer = client.request("POST", "/v1/dispatch", {"intent": intent, "signature": sign_intent(me.key, intent)})
    assert answer["outcome"] == "ok", answer  # type: ignore[index]
    lines = [line for line in faulty.log().splitlines() if intent["id"] in line and "dispatch" in line]
    assert lines and all("issuer=tester@test" in line for line in lines), lines
    assert "bob@impostor" not in faulty.log()


def test_the_log_file_is_the_daemons_alone(faulty: Faulty) -> None:
    st = faulty.log_file.stat()
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    assert stat.S_IMODE(st.st_mode) == 0o640  # its group (root's) may read it; no agent uid can
