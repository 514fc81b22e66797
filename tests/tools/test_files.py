"""rune@file-read/write/list and apply-patch: confined to the agent's workspace by the kernel.

Host-level: the real tool host on a temp home; as root, the workspace of an
agent uid (files the daemon makes are that uid's). The same escape corpus
runs through a real daemon, replica and scripted model in tests/rune/test_file_tools.py.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from covenant.config import FilesToolConfig
from covenant.runtime.launcher import AgentCredentials
from covenant.tools import beneath
from covenant.tools.result import ToolError
from covenant.tools.workspace import Workspace

from .conftest import Tools

FILE_TOOLS = ["rune@file-read", "rune@file-write", "rune@file-list", "rune@apply-patch"]
ACTIONS = ("tool.file_read", "tool.file_write", "tool.file_list", "tool.apply_patch")
AGENT_UID = 64991


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every confinement test runs with openat2 and with the component walk of old kernels."""
    if request.param == "walk":
        monkeypatch.setattr(beneath, "FORCE_WALK", True)
    else:
        assert beneath.has_openat2(), "this kernel has no openat2: the test host is too old to check it"
    return request.param


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A daemon file outside every workspace, mode 0600, root's when the tests run as root."""
    secret = tmp_path / "daemon-secret"
    secret.write_text("daemon secret\n")
    os.chmod(secret, 0o600)
    return secret


def make_workspace(tmp_path: Path, creds: AgentCredentials | None) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir(mode=0o700)
    if creds is not None:
        os.chown(root, creds.uid, creds.gid)
    return Workspace(root, creds, FilesToolConfig())


def agent_creds() -> AgentCredentials | None:
    return AgentCredentials(AGENT_UID, AGENT_UID) if os.geteuid() == 0 else None


def as_agent(path: Path) -> None:
    if os.geteuid() == 0:
        os.lchown(path, AGENT_UID, AGENT_UID)


def refused(fn, *args) -> ToolError:  # type: ignore[no-untyped-def]
    with pytest.raises(ToolError) as caught:
        fn(*args)
    return caught.value


def test_write_read_list_and_ownership(tmp_path: Path, resolver: str) -> None:
    ws = make_workspace(tmp_path, agent_creds())
    assert ws.write("notes/today.txt", "hello\n") == {"path": "notes/today.txt", "bytes": 6, "created": True}
    made = ws.root / "notes" / "today.txt"
    if os.geteuid() == 0:
        assert made.stat().st_uid == AGENT_UID and made.parent.stat().st_uid == AGENT_UID
    assert stat.S_IMODE(made.stat().st_mode) == 0o600 and stat.S_IMODE(made.parent.stat().st_mode) == 0o700
    assert ws.read("notes/today.txt")["content"] == "hello\n"
    assert ws.write("notes/today.txt", "bye")["created"] is False
    assert made.read_text() == "bye"
    listing = ws.list("")
    assert listing["entries"] == [{"name": "notes", "type": "dir"}] and listing["truncated"] is False
    assert ws.list("notes")["entries"] == [{"name": "today.txt", "type": "file", "size": 3}]


def test_reads_are_capped_and_continue_at_an_offset(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, agent_creds())
    ws.limits = FilesToolConfig(read_max_bytes=10)
    ws.write("big.txt", "0123456789abcdefghij")
    first = ws.read("big.txt")
    assert first["content"] == "0123456789" and first["truncated"] is True and first["size"] == 20
    assert ws.read("big.txt", 10)["content"] == "abcdefghij"
    (ws.root / "bin").write_bytes(b"\xff\xfe\x00")
    as_agent(ws.root / "bin")
    assert ws.read("bin")["encoding"] == "base64"
    e = refused(ws.write, "huge", "x" * (FilesToolConfig().write_max_bytes + 1))
    ws.limits = FilesToolConfig()
    assert refused(ws.write, "huge", "x" * (ws.limits.write_max_bytes + 1)).code == "file_too_large"
    assert e.code == "file_too_large" and not (ws.root / "huge").exists()


ESCAPES = ["../daemon-secret", "/etc/passwd", "a/../../daemon-secret", "/proc/self/root/etc/passwd"]


