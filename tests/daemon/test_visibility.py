"""Per-user visibility of dispatch records, with real other uids on the real control socket.

Clients run as other uids under /usr/bin/python3 (the system interpreter,
reachable by every uid): a stdlib-only HTTP client for the API, and the real
CLI for `history` and `show`. The operators group is `nogroup` (gid 65534),
which `nobody` has as its passwd primary group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig

import pytest

from tests.conftest import REPO_ROOT
from tests.daemon.conftest import DaemonProcess
from tests.daemon.test_daemon_e2e import audit_records, wait_for

SYSTEM_PYTHON = "/usr/bin/python3"
OWNER_A, OWNER_B = 65533, 65532  # no passwd entry: members of no group
NOBODY = 65534  # passwd primary group nogroup: an operator when operators_group = "nogroup"
OUTSIDER_IN_GROUP = 65531  # runs with primary gid 65534 (SO_PEERCRED): an operator too

_CLIENT = r"""
import json, socket, sys
path, method, target = sys.argv[1:4]
body = sys.argv[4].encode() if len(sys.argv) > 4 else b""
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
head = f"{method} {target} HTTP/1.1\r\nhost: covenant\r\nconnection: close\r\n"
if body:
    head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
s.sendall(head.encode() + b"\r\n" + body)
data = b""
while chunk := s.recv(65536):
    data += chunk
head, _, body = data.partition(b"\r\n\r\n")
print(json.dumps({"status": int(head.split()[1]), "body": json.loads(body)}))
"""


def _require_system_python() -> None:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"{SYSTEM_PYTHON} is missing, and CI must run every test")
        pytest.skip(f"{SYSTEM_PYTHON} is missing: no interpreter another uid can run")
    if os.geteuid() != 0:
        pytest.skip("switching to other uids needs root")


def _as(uid: int, gid: int, argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, user=uid, group=gid, extra_groups=[], env=env or {"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120, cwd="/")


def _get(daemon: DaemonProcess, uid: int, gid: int, target: str) -> tuple[int, dict]:
    done = _as(uid, gid, [SYSTEM_PYTHON, "-c", _CLIENT, str(daemon.socket), "GET", target])
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    return answer["status"], answer["body"]


def _open_socket_to_everyone(daemon: DaemonProcess) -> None:
    os.chmod(daemon.socket.parent, 0o755)
    os.chmod(daemon.socket, 0o666)


@pytest.fixture
def served(daemon: DaemonProcess) -> DaemonProcess:
    _require_system_python()
    daemon.write_config('[isolation]\noperators_group = "nogroup"\n')
    daemon.add_agent("echo", "echo.py", keywords=("echo",))
    daemon.start()
    _open_socket_to_everyone(daemon)
    return daemon


def _signed_body(uid: int, text: str, agent: str) -> tuple[str, str]:
    """(intent id, request body) of an intent signed here by a new key (the signature is not what is tested)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from covenant.keys import public_key_hex
    from covenant.policy.signing import new_intent, sign_intent

    key = Ed25519PrivateKey.generate()
    intent = new_intent(text, issuer_display=f"u{uid}@test", issuer_pubkey=public_key_hex(key), agent=agent)
    return intent["id"], json.dumps({"intent": intent, "signature": sign_intent(key, intent), "dry_run": False})


def _dispatch_via_api_as(daemon: DaemonProcess, uid: int, text: str) -> str:
    """Submit an intent to the echo agent as ``uid``; its id."""
    _, body = _signed_body(uid, text, "echo@local")
    done = _as(uid, uid, [SYSTEM_PYTHON, "-c", _CLIENT, str(daemon.socket), "POST", "/v1/dispatch", body])
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == 200 and answer["body"]["outcome"] == "ok", answer
    assert answer["body"]["record"]["peer_uid"] == uid
    return answer["body"]["intent_id"]


def test_each_uid_sees_its_own_dispatches_and_operators_see_all(served: DaemonProcess) -> None:
    mine = _dispatch_via_api_as(served, OWNER_A, "echo from a")
    theirs = _dispatch_via_api_as(served, OWNER_B, "echo from b")
    root_run = served.cli("dispatch", "echo from root", "--agent", "echo@local", "--json")
    assert root_run.returncode == 0, root_run.stderr
    roots = json.loads(root_run.stdout)["intent_id"]

    status, listed = _get(served, OWNER_A, OWNER_A, "/v1/dispatches?limit=100")
    assert status == 200 and [d["intent_id"] for d in listed["dispatches"]] == [mine]
    assert _get(served, OWNER_A, OWNER_A, f"/v1/dispatches/{mine}")[0] == 200
    for other in (theirs, roots):
        status, refused = _get(served, OWNER_A, OWNER_A, f"/v1/dispatches/{other}")
        assert status == 404 and refused["error"]["code"] == "not_found"  # as if absent: no existence leak
    status, listed = _get(served, OWNER_B, OWNER_B, "/v1/dispatches?agent=echo@local")
    assert [d["intent_id"] for d in listed["dispatches"]] == [theirs]

    everything = {mine, theirs, roots}
    for uid, gid in ((NOBODY, NOBODY), (OUTSIDER_IN_GROUP, NOBODY)):  # operators: passwd group, peer gid
        status, listed = _get(served, uid, gid, "/v1/dispatches?limit=100")
        assert status == 200 and {d["intent_id"] for d in listed["dispatches"]} == everything, (uid, listed)
        assert _get(served, uid, gid, f"/v1/dispatches/{mine}")[0] == 200
    root_view = served.api("GET", "/v1/dispatches?limit=100")
    assert {d["intent_id"] for d in root_view["dispatches"]} == everything
    assert {d["intent_id"]: d["peer_uid"] for d in root_view["dispatches"]}[roots] == os.getuid()


