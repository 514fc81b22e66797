"""The daemon's ``file:PATH`` log target (:mod:`covenant.logs` opens it).

A module of its own so that ``logging.handlers``, which it builds on, is loaded only by a daemon
that logs to a file: under systemd or on a terminal the daemon never needs it (issue 38).
"""

from __future__ import annotations

import errno
import logging.handlers
import os
import stat
from typing import IO

__all__ = ["PrivateLogFile"]


class PrivateLogFile(logging.handlers.WatchedFileHandler):
    """A ``file:PATH`` log target that only the daemon's uid may read: 0600, or 0640 when the file's group is the
    daemon's own (its operators'). The log holds every agent's stderr (an agent's ``DB_PASSWORD=…`` among it)
    and every issuer's intents; at the umask's 0644 any agent uid could read another's.

    Applied at every open, the reopen after logrotate moved the file included; a file the daemon does not own
    and that others may read is refused (fail closed), never written to.
    """

    def _open(self) -> IO[str]:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            st = os.fstat(fd)
            wanted = 0o640 if st.st_gid == os.getegid() else 0o600
            if stat.S_IMODE(st.st_mode) & ~wanted:
                if st.st_uid != os.geteuid():
                    raise PermissionError(errno.EPERM, f"it is mode {stat.S_IMODE(st.st_mode):04o} and uid "
                                                       f"{st.st_uid}'s: others may read it")
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & wanted)
            return os.fdopen(fd, self.mode, encoding=self.encoding, errors=self.errors)
        except BaseException:
            os.close(fd)
            raise
