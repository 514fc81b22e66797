"""The ``covenant`` command: a click-free fast path for ``dispatch``, else a lazy click group.

Subcommands are imported only when invoked, so ``covenant dispatch`` never
pays for trio, pydantic, psutil or yaml (issue 6's latency budget). A plain
``covenant [--home DIR] dispatch TEXT [options]`` does not even import click
(~30 ms): :func:`main` recognises it with :func:`covenant.cli.dispatch_args.parse_fast`
and runs it directly; everything else (help, usage errors, other commands) goes
through the click group :data:`covenant.cli.group.cli` (the command -> module table lives
there).

The fast path imports with the cyclic garbage collector off: the modules it loads allocate
enough objects to set off several full collections that find nothing to free (about 6 % of
the process's instructions, issue 38). What was imported is then frozen out of the
collector's sight and collection turned back on, so the rest of the dispatch (a stream may
run for minutes) is collected as usual.
"""

from __future__ import annotations

import gc
import os
import sys

__all__ = ["main"]


def main() -> None:
    if "dispatch" in sys.argv[1:4]:  # `[--home DIR] dispatch ...`: other commands skip the fast parser
        gc.disable()
        try:
            from covenant.cli.dispatch_args import parse_fast

            fast = parse_fast(sys.argv[1:], os.environ)
            if fast is not None:
                from covenant.cli.dispatch_run import run_fast
        finally:
            gc.freeze()
            gc.enable()
        if fast is not None:
            run_fast(fast)
    from covenant.cli.group import cli

    cli(prog_name="covenant")