def test_a_user_reads_the_record_of_their_intent_a_killed_daemon_left_interrupted(daemon: DaemonProcess) -> None:
    """The record the next start writes for an interrupted intent keeps the submitting uid (from its
    intent.received): that user reads it like their other records, others still do not."""
    _require_system_python()
    daemon.add_agent("slow", "slow.py", keywords=("sleep",))
    daemon.start()
    _open_socket_to_everyone(daemon)
    intent_id, body = _signed_body(OWNER_A, "sleep 120", "slow@local")
    waiting = subprocess.Popen([SYSTEM_PYTHON, "-c", _CLIENT, str(daemon.socket), "POST", "/v1/dispatch", body],
                               user=OWNER_A, group=OWNER_A, extra_groups=[], env={"PATH": "/usr/bin:/bin"},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    wait_for(lambda: any(r["type"] == "agent.spawned" and r["data"]["intent"] == intent_id for r in audit_records(daemon)),
             what="the slow agent to start")
    received = next(r["data"] for r in audit_records(daemon)
                    if r["type"] == "intent.received" and r["data"]["intent"] == intent_id)
    assert received["peer_uid"] == OWNER_A

    daemon.stop(sig=signal.SIGKILL)
    waiting.communicate(timeout=60)  # its connection died with the daemon
    daemon.start()
    _open_socket_to_everyone(daemon)
    status, record = _get(daemon, OWNER_A, OWNER_A, f"/v1/dispatches/{intent_id}")
    assert status == 200 and (record["outcome"], record["peer_uid"]) == ("interrupted", OWNER_A), record
    status, listed = _get(daemon, OWNER_A, OWNER_A, "/v1/dispatches?limit=100")
    assert [d["intent_id"] for d in listed["dispatches"]] == [intent_id]
    status, refused = _get(daemon, OWNER_B, OWNER_B, f"/v1/dispatches/{intent_id}")
    assert status == 404 and refused["error"]["code"] == "not_found"
    assert daemon.cli("audit", "verify").returncode == 0


def _cli_env_for_other_uids() -> dict[str, str] | None:
    """PYTHONPATH that lets the system interpreter import covenant and its dependencies; None if unreachable."""
    paths = [str(REPO_ROOT), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), "HOME": "/"}
    probe = _as(OWNER_A, OWNER_A, [SYSTEM_PYTHON, "-c", "import covenant.cli.group"], env)
    return env if probe.returncode == 0 else None


def test_history_and_show_from_the_cli_as_another_uid(served: DaemonProcess) -> None:
    env = _cli_env_for_other_uids()
    if env is None or sys.version_info[:2] != (3, 11):
        pytest.skip(f"this checkout or its venv is not readable by other uids ({REPO_ROOT}); the API test covers the rule")
    mine = _dispatch_via_api_as(served, OWNER_A, "echo from a")
    theirs = _dispatch_via_api_as(served, OWNER_B, "echo from b")
    env = {**env, "COVENANT_SOCKET": str(served.socket), "COVENANT_HOME": str(served.home)}
    history = _as(OWNER_A, OWNER_A, [SYSTEM_PYTHON, "-m", "covenant", "history", "--json"], env)
    assert history.returncode == 0, history.stderr
    assert [r["intent_id"] for r in json.loads(history.stdout)] == [mine]
    shown = _as(OWNER_A, OWNER_A, [SYSTEM_PYTHON, "-m", "covenant", "show", mine], env)
    assert shown.returncode == 0 and mine in shown.stdout, shown.stderr
    hidden = _as(OWNER_A, OWNER_A, [SYSTEM_PYTHON, "-m", "covenant", "show", theirs], env)
    assert hidden.returncode == 1 and "no dispatch record" in hidden.stderr
    operator = _as(NOBODY, NOBODY, [SYSTEM_PYTHON, "-m", "covenant", "history", "--json"], env)
    assert {r["intent_id"] for r in json.loads(operator.stdout)} == {mine, theirs}


_STATUS_ONLY = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b"GET /v1/logs HTTP/1.1\r\nhost: covenant\r\nconnection: close\r\n\r\n")
print(s.recv(65536).split(b"\r\n", 1)[0].split()[1].decode())
"""


def test_the_log_stream_is_for_operators_only(served: DaemonProcess) -> None:
    _dispatch_via_api_as(served, OWNER_A, "echo a secret plan")
    stranger = _as(OWNER_B, OWNER_B, [SYSTEM_PYTHON, "-c", _STATUS_ONLY, str(served.socket)])
    operator = _as(NOBODY, NOBODY, [SYSTEM_PYTHON, "-c", _STATUS_ONLY, str(served.socket)])
    assert (stranger.stdout.strip(), operator.stdout.strip()) == ("403", "200"), (stranger.stderr, operator.stderr)
    status, body = _get(served, OWNER_A, OWNER_A, "/v1/logs")
    assert status == 403 and body["error"]["code"] == "forbidden"  # even the dispatch's own user: history is theirs
