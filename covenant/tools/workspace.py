"""An agent's workspace as the file tools see it: every path opened beneath it by the kernel.

The daemon (root) does the I/O itself rather than in a helper process
running as the agent's uid: a helper costs a spawn (milliseconds) per call,
in-process I/O tens of microseconds. What a helper would give for free is
made explicit here instead (docs/tools.md, "Confinement"):

- every path is resolved by :func:`~covenant.tools.beneath.open_beneath`
  (``openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)``), so ``..``,
  absolute paths, symlinks out and ``/proc/self/root`` fail in the open;
- an opened file is used only if it is a regular file with one link and,
  when agents run as their own uid, owned by that uid: a hard link the agent
  made to a file it cannot read (or to another agent's) never lends it the
  daemon's rights;
- what the daemon creates (files, parent directories) is ``fchown``-ed to
  the agent's uid on the fd it created, mode 0600/0700;
- an existing file is opened without ``O_TRUNC`` and truncated only after
  those checks passed.

All methods block: call them through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import base64
import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from covenant.config import FilesToolConfig
from covenant.runtime.launcher import AgentCredentials
from covenant.tools.beneath import Escape, open_beneath, split_relative
from covenant.tools.patch import PatchError, apply_hunks, parse_patch
from covenant.tools.result import ToolError

__all__ = ["Workspace"]

_FILE_FLAGS = os.O_NONBLOCK | os.O_NOCTTY
"""A FIFO or device never blocks the open; the type check refuses it right after."""


def _as_tool_error(path: str, exc: OSError) -> ToolError:
    if exc.errno == errno.ENOENT:
        return ToolError("file_not_found", f"{path!r}: no such file or directory in the workspace")
    if exc.errno in (errno.EISDIR, errno.ENOTDIR, errno.ENXIO):
        return ToolError("wrong_file_type", f"{path!r}: {exc.strerror}")
    return ToolError("tool_failed", f"{path!r}: {exc.strerror}")


def _text_or_base64(data: bytes, cut: bool) -> tuple[str, str]:
    """(content, encoding): UTF-8 text when it decodes (a character cut at the end is left out), else base64."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError as exc:
        if cut and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
            try:
                return data[: exc.start].decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                pass
    return base64.b64encode(data).decode("ascii"), "base64"


