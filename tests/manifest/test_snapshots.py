"""Package snapshots: what they hold, what they never copy, and that an unchanged package is never copied twice."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from covenant.manifest import snapshots
from covenant.manifest.registry import load_manifest
from covenant.manifest.snapshots import SnapshotStore, TooLarge, package_files

MANIFEST = '[agent]\nid = "{name}@local"\nname = "{name}"\nversion = "0.1.0"\nruntime = "python3"\nentry = "{entry}"\n'


def _package(agents: Path) -> Path:
    folder = agents / "pkg"
    (folder / "lib").mkdir(parents=True)
    (folder / "agent.toml").write_text(MANIFEST.format(name="pkg", entry="main.py"))
    (folder / "main.py").write_text("print('hi')\n")
    (folder / "lib" / "helper.py").write_text("X = 1\n")
    (folder / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(folder / "run.sh", 0o755)
    return folder / "agent.toml"


def test_a_package_folder_is_copied_whole_and_loads_from_its_snapshot(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    manifest = _package(agents)
    store = SnapshotStore(tmp_path / "snapshots")
    files = package_files(manifest, agents, manifest.parent / "main.py")
    assert [f[0] for f in files.files] == ["agent.toml", "lib/helper.py", "main.py", "run.sh"]
    taken = store.store(files, manifest, "pkg@local")
    store.keep({manifest: taken.digest})
    assert store.find(manifest) == taken
    assert stat.S_IMODE(os.stat(taken.files_root / "run.sh").st_mode) == 0o755
    loaded = load_manifest(taken.manifest, taken.files_root)
    assert loaded.spec.id == "pkg@local" and loaded.spec.entry == taken.files_root / "main.py"
    # The same content again: the same digest, nothing copied (the folder is not replaced).
    inode = os.stat(taken.folder).st_ino
    again = store.store(package_files(manifest, agents, manifest.parent / "main.py", store.hashes), manifest, "pkg@local")
    assert again.digest == taken.digest and os.stat(again.folder).st_ino == inode
    # An edit is a new digest; keep() removes the snapshot no manifest names any more.
    (manifest.parent / "main.py").write_text("print('edited')\n")
    edited = store.store(package_files(manifest, agents, None, store.hashes), manifest, "pkg@local")
    assert edited.digest != taken.digest
    store.keep({manifest: edited.digest})
    assert not taken.folder.exists() and edited.folder.exists()
    assert SnapshotStore(tmp_path / "snapshots").find(manifest) == edited  # the index is on disk


def test_a_flat_manifest_snapshot_holds_the_manifest_and_its_entry_only(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    (agents / "code").mkdir(parents=True)
    manifest = agents / "flat.toml"
    manifest.write_text(MANIFEST.format(name="flat", entry="code/flat.py"))
    (agents / "code" / "flat.py").write_text("print('hi')\n")
    (agents / "other.toml").write_text(MANIFEST.format(name="other", entry="code/flat.py"))
    files = package_files(manifest, agents, agents / "code" / "flat.py")
    assert [f[0] for f in files.files] == ["code/flat.py", "flat.toml"]
    taken = SnapshotStore(tmp_path / "snapshots").store(files, manifest, "flat@local")
    assert load_manifest(taken.manifest, taken.files_root).spec.entry == taken.files_root / "code" / "flat.py"


def test_links_out_of_the_package_dot_names_and_write_bits_are_never_copied(tmp_path: Path) -> None:
    """A package may hold a link to a secret of the host's: copied, agents could read it in the snapshot."""
    agents = tmp_path / "agents"
    manifest = _package(agents)
    secret = tmp_path / "secret"
    secret.write_text("key")
    os.chmod(secret, 0o600)
    (manifest.parent / "leak").symlink_to(secret)
    (manifest.parent / "lib" / "inside").symlink_to(manifest.parent / "main.py")
    (manifest.parent / ".git").mkdir()
    (manifest.parent / ".git" / "config").write_text("x")
    (manifest.parent / "private.txt").write_text("p")
    os.chmod(manifest.parent / "private.txt", 0o600)
    os.chmod(manifest.parent / "lib" / "helper.py", 0o666)
    files = package_files(manifest, agents, None)
    names = [f[0] for f in files.files]
    assert "leak" not in names and ".git/config" not in names and "lib/inside" in names
    taken = SnapshotStore(tmp_path / "snapshots").store(files, manifest, "pkg@local")
    assert stat.S_IMODE(os.stat(taken.files_root / "private.txt").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(taken.files_root / "lib" / "helper.py").st_mode) == 0o644
    assert not (taken.files_root / "leak").exists()


def test_a_package_over_the_limits_gets_no_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents = tmp_path / "agents"
    manifest = _package(agents)
    monkeypatch.setattr(snapshots, "MAX_FILES", 2)
    with pytest.raises(TooLarge, match="over 2 files"):
        package_files(manifest, agents, None)
    monkeypatch.setattr(snapshots, "MAX_FILES", 100)
    monkeypatch.setattr(snapshots, "MAX_BYTES", 10)
    with pytest.raises(TooLarge):
        package_files(manifest, agents, None)


def test_a_damaged_index_or_snapshot_is_no_snapshot(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    manifest = _package(agents)
    store = SnapshotStore(tmp_path / "snapshots")
    taken = store.store(package_files(manifest, agents, None), manifest, "pkg@local")
    store.keep({manifest: taken.digest})
    (tmp_path / "snapshots" / "index.json").write_text('{"%s": "../../etc"}' % manifest)
    assert SnapshotStore(tmp_path / "snapshots").find(manifest) is None
    (tmp_path / "snapshots" / "index.json").write_text("not json")
    assert SnapshotStore(tmp_path / "snapshots").find(manifest) is None


def test_a_file_name_that_is_not_utf8_is_copied_not_a_failed_scan(tmp_path: Path) -> None:
    """Names are bytes on Linux: one that does not decode (here 0xff) must not stop the daemon's scan."""
    agents = tmp_path / "agents"
    manifest = _package(agents)
    odd = os.fsencode(manifest.parent) + b"/odd\xff.txt"
    with open(odd, "wb") as f:
        f.write(b"x")
    files = package_files(manifest, agents, None)
    taken = SnapshotStore(tmp_path / "snapshots").store(files, manifest, "pkg@local")
    assert os.path.exists(os.fsencode(taken.files_root) + b"/odd\xff.txt") and len(files.digest) == 64