@pytest.mark.parametrize("path", ESCAPES)
def test_traversal_and_absolute_paths_are_refused(tmp_path: Path, outside: Path, resolver: str, path: str) -> None:
    ws = make_workspace(tmp_path, agent_creds())
    (ws.root / "a").mkdir()
    as_agent(ws.root / "a")
    for fn, args in ((ws.read, (path,)), (ws.write, (path, "pwned")), (ws.list, (path,))):
        assert refused(fn, *args).code == "path_refused", (fn, path)
    assert outside.read_text() == "daemon secret\n"


@pytest.mark.parametrize("target", ["outside-abs", "outside-rel", "proc-root", "proc-fd"])
def test_symlinks_out_are_refused(tmp_path: Path, outside: Path, resolver: str, target: str) -> None:
    ws = make_workspace(tmp_path, agent_creds())
    link = ws.root / "link"
    os.symlink({"outside-abs": str(outside), "outside-rel": "../daemon-secret", "proc-root": "/proc/self/root",
                "proc-fd": "/proc/self/fd/0"}[target], link)
    as_agent(link)
    assert refused(ws.read, "link").code == "path_refused"
    assert refused(ws.write, "link", "pwned").code == "path_refused"
    assert refused(ws.read, "link/etc/passwd").code == "path_refused"
    dirlink = ws.root / "dirlink"
    os.symlink(str(outside.parent), dirlink)
    as_agent(dirlink)
    assert refused(ws.list, "dirlink").code == "path_refused"
    assert refused(ws.write, "dirlink/new-file", "x").code == "path_refused"
    assert not (outside.parent / "new-file").exists()
    assert outside.read_text() == "daemon secret\n"


def test_a_symlink_inside_is_followed_only_with_openat2(tmp_path: Path, resolver: str) -> None:
    ws = make_workspace(tmp_path, agent_creds())
    ws.write("real.txt", "inside")
    os.symlink("real.txt", ws.root / "alias")
    as_agent(ws.root / "alias")
    if resolver == "openat2":
        assert ws.read("alias")["content"] == "inside"
    else:
        assert refused(ws.read, "alias").code == "path_refused"


def test_a_hardlink_to_a_daemon_file_is_not_read_or_written(tmp_path: Path, outside: Path, resolver: str) -> None:
    ws = make_workspace(tmp_path, agent_creds())
    os.link(outside, ws.root / "hard")
    assert refused(ws.read, "hard").code == "path_refused"
    assert refused(ws.write, "hard", "pwned").code == "path_refused"
    assert outside.read_text() == "daemon secret\n"  # not truncated either


@pytest.mark.skipif(os.geteuid() != 0, reason="owner checks exist only when agents have their own uid (root)")
def test_a_file_the_agent_does_not_own_is_refused(tmp_path: Path, resolver: str) -> None:
    ws = make_workspace(tmp_path, agent_creds())
    (ws.root / "roots").write_text("root's file")  # root-owned, inside the workspace (moved in by someone)
    assert refused(ws.read, "roots").code == "path_refused"
    assert refused(ws.write, "roots", "x").code == "path_refused"
    assert (ws.root / "roots").read_text() == "root's file"


def test_fifos_and_devices_do_not_block(tmp_path: Path, resolver: str) -> None:
    ws = make_workspace(tmp_path, agent_creds())
    os.mkfifo(ws.root / "fifo")
    as_agent(ws.root / "fifo")
    assert refused(ws.read, "fifo").code == "wrong_file_type"
    assert refused(ws.write, "fifo", "x").code == "wrong_file_type"
    assert refused(ws.read, "missing").code == "file_not_found"


def test_a_symlink_swapped_in_between_check_and_use_never_escapes(tmp_path: Path, outside: Path, resolver: str) -> None:
    """A thread flips ``d`` between a real directory and a symlink out while the tools open ``d/f``."""
    ws = make_workspace(tmp_path, agent_creds())
    ws.write("real/f", "inside")
    (outside.parent / "f").write_text("daemon secret\n")
    os.chmod(outside.parent / "f", 0o600)
    stop = threading.Event()

    def flip() -> None:
        d, real, tmp_link = ws.root / "d", ws.root / "real", ws.root / "d.link"
        while not stop.is_set():
            try:
                os.symlink(str(outside.parent), tmp_link)
                os.rename(tmp_link, d)  # d is now a symlink out
                os.unlink(d)
                os.rename(real, d)  # d is the real directory
                os.rename(d, real)
            except OSError:
                pass

    thread = threading.Thread(target=flip)
    thread.start()
    seen = {"inside": 0, "refused": 0, "missing": 0}
    try:
        for i in range(3000):
            try:
                content = ws.read("d/f")["content"]
                assert content == "inside", "read through a swapped symlink"
                seen["inside"] += 1
            except ToolError as exc:
                seen["refused" if exc.code == "path_refused" else "missing"] += 1
            try:
                ws.write("d/f", "inside")
            except ToolError:
                pass
    finally:
        stop.set()
        thread.join()
    assert (outside.parent / "f").read_text() == "daemon secret\n"
    assert not any(p.name == "f" and p.stat().st_uid == AGENT_UID for p in outside.parent.iterdir())
    assert seen["refused"] + seen["missing"] > 0 and sum(seen.values()) == 3000


