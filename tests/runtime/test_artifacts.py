"""The artifact store on real files: what it keeps, what it refuses, and a changed file never handed out."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from covenant.runtime.artifacts import ArtifactLimits, ArtifactRefused, ArtifactStore

LIMITS = ArtifactLimits(max_files=3, max_file_bytes=1000, max_intent_bytes=1500)


def test_it_keeps_files_per_intent_with_their_sha256_and_daemon_only_modes(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    first = store.save("intent-1", "report", "text/markdown", b"# Hi\n", LIMITS)
    assert first == {"name": "report.md", "media_type": "text/markdown", "bytes": 5,
                     "sha256": hashlib.sha256(b"# Hi\n").hexdigest()}
    again = store.save("intent-1", "report.md", "text/markdown", b"# Again\n", LIMITS)
    assert again["name"] == "report-2.md"  # a taken name is never overwritten
    assert store.save("intent-2", "shot.png", "image/png", b"\x89PNG\r\n\x1a\n", LIMITS)["name"] == "shot.png"
    assert [e["name"] for e in store.list("intent-1")] == ["report.md", "report-2.md"]
    assert store.read("intent-1", "report.md") == (first, b"# Hi\n")
    assert store.read("intent-1", "shot.png") is None and store.read("nothing-here", "x.md") is None
    assert store.list("nothing-here") == []
    for path in (tmp_path / "artifacts", tmp_path / "artifacts" / "intent-1", tmp_path / "artifacts" / "intent-1" / "files"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "artifacts" / "intent-1" / "files" / "report.md").stat().st_mode) == 0o600


@pytest.mark.parametrize(("name", "media_type", "data", "words"), [
    ("../escape", "text/plain", b"x", "artifact name"),
    (".hidden", "text/plain", b"x", "artifact name"),
    ("a/b", "text/plain", b"x", "artifact name"),
    ("x" * 101, "text/plain", b"x", "artifact name"),
    ("ok", "application/x-sh", b"x", "media type"),
    ("big", "text/plain", b"x" * 1001, "max_file_kb"),
])
def test_bad_names_types_and_sizes_are_refused_and_nothing_is_written(
    tmp_path: Path, name: str, media_type: str, data: bytes, words: str
) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    with pytest.raises(ArtifactRefused) as refused:
        store.save("intent-1", name, media_type, data, LIMITS)
    assert words in str(refused.value)
    assert not (tmp_path / "artifacts").exists()
    with pytest.raises(ArtifactRefused):
        store.save("../intent", "ok", "text/plain", b"x", LIMITS)  # an intent id is checked as well


def test_the_intent_caps_hold_for_count_and_total_bytes(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.save("i", "a", "text/plain", b"x" * 900, LIMITS)
    with pytest.raises(ArtifactRefused, match="max_intent_kb"):
        store.save("i", "b", "text/plain", b"x" * 700, LIMITS)
    store.save("i", "b", "text/plain", b"x", LIMITS)
    store.save("i", "c", "text/plain", b"x", LIMITS)
    with pytest.raises(ArtifactRefused, match="max_files"):
        store.save("i", "d", "text/plain", b"x", LIMITS)
    assert [e["name"] for e in store.list("i")] == ["a.txt", "b.txt", "c.txt"]


def test_a_changed_file_or_a_hostile_index_is_never_handed_out(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.save("i", "page.html", "text/html", b"<p>hi</p>", LIMITS)
    (tmp_path / "i" / "files" / "page.html").write_bytes(b"<script>evil()</script>")
    with pytest.raises(ArtifactRefused, match="does not match its sha256"):
        store.read("i", "page.html")
    os.unlink(tmp_path / "i" / "files" / "page.html")
    os.symlink("/etc/passwd", tmp_path / "i" / "files" / "page.html")
    with pytest.raises(OSError):  # never followed
        store.read("i", "page.html")
    (tmp_path / "i" / "index.json").write_text(json.dumps([{"name": "../../etc/passwd", "media_type": "text/plain",
                                                            "bytes": 1, "sha256": "0" * 64}]))
    with pytest.raises(ArtifactRefused, match="index.json"):
        store.list("i")
    (tmp_path / "i" / "index.json").write_text("{not json")
    with pytest.raises(ArtifactRefused, match="not JSON"):
        store.save("i", "more", "text/plain", b"x", LIMITS)
