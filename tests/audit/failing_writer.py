"""The real audit writer process, whose fdatasync fails with EIO while a flag file exists.

Started by the writer tests as ``AuditLog.open(..., writer=[python, this file, flag])``:
the OS boundary is replaced, nothing else.
"""

from __future__ import annotations

import errno
import os
import sys

from covenant.audit.writer_process import main

FLAG = sys.argv.pop(1)


def failing_fdatasync(fd: int) -> None:
    if os.path.exists(FLAG):
        raise OSError(errno.EIO, "Input/output error")
    os.fdatasync(fd)


if __name__ == "__main__":
    sys.exit(main(fsync=failing_fdatasync))
