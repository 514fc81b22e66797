from tests.daemon.conftest import daemon  # noqa: F401  (the real-daemon fixture)
