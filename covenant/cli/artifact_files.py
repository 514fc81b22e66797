"""``covenant show ID --save DIR``: the intent's artifacts written out as files.

The bytes come from the running daemon (``GET /v1/dispatches/{id}/artifacts/{name}``: whoever may read
the record may read its artifacts), or from the home's artifact store when no daemon runs. Each file is
checked against the record's sha256 and size before it is written, its name checked again (the record is
data, not a path), and an existing file is never overwritten.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path
from urllib.parse import quote

from covenant.cli._common import ask_daemon, echo, fail
from covenant.client import RemoteError
from covenant.home import Home
from covenant.runtime.artifacts import ArtifactRefused, ArtifactStore, artifact_name_problem
from covenant.runtime.outcome import DispatchRecord

__all__ = ["save_artifacts"]


def _fetch(home: Home, intent_id: str, name: str) -> bytes:
    try:
        answer = ask_daemon(home, f"/v1/dispatches/{quote(intent_id, safe='')}/artifacts/{quote(name, safe='')}")
    except RemoteError as exc:
        fail(f"artifact {name}: {exc.message} ({exc.code})", 1)
    if answer is not None:
        try:
            return base64.b64decode(answer["content_base64"], validate=True)
        except (KeyError, TypeError, binascii.Error, ValueError):
            fail(f"the daemon's answer for artifact {name} holds no base64 content", 1)
    try:
        found = ArtifactStore(home.state_dir / "artifacts").read(intent_id, name)
    except (ArtifactRefused, PermissionError) as exc:
        fail(f"artifact {name}: {exc}", 1)
    if found is None:
        fail(f"artifact {name} of intent {intent_id} is not in {home.state_dir / 'artifacts'}", 1)
    return found[1]


def save_artifacts(home: Home, record: DispatchRecord, directory: Path, *, quiet: bool) -> None:
    """Write each of ``record.artifacts`` into ``directory`` (made if missing); exit 1 on the first failure."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"cannot make {directory}: {exc.strerror}", 1)
    for entry in record.artifacts:
        name = entry.get("name")
        if artifact_name_problem(name):
            fail(f"the record of {record.intent_id} names an artifact {str(name)[:100]!r} that is no file name", 1)
        data = _fetch(home, record.intent_id, name)
        if len(data) != entry.get("bytes") or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            fail(f"artifact {name} does not match the size and sha256 its record holds; not written", 1)
        target = directory / name
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            fail(f"{target} exists already; not overwritten (save into another directory)", 1)
        except OSError as exc:
            fail(f"cannot write {target}: {exc.strerror}", 1)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        if not quiet:
            echo(f"saved {target} ({entry.get('media_type')}, {len(data)} bytes)")
    if not record.artifacts and not quiet:
        echo(f"intent {record.intent_id} has no artifacts")
