"""Snapshots of agent packages: the last valid version of each, kept so a broken edit never takes an agent offline.

Each time a manifest loads, the daemon copies its whole package — the
manifest and every file beside it (for a flat ``agents/X.toml``: the manifest
and its entry file) — into ``state/snapshots/<sha256>/``, named by the
digest of its content. When an edit makes the manifest invalid, the agent runs
from that copy: the old manifest with the old code, never the old manifest
over edited code. ``state/snapshots/index.json`` maps each manifest path to
its snapshot, so a restart finds the same version.

A snapshot folder::

    <digest>/snapshot.json      {"manifest": relative path, "source": the manifest it copies, "agent": id}
    <digest>/files/...          the package, laid out as in the agents folder

Copies keep the files' permission bits without group/other write (agents
read their package there exactly as in ``agents/``). Symlinks are followed
only to files inside the package; anything else (a link out of it, a device,
a socket) is left out. A package over :data:`MAX_FILES` files or
:data:`MAX_BYTES` bytes gets no snapshot (it is named in the log): a broken
edit then withdraws the agent, as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from covenant.durable import fsync_dir, replace_file
from covenant.manifest.file_tree import TooDeep, files_under

__all__ = ["MAX_BYTES", "MAX_FILES", "PackageFiles", "Snapshot", "SnapshotStore", "TooLarge", "package_files"]

MAX_FILES = 4096
MAX_BYTES = 256 * 1024 * 1024
_INDEX = "index.json"
_META = "snapshot.json"
_FILES = "files"


class TooLarge(Exception):
    """The package is over the snapshot limits."""


@dataclass(frozen=True)
class PackageFiles:
    """What a snapshot of one manifest holds: ``base`` and the files under it (relative), with their digest."""

    base: Path
    manifest: str
    files: tuple[tuple[str, Path, int, str], ...]
    """(relative path, real path, permission bits, sha256) in path order."""

    @property
    def digest(self) -> str:
        """The package's content address: every file's relative path, mode and content, and which is the manifest."""
        h = hashlib.sha256(f"manifest {self.manifest}\n".encode("utf-8", "surrogateescape"))
        for relative, _, mode, sha in self.files:
            h.update(f"{mode:o} {sha} {relative}\n".encode("utf-8", "surrogateescape"))
        return h.hexdigest()


@dataclass(frozen=True)
class Snapshot:
    """A stored snapshot: where its copy of the manifest is, and the package root to scan it from."""

    digest: str
    folder: Path
    manifest: Path
    source: Path

    @property
    def files_root(self) -> Path:
        return self.folder / _FILES


class _Hashes:
    """sha256 of files, remembered by (device, inode, size, mtime, ctime): a rescan rereads only what changed."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, int, int, int, int], str] = {}

    def of(self, path: Path, st: os.stat_result) -> str:
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        found = self._known.get(key)
        if found is None:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            found = self._known[key] = h.hexdigest()
        return found


def _walk(base: Path, real_base: str) -> list[tuple[str, Path]]:
    """Every file under ``base`` (dot-names skipped, links followed only to files inside ``real_base``)."""
    found: list[tuple[str, Path]] = []
    try:
        for path in files_under(base, skip_dot_names=True):
            real = os.path.realpath(path)
            if os.path.commonpath([real, real_base]) != real_base:
                continue  # a link out of the package: never copied where agents read
            found.append((os.path.relpath(path, base), Path(real)))
            if len(found) > MAX_FILES:
                raise TooLarge(f"over {MAX_FILES} files")
    except TooDeep as exc:
        raise TooLarge(str(exc)) from None
    return found


