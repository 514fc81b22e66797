"""Fixtures shared by every test area.

Tests use real processes, files and sockets. A tool a test needs (node,
cargo) is skipped only on a developer machine that lacks it; under CI
(env CI set) a missing tool is a failure, never a silent skip.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from covenant.home import Home
from tests.fakes import FakeModelServer

REPO_ROOT = Path(__file__).resolve().parent.parent


# A suite started in the background of a non-interactive shell (`make test &`, nohup) inherits SIGINT
# ignored, and an ignored signal stays ignored across exec: every `covenant` the tests start would then
# ignore the Ctrl-C the tests send it. A handler of our own is reset to the default at exec instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
EXAMPLES_DIR = REPO_ROOT / "agents.d"


def rune_examples() -> Path:
    """shared/corpus/rune-examples beside the clone (CI) or beside the worktrees folder (a developer's worktree)."""
    for shared in (REPO_ROOT.parent / "shared", REPO_ROOT.parent.parent / "shared"):
        corpus = shared / "corpus" / "rune-examples"
        if corpus.is_dir():
            return corpus
    if os.environ.get("CI"):
        pytest.fail("shared/corpus/rune-examples is missing beside the checkout, and CI must run every test")
    pytest.skip("shared/corpus/rune-examples is not beside this checkout")


def require_tool(name: str) -> str:
    """Absolute path of ``name``; skip locally, fail under CI, when it is missing."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed"
        if os.environ.get("CI"):
            pytest.fail(f"{message}, and CI must run every test")
        pytest.skip(message)
    return path


_uids_taken = 0
"""How many uids of this process's block :func:`agent_uid_range` has given out (ranges of any width follow
each other: a count of ranges times the width would make a narrow range land inside an earlier wide one)."""
_UIDS_PER_BLOCK = 10_000_000
_FIRST_TEST_UID = 100_000_000
_BLOCKS = 200
_block_lease: list[tuple[int, int]] = []  # (block, its lock fd), once per test process


def _uid_block() -> int:
    """A block of ten million uids above 100,000,000 that no other test process on this host uses: the
    first one whose lease file this process can flock (held until it exits), so that two test runs at
    once (a developer's and a helper's) never share uids either."""
    if not _block_lease:
        leases = Path(tempfile.gettempdir()) / "covenant-test-uid-blocks"
        leases.mkdir(mode=0o700, exist_ok=True)
        for block in range(_BLOCKS):
            fd = os.open(leases / f"{block}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _block_lease.append((block, fd))
            break
        else:
            raise RuntimeError(f"all {_BLOCKS} uid blocks of {leases} are leased by running test processes")
    return _block_lease[0][0]


def process_slot() -> int:
    """A number (0-199) no other test process on this host holds now: the uid block this process
    leased. For anything else host-wide a test names (a network namespace, an address block)."""
    return _uid_block()


def agent_uid_range(width: int = 1000) -> tuple[int, int]:
    """A range of agent uids no other test on this host uses (``[isolation] uid_range``).

    A daemon, or ``covenant run``, sweeps every process of an agent uid when its last run ends and of
    its whole range when it starts, and agent uids are held host-wide (/run/covenant-uids): two homes on
    one uid would kill each other's agents or find none free. So every home a test runs agents in takes
    a range of its own: each test process (a pytest-xdist worker) leases a block of ten million uids
    above 100,000,000 (well away from the default 61184-65519 and from real accounts), and each call
    takes the next ``width`` of it.
    """
    global _uids_taken
    low = _FIRST_TEST_UID + _uid_block() * _UIDS_PER_BLOCK + _uids_taken
    _uids_taken += width
    assert low + width <= _FIRST_TEST_UID + (_uid_block() + 1) * _UIDS_PER_BLOCK, "this process's uid block is used up"
    return low, low + width - 1


def isolation_table(uid_range: tuple[int, int]) -> str:
    """The ``[isolation]`` table of covenant.toml that gives agents ``uid_range``."""
    return f"[isolation]\nuid_range = [{uid_range[0]}, {uid_range[1]}]\n"


def traversable_tmpdir(prefix: str = "covenant-test-") -> Path:
    """A fresh dir under /tmp that other uids may traverse (0711), unlike pytest's 0700 tmp_path.

    A daemon running as root starts agents as unprivileged uids
    (docs/security.md); they must reach the home's agents/ and their scratch
    dir, so homes used by daemons and runners live here. The caller removes it.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o711)
    return path


@pytest.fixture
def agent_reachable_dir() -> Iterator[Path]:
    """A :func:`traversable_tmpdir`, removed after the test."""
    path = traversable_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def home(tmp_path: Path, agent_reachable_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Home:
    """A throwaway COVENANT_HOME (agent uids can traverse to it) and XDG_CONFIG_HOME, set in the environment."""
    root = agent_reachable_dir / "home"
    root.mkdir()
    monkeypatch.setenv("COVENANT_HOME", str(root))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("COVENANT_SOCKET", raising=False)
    return Home(root)


@pytest.fixture(scope="session")
def built_examples() -> Path:
    """agents.d with the rust example built (cargo build once per session when the binary is missing)."""
    binary = EXAMPLES_DIR / "search-rs" / "target" / "release" / "search-rs"
    if not binary.exists():
        cargo = require_tool("cargo")
        subprocess.run(
            [cargo, "build", "--quiet", "--release", "--manifest-path", str(EXAMPLES_DIR / "search-rs" / "Cargo.toml")],
            check=True,
            timeout=600,
        )
    return EXAMPLES_DIR


@pytest.fixture
def fake_model_factory() -> Iterator[Callable[..., FakeModelServer]]:
    """Start as many scripted fake model servers as a test needs (e.g. two providers for fallback).

    Each is closed at teardown; a request that found no scripted reply and no default fails the test.
    """
    started: list[FakeModelServer] = []

    def start(**kwargs: object) -> FakeModelServer:
        fake = FakeModelServer(**kwargs).start()  # type: ignore[arg-type]
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.close()
    unscripted = [f"{r.method} {r.path}" for fake in started for r in fake.unscripted]
    if unscripted:
        pytest.fail(f"the fake model server got requests it had no scripted reply for: {unscripted}")


@pytest.fixture
def fake_model(fake_model_factory: Callable[..., FakeModelServer]) -> FakeModelServer:
    """One scripted fake OpenAI/Anthropic server on 127.0.0.1 (see tests/fakes/model_server.py)."""
    return fake_model_factory()


_LOG_TAIL_CHARS = 6000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report carries the tail of each daemon log its fixtures hold (a daemon, or a set-up with
    a ``daemon``), since CI keeps no temp files: the reason a daemon exited 1 is only in its log."""
    report = yield
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            daemon = value if hasattr(value, "log_path") else getattr(value, "daemon", None)
            log_path = getattr(daemon, "log_path", None)
            if isinstance(log_path, Path) and log_path.is_file():
                with log_path.open("rb") as log:  # its tail only: a flood test's log may be large
                    log.seek(max(0, log_path.stat().st_size - 4 * _LOG_TAIL_CHARS))
                    text = log.read().decode(errors="replace")
                report.sections.append((f"daemon log of {name} ({report.when}, last {_LOG_TAIL_CHARS} chars)",
                                        text[-_LOG_TAIL_CHARS:]))
    return report