PATCH = """\
--- a/src/app.py
+++ b/src/app.py
@@ -1,3 +1,3 @@
 import os
-print("hello")
+print("goodbye")
 # end
--- /dev/null
+++ b/README
@@ -0,0 +1,2 @@
+a new file
+with two lines
"""


def test_apply_patch_modifies_and_creates(tmp_path: Path, resolver: str) -> None:
    ws = make_workspace(tmp_path, agent_creds())
    ws.write("src/app.py", 'import os\nprint("hello")\n# end\n')
    result = ws.apply_patch(PATCH)
    assert result == {"files": [{"path": "src/app.py", "action": "modified", "hunks": 1},
                                {"path": "README", "action": "created", "hunks": 1}]}
    assert (ws.root / "src/app.py").read_text() == 'import os\nprint("goodbye")\n# end\n'
    assert (ws.root / "README").read_text() == "a new file\nwith two lines\n"
    if os.geteuid() == 0:
        assert (ws.root / "README").stat().st_uid == AGENT_UID
    deletion = "--- a/README\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a new file\n-with two lines\n"
    assert ws.apply_patch(deletion)["files"][0]["action"] == "deleted"
    assert not (ws.root / "README").exists()


def test_a_patch_that_does_not_match_writes_nothing(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path, agent_creds())
    ws.write("src/app.py", "something else\n")
    assert refused(ws.apply_patch, PATCH).code == "patch_failed"
    assert not (ws.root / "README").exists() and (ws.root / "src/app.py").read_text() == "something else\n"
    assert refused(ws.apply_patch, "not a diff").code == "patch_failed"


def test_a_patch_cannot_escape(tmp_path: Path, outside: Path, resolver: str) -> None:
    ws = make_workspace(tmp_path, agent_creds())
    out = "--- /dev/null\n+++ b/../escaped\n@@ -0,0 +1 @@\n+x\n"
    assert refused(ws.apply_patch, out).code == "path_refused"
    os.link(outside, ws.root / "hard")
    into = "--- a/hard\n+++ b/hard\n@@ -1 +1 @@\n-daemon secret\n+pwned\n"
    assert refused(ws.apply_patch, into).code == "path_refused"
    assert outside.read_text() == "daemon secret\n" and not (tmp_path / "escaped").exists()


async def test_through_the_tool_host_one_event_per_call(tools: Tools) -> None:
    agent = tools.package("coder", FILE_TOOLS)
    assert [t["function"]["name"] for t in tools.host.offered(agent)] == ["file-read", "file-write", "file-list", "apply-patch"]
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    call = tools.host.call
    assert (await call(ctx, "file-write", {"path": "x.txt", "content": "data"})).ok
    assert (await call(ctx, "file-read", {"path": "x.txt"})).content["content"] == "data"
    escaped = await call(ctx, "file-read", {"path": "../../../covenant.toml"})
    assert escaped.error_code == "path_refused" and escaped.outcome == "denied"
    workspace = tools.home.workspaces_dir / agent.id
    assert (workspace / "x.txt").read_text() == "data"
    assert stat.S_IMODE(workspace.stat().st_mode) == 0o700
    assert [e["outcome"] for e in tools.audit.of("tool.call")] == ["ok", "ok", "denied"]


def test_every_error_code_is_documented() -> None:
    from covenant.tools.result import ERROR_CODES
    from tests.conftest import REPO_ROOT

    doc = (REPO_ROOT / "docs" / "tools.md").read_text()
    table = doc.split("## Error codes", 1)[1].split("\n## ", 1)[0]
    missing = [code for code in ERROR_CODES if f"| `{code}` |" not in table]
    assert not missing, f"docs/tools.md has no Error codes row for {missing}"