def package_files(manifest: Path, agents_dir: Path, entry: Path | None, hashes: _Hashes | None = None) -> PackageFiles:
    """The files a snapshot of ``manifest`` holds (raises TooLarge, OSError).

    A manifest directly in ``agents_dir`` is a flat ``X.toml``: its package is the manifest and its entry.
    Any other manifest's package is its whole folder.
    """
    hashes = hashes or _Hashes()
    manifest = Path(os.path.abspath(manifest))
    flat = manifest.parent == Path(os.path.abspath(agents_dir))
    base = manifest.parent
    real_base = os.path.realpath(base)
    if flat:
        candidates = [(manifest.name, Path(os.path.realpath(manifest)))]
        if entry is not None:
            real_entry = os.path.realpath(entry)
            if os.path.commonpath([real_entry, real_base]) == real_base:
                candidates.append((os.path.relpath(os.path.abspath(entry), base), Path(real_entry)))
    else:
        candidates = _walk(base, real_base)
    files: list[tuple[str, Path, int, str]] = []
    total = 0
    for relative, real in sorted(set(candidates)):
        st = os.stat(real)
        if not stat.S_ISREG(st.st_mode):
            continue
        total += st.st_size
        if total > MAX_BYTES:
            raise TooLarge(f"over {MAX_BYTES // (1024 * 1024)} MiB")
        files.append((relative, real, stat.S_IMODE(st.st_mode) & 0o755, hashes.of(real, st)))
    return PackageFiles(base, os.path.relpath(manifest, base), tuple(files))


class SnapshotStore:
    """``state/snapshots``: the stored snapshots and the index of which manifest has which (blocking calls)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hashes = _Hashes()
        self._index: dict[str, str] | None = None

    def _read_index(self) -> dict[str, str]:
        if self._index is None:
            try:
                raw = json.loads((self.root / _INDEX).read_text(encoding="utf-8"))
                self._index = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
            except (OSError, ValueError):
                self._index = {}
        return self._index

    def find(self, manifest: Path) -> Snapshot | None:
        """The snapshot last taken of ``manifest`` (by its path), or None."""
        digest = self._read_index().get(str(manifest))
        if digest is None or len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            return None
        folder = self.root / digest
        try:
            meta = json.loads((folder / _META).read_text(encoding="utf-8"))
            relative = Path(meta["manifest"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if relative.is_absolute() or ".." in relative.parts:
            return None
        return Snapshot(digest, folder, folder / _FILES / relative, manifest)

    def store(self, package: PackageFiles, manifest: Path, agent_id: str) -> Snapshot:
        """Copy ``package`` in (once per digest: an unchanged package costs no copy) and return it.

        Copied to a temporary folder and renamed into place, so a crash never leaves half a snapshot
        under its digest. The index is not written here: :meth:`keep` does, once per scan.
        """
        digest = package.digest
        folder = self.root / digest
        if not (folder / _META).exists():
            self.root.mkdir(mode=0o711, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".taking-", dir=self.root))
            try:
                os.chmod(staging, 0o755)
                for relative, real, mode, sha in package.files:
                    target = staging / _FILES / relative
                    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                    shutil.copyfile(real, target)
                    os.chmod(target, mode)
                    if self.hashes.of(target, os.stat(target)) != sha:
                        raise OSError(f"{real} changed while it was copied")
                (staging / _META).write_text(json.dumps(
                    {"manifest": package.manifest, "source": str(manifest), "agent": agent_id}))
                os.chmod(staging / _META, 0o600)
                if not (staging / _FILES).exists():
                    (staging / _FILES).mkdir(mode=0o755)
                os.rename(staging, folder)
                fsync_dir(self.root)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        return Snapshot(digest, folder, folder / _FILES / package.manifest, manifest)

    def keep(self, snapshots: dict[Path, str]) -> None:
        """Make ``snapshots`` (manifest -> digest) the index, durably, and remove every snapshot it no longer names."""
        index = {str(path): digest for path, digest in sorted(snapshots.items())}
        if index != self._read_index() or not (self.root / _INDEX).exists():
            self.root.mkdir(mode=0o711, exist_ok=True)
            replace_file(self.root / _INDEX, json.dumps(index, indent=1).encode())
            self._index = index
        wanted = set(index.values())
        for entry in os.scandir(self.root):
            if entry.is_dir(follow_symlinks=False) and entry.name not in wanted:
                shutil.rmtree(entry.path, ignore_errors=True)
