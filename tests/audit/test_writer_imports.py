"""What the audit writer process leaves out (issue 38): it runs beside the daemon for the daemon's
whole life, so every module it loads is resident memory held twice. A real writer, started with
``-X importtime``, opens a log, ends a torn dispatch-record line (its one warning, which reaches the
daemon's log with the writer's pid) and writes: none of these modules may be imported on the way,
however lazily.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant.audit.record_files import PREFIX, SUFFIX
from covenant.audit.verify import verify_log
from covenant.audit.writer import WRITER_COMMAND, AuditLog
from covenant.config import AuditConfig

# logging brings traceback, linecache, tokenize and string; dataclasses brings inspect, ast and dis;
# tempfile brings shutil, random, bz2 and lzma; secrets brings random (docs/performance.md, "Memory (issue 38)").
WRITER_LEAVES_OUT = frozenset({"logging", "dataclasses", "inspect", "ast", "tempfile", "shutil", "secrets", "random"})
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.MULTILINE)


async def test_the_writer_process_imports_only_what_it_uses(
    tmp_path: Path, key: Ed25519PrivateKey, capfd: pytest.CaptureFixture[str]
) -> None:
    dispatches = tmp_path / "dispatches"
    dispatches.mkdir()
    torn = dispatches / f"{PREFIX}{datetime.now(timezone.utc):%Y%m%d}-0000{SUFFIX}"
    torn.write_bytes(b'{"intent_id": "cut short')
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger("covenant").addHandler(handler)
    timed = (WRITER_COMMAND[0], "-X", "importtime", *WRITER_COMMAND[1:])
    try:
        async with AuditLog.open(tmp_path / "log", key, AuditConfig(), writer=timed, dispatches=dispatches) as log:
            [writer_pid] = log.process_ids
            await log.record_many([("agent.exited", {"n": 1})], dispatch_record=b'{"intent_id": "next"}\n')
    finally:
        logging.getLogger("covenant").removeHandler(handler)
    imported = set(_IMPORTED.findall(capfd.readouterr().err))
    # The writer ran and was timed (it runs as __main__): what it does use is in the list.
    assert {"covenant.audit.record_files", "covenant.audit.store", "hashlib", "json"} <= imported
    assert not imported & WRITER_LEAVES_OUT, f"the audit writer process imported {sorted(imported & WRITER_LEAVES_OUT)}"
    # Without logging it still reports the torn line, and the daemon logs it with the writer's pid.
    [line] = [r for r in seen if r.getMessage() == "torn dispatch record at end of file; closing it"]
    assert (line.name, line.levelno, line.writer_pid) == ("covenant.runtime", logging.WARNING, writer_pid)  # type: ignore[attr-defined]
    assert line.path == str(torn) and line.offset == 24  # type: ignore[attr-defined]
    assert torn.read_bytes() == b'{"intent_id": "cut short\n{"intent_id": "next"}\n'
    assert verify_log(tmp_path / "log", key.public_key()).ok
