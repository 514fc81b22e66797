"""Instructions per Rune dispatch in the daemon: counted under callgrind, not timed.

The 100-sessions figure of ``rune_replica.py`` is bounded by the daemon's one event loop: 100
dispatches at once each cost it a few ms of CPU, which a round spends in turn. Its CPU-time figure
moves by ±5–10 % on a shared 2-core box; instructions do not. So this bench starts the daemon of
``rune_replica.py``'s set-up (one Rune agent whose provider is the fake model server, here answering
at once) under ``valgrind --tool=callgrind`` (the daemon only: not its replicas nor its audit
writer), dispatches ``--warm`` intents, zeroes the counters, dispatches ``--dispatches`` more one
after the other, each in a session of its own as in the 100-sessions bench, dumps, and prints the
daemon's user-space instructions per Rune dispatch. ``--base PATH`` counts another checkout first
(a ``git worktree`` of the old commit; its replicas run that checkout too) and prints the ratio.

Needs valgrind 3.20 or newer (see ``dispatch_instructions.py`` for building it)::

    .venv/bin/python bench/rune_instructions.py [--valgrind /opt/valgrind/bin/valgrind]
        [--dispatches 100] [--warm 20] [--base PATH]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dispatch_instructions import control, valgrind_version  # noqa: E402
from rune_replica import BenchDaemon, fake_model  # noqa: E402


def count(valgrind: str, checkout: Path | None, dispatches: int, warm: int) -> float:
    """The daemon's instructions per Rune dispatch, for this checkout or ``checkout``."""
    fake, port = fake_model(0.0)
    out = Path(tempfile.mkdtemp(prefix="rune-instr-"))
    prefix = (valgrind, "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p", "--trace-children=no")
    daemon = None
    try:
        daemon = BenchDaemon(port, concurrency=4, checkout=checkout, prefix=prefix, start_timeout_s=600)
        for n in range(warm):  # starts the replica; the first dispatches' one-off paths
            if (answer := daemon.dispatch(f"warm-{n}")) != "ok":
                raise SystemExit(f"warm-up dispatch: {answer}")
        control(valgrind, "-z", daemon.env)
        for n in range(dispatches):
            if (answer := daemon.dispatch(f"counted-{n}")) != "ok":
                raise SystemExit(f"dispatch {n}: {answer}")
        control(valgrind, "-d", daemon.env)
        dumps = sorted(out.glob("cg.*.1"))
        if len(dumps) != 1:
            raise SystemExit(f"expected one dump of the daemon in {out}, found {[d.name for d in dumps]}")
        total = re.search(r"^summary: (\d+)$", dumps[0].read_text(errors="replace"), re.M)
        if total is None:
            raise SystemExit(f"{dumps[0]}: not a callgrind dump")
        return int(total.group(1)) / dispatches
    finally:
        if daemon is not None:
            daemon.close()
        fake.kill()
        fake.wait()
        shutil.rmtree(out, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--valgrind", default=shutil.which("valgrind") or "valgrind", help="valgrind ≥ 3.20")
    parser.add_argument("--dispatches", type=int, default=100, help="sequential Rune dispatches counted")
    parser.add_argument("--warm", type=int, default=20, help="dispatches before the counters are zeroed")
    parser.add_argument("--base", help="another checkout to count first (e.g. a git worktree of the old commit)")
    args = parser.parse_args()
    if valgrind_version(args.valgrind) < (3, 20):
        raise SystemExit(f"{args.valgrind} is older than 3.20, which has no pidfd_open: see dispatch_instructions.py")
    if args.base and not (Path(args.base) / "covenant" / "__init__.py").is_file():
        raise SystemExit(f"--base {args.base}: no covenant package there (make one with `git worktree add PATH REV`)")
    sides: list[tuple[str, Path | None]] = [("base", Path(os.path.abspath(args.base)))] if args.base else []
    # With a base, this checkout's replicas run from this checkout too, as in rune_replica.py.
    sides.append(("this", Path(__file__).resolve().parent.parent if args.base else None))
    counted = {name: count(args.valgrind, checkout, args.dispatches, args.warm) for name, checkout in sides}
    print(f"Rune agent on a fake model answering at once, {args.dispatches} sequential dispatches (a session each) "
          f"after {args.warm}; the daemon's user-space instructions per dispatch")
    for name, per in counted.items():
        print(f"| {name} | {per / 1e6:.3f} M |")
    if args.base:
        print(f"this/base: {counted['this'] / counted['base']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