class Workspace:
    """``<home>/state/workspaces/<agent id>/`` of one agent, for one tool call."""

    def __init__(self, root: Path, creds: AgentCredentials | None, limits: FilesToolConfig) -> None:
        self.root = root
        self.creds = creds
        """The agent's uid/gid; None when agents run as covenant's own uid (no owner check then)."""
        self.limits = limits

    @contextmanager
    def _root_fd(self) -> Iterator[int]:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _open(self, dirfd: int, path: str, flags: int, *, shown: str | None = None) -> Iterator[int]:
        shown = path if shown is None else shown
        try:
            fd = open_beneath(dirfd, path, flags)
        except Escape as exc:
            raise ToolError("path_refused", str(exc)) from None
        except OSError as exc:
            raise _as_tool_error(shown, exc) from None
        try:
            yield fd
        finally:
            os.close(fd)

    def _check_owner(self, st: os.stat_result, path: str) -> None:
        if self.creds is not None and st.st_uid != self.creds.uid:
            raise ToolError("path_refused", f"{path!r} is not owned by this agent's uid, so it is not used for it")

    def _check_file(self, fd: int, path: str) -> os.stat_result:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError("wrong_file_type", f"{path!r} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError("wrong_file_type", f"{path!r} is not a regular file")
        if st.st_nlink != 1:
            raise ToolError("path_refused", f"{path!r} has {st.st_nlink} hard links; hard-linked files are refused")
        self._check_owner(st, path)
        return st

    def _check_dir(self, fd: int, path: str) -> None:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise ToolError("wrong_file_type", f"{path!r} is not a directory")
        self._check_owner(st, path)

    # -- file-read ----------------------------------------------------------------------------

    def read(self, path: str, offset: int = 0, length: int | None = None) -> dict[str, Any]:
        """Up to ``length`` (at most ``read_max_bytes``) bytes of the file from ``offset``."""
        want = min(length if length is not None else self.limits.read_max_bytes, self.limits.read_max_bytes)
        with self._root_fd() as root, self._open(root, path, os.O_RDONLY | _FILE_FLAGS) as fd:
            st = self._check_file(fd, path)
            data = os.pread(fd, want, offset)
        cut = offset + len(data) < st.st_size
        content, encoding = _text_or_base64(data, cut)
        returned = len(content.encode()) if encoding == "utf-8" else len(data)
        return {
            "path": path,
            "size": st.st_size,
            "offset": offset,
            "bytes": returned,
            "encoding": encoding,
            "content": content,
            "truncated": offset + returned < st.st_size,
        }

    def read_all(self, root: int, path: str) -> str:
        """The whole file as UTF-8 text (apply-patch), refusing more than ``write_max_bytes``."""
        with self._open(root, path, os.O_RDONLY | _FILE_FLAGS) as fd:
            st = self._check_file(fd, path)
            if st.st_size > self.limits.write_max_bytes:
                raise ToolError("file_too_large", f"{path!r} is {st.st_size} bytes, over [tools.files] write_max_bytes")
            data = os.pread(fd, self.limits.write_max_bytes + 1, 0)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError("patch_failed", f"{path!r} is not UTF-8 text; patches apply to text files only") from None

    def read_bytes(self, path: str, max_bytes: int, setting: str) -> bytes:
        """The whole file (a media tool's input), refusing one over ``max_bytes`` (named as ``setting``)."""
        with self._root_fd() as root, self._open(root, path, os.O_RDONLY | _FILE_FLAGS) as fd:
            st = self._check_file(fd, path)
            if st.st_size > max_bytes:
                raise ToolError("file_too_large", f"{path!r} is {st.st_size} bytes, more than {setting} ({max_bytes})")
            data = os.pread(fd, max_bytes + 1, 0)
        if len(data) > max_bytes:  # grew since the check
            raise ToolError("file_too_large", f"{path!r} is more than {setting} ({max_bytes}) bytes")
        return data

    # -- file-write ---------------------------------------------------------------------------

    def _parent(self, root: int, parts: list[str], path: str) -> int:
        """An fd of the directory ``parts`` beneath ``root``, made (0700, the agent's) where missing."""
        cur = os.dup(root)
        try:
            for name in parts:
                flags = os.O_RDONLY | os.O_DIRECTORY
                try:
                    nxt = open_beneath(cur, name, flags)
                except FileNotFoundError:
                    try:
                        os.mkdir(name, 0o700, dir_fd=cur)
                    except FileExistsError:
                        pass
                    nxt = open_beneath(cur, name, flags)
                    st = os.fstat(nxt)
                    if self.creds is not None and st.st_uid == os.geteuid():
                        os.fchown(nxt, self.creds.uid, self.creds.gid)
                os.close(cur)
                cur = nxt
                self._check_dir(cur, path)
            return cur
        except Escape as exc:
            os.close(cur)
            raise ToolError("path_refused", str(exc)) from None
        except OSError as exc:
            os.close(cur)
            raise _as_tool_error(path, exc) from None
        except BaseException:
            os.close(cur)
            raise

    def _write_at(self, root: int, path: str, data: bytes, cap: tuple[int, str] | None = None) -> bool:
        """Write ``data`` as the whole file; True when it was created. ``cap``: (most bytes, the setting's name),
        by default ``[tools.files] write_max_bytes``."""
        most, setting = cap or (self.limits.write_max_bytes, "[tools.files] write_max_bytes")
        if len(data) > most:
            raise ToolError("file_too_large", f"{len(data)} bytes to write to {path!r}, over {setting} = {most}")
        try:
            parts = split_relative(path)
        except Escape as exc:
            raise ToolError("path_refused", str(exc)) from None
        if not parts:
            raise ToolError("wrong_file_type", "the path names the workspace itself, not a file in it")
        parent = self._parent(root, parts[:-1], path)
        try:
            name = parts[-1]
            created = True
            try:
                fd = open_beneath(parent, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o600)
            except FileExistsError:
                created = False
                fd = open_beneath(parent, name, os.O_WRONLY | _FILE_FLAGS)
        except Escape as exc:
            raise ToolError("path_refused", str(exc)) from None
        except OSError as exc:
            raise _as_tool_error(path, exc) from None
        finally:
            os.close(parent)
        try:
            if created:
                if self.creds is not None:
                    os.fchown(fd, self.creds.uid, self.creds.gid)
            else:
                self._check_file(fd, path)
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            raise _as_tool_error(path, exc) from None
        finally:
            os.close(fd)
        return created

    def write(self, path: str, content: str) -> dict[str, Any]:
        data = content.encode("utf-8", "surrogatepass")
        with self._root_fd() as root:
            created = self._write_at(root, path, data)
        return {"path": path, "bytes": len(data), "created": created}

    def write_bytes(self, path: str, data: bytes, max_bytes: int, setting: str) -> bool:
        """Write ``data`` as the whole file (a media tool's output, the agent's); True when it was created."""
        with self._root_fd() as root:
            return self._write_at(root, path, data, (max_bytes, setting))

    # -- file-list ----------------------------------------------------------------------------

    def list(self, path: str = "") -> dict[str, Any]:
        """The directory's entries (name, type, size of files), sorted by name, at most ``list_max_entries``."""
        shown = path or "."
        entries: list[dict[str, Any]] = []
        total = 0
        with self._root_fd() as root, self._open(root, path, os.O_RDONLY | os.O_DIRECTORY, shown=shown) as fd:
            self._check_dir(fd, shown)
            with os.scandir(fd) as scan:
                found = sorted(scan, key=lambda e: e.name)
            for entry in found:
                total += 1
                if len(entries) >= self.limits.list_max_entries:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile
                kind = (
                    "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode)
                    else "symlink" if stat.S_ISLNK(st.st_mode) else "other"
                )
                item: dict[str, Any] = {"name": entry.name, "type": kind}
                if kind == "file":
                    item["size"] = st.st_size
                entries.append(item)
        return {"path": shown, "entries": entries, "count": total, "truncated": total > len(entries)}

    # -- apply-patch --------------------------------------------------------------------------

    def apply_patch(self, patch: str) -> dict[str, Any]:
        """Apply a unified diff: every hunk is checked against the current files before the first write."""
        try:
            files = parse_patch(patch)
        except PatchError as exc:
            raise ToolError("patch_failed", str(exc)) from None
        results: list[dict[str, Any]] = []
        with self._root_fd() as root:
            planned: list[tuple[str, str | None, str]] = []
            for file in files:
                try:
                    original = "" if file.old is None else self.read_all(root, file.old)
                    if file.old is None and self._exists(root, file.path):
                        raise PatchError(f"{file.path}: the patch creates it, but it already exists")
                    updated = apply_hunks(original, file)
                except PatchError as exc:
                    raise ToolError("patch_failed", str(exc)) from None
                if file.new is not None and file.old is not None and file.new != file.old:
                    raise ToolError("patch_failed", f"{file.old} -> {file.new}: renames are not supported")
                action = "created" if file.old is None else "deleted" if file.new is None else "modified"
                planned.append((file.old or file.path, None if file.new is None else updated, action))
                results.append({"path": file.path, "action": action, "hunks": len(file.hunks)})
            for path, updated, _action in planned:
                if updated is None:
                    self._delete(root, path)
                else:
                    self._write_at(root, path, updated.encode("utf-8", "surrogatepass"))
        return {"files": results}

    def _exists(self, root: int, path: str) -> bool:
        try:
            fd = open_beneath(root, path, os.O_PATH)
        except (OSError, Escape):
            return False
        os.close(fd)
        return True

    def _delete(self, root: int, path: str) -> None:
        parts = split_relative(path)
        with self._open(root, path, os.O_RDONLY | _FILE_FLAGS) as fd:
            self._check_file(fd, path)
        with self._open(root, "/".join(parts[:-1]), os.O_RDONLY | os.O_DIRECTORY) as parent:
            try:
                os.unlink(parts[-1], dir_fd=parent)
            except OSError as exc:
                raise _as_tool_error(path, exc) from None
