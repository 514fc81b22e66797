"""The real audit writer process, whose fdatasync fails with EIO while a flag file exists.

Started by the writer tests as ``AuditLog.open(..., writer=[python, this file, flag])``:
the OS boundary is replaced, nothing else.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

from covenant.audit.writer_process import main


def fdatasync_failing_while(flag: str) -> Callable[[int], None]:
    def sync(fd: int) -> None:
        if os.path.exists(flag):
            raise OSError(errno.EIO, "Input/output error")
        os.fdatasync(fd)

    return sync


if __name__ == "__main__":
    flag = sys.argv.pop(1)  # the writer's own arguments follow
    sys.exit(main(fsync=fdatasync_failing_while(flag)))
