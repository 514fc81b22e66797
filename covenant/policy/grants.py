"""grants.toml: which issuer (public key) holds which capability action.

Every entry is signed by the daemon key over the canonical JSON of all its
other fields plus a domain tag, so an entry added or changed by hand, or
copied from another host, does not verify: it is ignored and reported in
``GrantSet.problems``, never honoured.

Revocation wins over grant. ``revoke`` removes the issuer's grants the
revoked action covers and records a signed ``[[revocation]]`` (issuer,
action, revoked_at). At check time a revocation masks, for every action it
covers, every grant of that issuer issued at or before ``revoked_at``: so a
grant restored from a backup stays dead, and revoking ``tool.web_fetch``
also takes it out of an earlier ``tool.*`` grant. Granting again afterwards
works because the new grant is issued later than the revocation.

The file is read with tomllib and edited with tomlkit (operators' comments
and order survive), replaced atomically under an flock.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from covenant.canonical import canonical_bytes
from covenant.keys import public_key_hex, verify_signature
from covenant.policy._files import atomic_write_text, locked
from covenant.clock import iso_ms, now_ms as _wall_ms
from covenant.actions import action_problem, grant_covers
from covenant.policy.errors import GrantError
from covenant.policy.signing import display_problem, is_signature_hex

if TYPE_CHECKING:
    import tomlkit  # imported where a file is edited: the daemon only reads grants

__all__ = [
    "GRANT_TAG",
    "REVOCATION_TAG",
    "Grant",
    "Revocation",
    "GrantProblem",
    "GrantSet",
    "GrantStore",
    "parse_duration_ms",
]

GRANT_TAG = "covenant-grant/v1"
REVOCATION_TAG = "covenant-revocation/v1"

_PUBKEY = re.compile(r"^[0-9a-f]{64}$")
_DURATION = re.compile(r"^(\d+)(s|m|h|d|w)$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 7 * 86_400_000}
_MAX_MS = 2**53 - 1

HEADER = (
    "Capability grants of this covenant home (see docs/capabilities.md).\n"
    "Every entry is signed by the daemon key (identity/daemon.key): change grants with\n"
    "`covenant grant` and `covenant revoke`. An entry edited by hand no longer verifies;\n"
    "it is ignored and reported by `covenant grants`. Your comments here are kept."
)


def parse_duration_ms(text: str) -> int:
    """``90m``, ``12h``, ``30d``, ``2w`` (also ``s``) as milliseconds; raises GrantError."""
    match = _DURATION.match(text.strip())
    if match is None or int(match[1]) == 0:
        raise GrantError(
            f"duration {text!r}: use a positive number and a unit s, m, h, d or w (e.g. 90m, 12h, 30d)",
            field="expires",
        )
    ms = int(match[1]) * _UNIT_MS[match[2]]
    if ms > _MAX_MS // 2:
        raise GrantError(f"duration {text!r} is too long; give a shorter one, or none for a grant that never "
                         "expires", field="expires")
    return ms


def _short(pubkey: str) -> str:
    return f"{pubkey[:12]}…"


@dataclass(frozen=True)
class Grant:
    """One verified grant: ``issuer`` may ``action`` until ``expires_at`` (ms, exclusive)."""

    issuer: str
    action: str
    granted_at: int
    expires_at: int | None
    display: str | None
    signature: str
    line: int | None = None

    def payload(self) -> dict[str, Any]:
        """What the daemon key signs (canonical JSON of this)."""
        return grant_payload(self.issuer, self.action, self.granted_at, self.expires_at, self.display)

    @cached_property
    def id(self) -> str:
        """Stable short id: the first 16 hex of SHA-256 over the signed payload (computed once per grant)."""
        return hashlib.sha256(canonical_bytes(self.payload())).hexdigest()[:16]

    def unexpired(self, now_ms: int) -> bool:
        return self.expires_at is None or now_ms < self.expires_at

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (ints and strings, no floats) for --json output and audit records."""
        return {
            "id": self.id,
            "issuer": self.issuer,
            "display": self.display,
            "action": self.action,
            "granted_at": self.granted_at,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True)
class Revocation:
    """Masks ``action`` (and what it covers) in the issuer's grants issued at or before ``revoked_at``."""

    issuer: str
    action: str
    revoked_at: int
    signature: str
    line: int | None = None

    def payload(self) -> dict[str, Any]:
        return revocation_payload(self.issuer, self.action, self.revoked_at)

    def masks(self, grant: Grant, action: str) -> bool:
        """True when this revocation takes ``action`` out of ``grant``."""
        return (
            self.issuer == grant.issuer
            and grant.granted_at <= self.revoked_at
            and grant_covers(self.action, action)
        )

    def to_json(self) -> dict[str, Any]:
        return {"issuer": self.issuer, "action": self.action, "revoked_at": self.revoked_at}


def grant_payload(
    issuer: str, action: str, granted_at: int, expires_at: int | None, display: str | None
) -> dict[str, Any]:
    return {
        "tag": GRANT_TAG,
        "issuer": issuer,
        "action": action,
        "granted_at": granted_at,
        "expires_at": expires_at,
        "display": display,
    }


def revocation_payload(issuer: str, action: str, revoked_at: int) -> dict[str, Any]:
    return {"tag": REVOCATION_TAG, "issuer": issuer, "action": action, "revoked_at": revoked_at}


@dataclass(frozen=True)
class GrantProblem:
    """An entry of grants.toml that is ignored, and why."""

    path: Path
    line: int | None
    entry: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else str(self.path)
        return f"{where}: {self.entry}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "line": self.line, "entry": self.entry, "message": self.message}


@dataclass
class GrantSet:
    """The verified grants and revocations of one load, plus the entries that were ignored."""

    grants: tuple[Grant, ...] = ()
    revocations: tuple[Revocation, ...] = ()
    problems: tuple[GrantProblem, ...] = ()
    _grants_by_issuer: dict[str, list[Grant]] = field(default_factory=dict, init=False, repr=False)
    _revocations_by_issuer: dict[str, list[Revocation]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for grant in self.grants:
            self._grants_by_issuer.setdefault(grant.issuer, []).append(grant)
        for revocation in self.revocations:
            self._revocations_by_issuer.setdefault(revocation.issuer, []).append(revocation)

    def revoked(self, grant: Grant, action: str) -> bool:
        """True when a revocation takes ``action`` out of ``grant``."""
        return any(r.masks(grant, action) for r in self._revocations_by_issuer.get(grant.issuer, ()))

    def covering(self, pubkey: str, action: str, now_ms: int) -> list[Grant]:
        """The grants that give ``pubkey`` the exact action ``action`` at ``now_ms``.

        This is the decision: unexpired, covering (exactly or by wildcard), and
        not masked by a later-or-equal revocation covering ``action``.
        """
        return [
            g
            for g in self._grants_by_issuer.get(pubkey, ())
            if g.unexpired(now_ms) and grant_covers(g.action, action) and not self.revoked(g, action)
        ]

    def active_grants(self, pubkey: str, now_ms: int) -> list[Grant]:
        """Unexpired grants of ``pubkey`` not wholly revoked.

        A wildcard grant listed here may still lack an action a narrower
        revocation masked; decide with :meth:`covering`, not with this list.
        """
        return [
            g
            for g in self._grants_by_issuer.get(pubkey, ())
            if g.unexpired(now_ms) and not self.revoked(g, g.action)
        ]

    def active_actions(self, pubkey: str, now_ms: int) -> set[str]:
        """The action patterns (``tool.*`` included) of :meth:`active_grants`."""
        return {g.action for g in self.active_grants(pubkey, now_ms)}

    def status(self, grant: Grant, now_ms: int) -> str:
        """``active``, ``expired`` or ``revoked`` (for listings)."""
        if self.revoked(grant, grant.action):
            return "revoked"
        return "active" if grant.unexpired(now_ms) else "expired"

    def masked_actions(self, grant: Grant) -> list[str]:
        """Narrower actions revoked out of a still-active wildcard grant (for listings)."""
        return sorted(
            r.action
            for r in self._revocations_by_issuer.get(grant.issuer, ())
            if r.action != grant.action and r.masks(grant, r.action) and grant_covers(grant.action, r.action)
        )


# -- reading ---------------------------------------------------------------------------------------

_GRANT_KEYS = {"issuer", "action", "granted_at", "signature"}
_GRANT_OPTIONAL = {"expires_at", "display"}
_REVOCATION_KEYS = {"issuer", "action", "revoked_at", "signature"}


def _header_lines(text: str, name: str) -> list[int]:
    pattern = re.compile(rf"^\s*\[\[\s*(?:{name}|\"{name}\"|'{name}')\s*\]\]")
    return [n for n, line in enumerate(text.splitlines(), start=1) if pattern.match(line)]


def _is_int(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _MAX_MS


def _field_problems(entry: dict[str, Any], required: set[str], optional: set[str]) -> list[str]:
    problems = []
    missing = sorted(required - entry.keys())
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    unknown = sorted(entry.keys() - required - optional)
    if unknown:
        problems.append(f"unknown key(s) {', '.join(unknown)}")
    issuer = entry.get("issuer")
    if "issuer" in entry and not (isinstance(issuer, str) and _PUBKEY.match(issuer)):
        problems.append("issuer must be a 64-lowercase-hex public key")
    if "action" in entry:
        problem = action_problem(entry["action"], allow_wildcard=True)
        if problem:
            problems.append(problem)
    signature = entry.get("signature")
    if "signature" in entry and not is_signature_hex(signature):
        problems.append("signature must be 128 lowercase hex characters")
    return problems


class GrantStore:
    """Reads and edits one grants.toml, verifying against one daemon public key.

    ``load`` is pure reading (run it in a thread inside the daemon); ``add``
    and ``revoke`` need the daemon's private key and rewrite the file.
    """

    def __init__(self, path: Path, daemon_public_key: Ed25519PublicKey) -> None:
        self.path = path
        self.daemon_public_key = daemon_public_key

    # reading

    def load(self) -> GrantSet:
        """Verify every entry; raise GrantError only when the file as a whole is unreadable.

        The daemon keeps its previous GrantSet when this raises (a bad file
        never widens or silently drops access).
        """
        try:
            text = self.path.read_bytes().decode("utf-8")
        except FileNotFoundError:
            return GrantSet()
        except (OSError, UnicodeDecodeError) as exc:
            raise GrantError(f"{self.path}: cannot read grants: {exc}", path=str(self.path)) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise GrantError(
                f"{self.path}: not valid TOML ({exc}); fix it, or restore it and re-run `covenant grant`",
                path=str(self.path),
            ) from None
        problems: list[GrantProblem] = []
        for key in data.keys() - {"grant", "revocation"}:
            problems.append(GrantProblem(self.path, None, f"key {key!r}", "unknown top-level key; ignored"))
        grants = self._read_entries(data, text, "grant", self._grant_from, problems)
        revocations = self._read_entries(data, text, "revocation", self._revocation_from, problems)
        return GrantSet(tuple(grants), tuple(revocations), tuple(problems))

    def _read_entries(self, data: dict[str, Any], text: str, name: str, build: Any,
                      problems: list[GrantProblem]) -> list[Any]:
        entries = data.get(name, [])
        if not isinstance(entries, list):
            problems.append(GrantProblem(self.path, None, name, f"must be an array of tables ([[{name}]]); ignored"))
            return []
        lines = _header_lines(text, name)
        if len(lines) != len(entries):
            lines = [None] * len(entries)  # written inline or oddly: no reliable line numbers
        out = []
        for index, (entry, line) in enumerate(zip(entries, lines), start=1):
            label = f"{name} #{index}"
            if not isinstance(entry, dict):
                problems.append(GrantProblem(self.path, line, label, "must be a table; ignored"))
                continue
            action, issuer = entry.get("action"), entry.get("issuer")
            if isinstance(action, str) and isinstance(issuer, str):
                label = f"{label} ({action} for {_short(issuer)})"
            item, problem = build(entry, line)
            if problem:
                problems.append(GrantProblem(self.path, line, label, problem))
            else:
                out.append(item)
        return out

    def _verify(self, payload: dict[str, Any], signature: str) -> bool:
        return verify_signature(self.daemon_public_key, bytes.fromhex(signature), canonical_bytes(payload))

    def _grant_from(self, entry: dict[str, Any], line: int | None) -> tuple[Grant | None, str | None]:
        problems = _field_problems(entry, _GRANT_KEYS, _GRANT_OPTIONAL)
        if "granted_at" in entry and not _is_int(entry["granted_at"]):
            problems.append("granted_at must be an integer (ms since the epoch)")
        if "expires_at" in entry and not _is_int(entry["expires_at"]):
            problems.append("expires_at must be an integer (ms since the epoch)")
        if "display" in entry and display_problem(entry["display"]):
            problems.append(f"display: {display_problem(entry['display'])}")
        if problems:
            return None, "; ".join(problems) + "; ignored"
        grant = Grant(
            issuer=entry["issuer"],
            action=entry["action"],
            granted_at=entry["granted_at"],
            expires_at=entry.get("expires_at"),
            display=entry.get("display"),
            signature=entry["signature"],
            line=line,
        )
        if not self._verify(grant.payload(), grant.signature):
            return None, (
                "signature does not verify against this home's daemon key (edited by hand, or copied from "
                f"another host); ignored (if it is wanted, issue it properly: "
                f"`covenant grant {grant.issuer} {grant.action}`)"
            )
        return grant, None

    def _revocation_from(self, entry: dict[str, Any], line: int | None) -> tuple[Revocation | None, str | None]:
        problems = _field_problems(entry, _REVOCATION_KEYS, set())
        if "revoked_at" in entry and not _is_int(entry["revoked_at"]):
            problems.append("revoked_at must be an integer (ms since the epoch)")
        if problems:
            return None, "; ".join(problems) + "; ignored"
        revocation = Revocation(entry["issuer"], entry["action"], entry["revoked_at"], entry["signature"], line)
        if not self._verify(revocation.payload(), revocation.signature):
            return None, "signature does not verify against this home's daemon key; ignored"
        return revocation, None

    # writing

    def _signer(self, daemon_key: Ed25519PrivateKey) -> Ed25519PrivateKey:
        if public_key_hex(daemon_key) != public_key_hex(self.daemon_public_key):
            raise GrantError(
                f"{self.path}: the key given to sign grants is not this home's daemon key; grants it signed "
                f"would never verify",
                path=str(self.path),
            )
        return daemon_key

    def _document(self) -> tomlkit.TOMLDocument:
        import tomlkit
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            doc = tomlkit.document()
            for line in HEADER.splitlines():
                doc.add(tomlkit.comment(line))
            doc.add(tomlkit.nl())
            return doc
        try:
            return tomlkit.parse(text)
        except tomlkit.exceptions.TOMLKitError as exc:
            raise GrantError(f"{self.path}: not valid TOML ({exc}); fix it before granting",
                             path=str(self.path)) from None

    def _array(self, doc: tomlkit.TOMLDocument, name: str) -> Any:
        import tomlkit
        if name not in doc:
            doc.append(name, tomlkit.aot())
        array = doc[name]
        if not isinstance(array, tomlkit.items.AoT):
            raise GrantError(
                f"{self.path}: `{name}` must be written as [[{name}]] tables to be edited; fix the file",
                path=str(self.path),
            )
        return array

    def add(
        self,
        daemon_key: Ed25519PrivateKey,
        issuer_pubkey: str,
        actions: Iterable[str],
        expires_at: int | None,
        display: str | None,
        *,
        now_ms: int | None = None,
    ) -> list[Grant]:
        """Grant ``actions`` to ``issuer_pubkey``; an existing grant for the same action is replaced in place.

        A new grant is dated after any revocation of an overlapping action, so
        granting again after ``revoke`` always takes effect.
        """
        import tomlkit
        key = self._signer(daemon_key)
        actions = _checked_actions(actions)
        issuer = _checked_issuer(issuer_pubkey)
        if display is not None and display_problem(display):
            raise GrantError(f"display {display!r}: {display_problem(display)}", field="display")
        now = _now(now_ms)
        if expires_at is not None and not (_is_int(expires_at) and expires_at > now):
            raise GrantError("expires_at must lie in the future", field="expires_at")
        with locked(self.path):
            current = self.load()
            doc = self._document()
            array = self._array(doc, "grant")
            made = []
            for action in actions:
                granted_at = now
                for r in current.revocations:
                    if r.issuer == issuer and (grant_covers(r.action, action) or grant_covers(action, r.action)):
                        granted_at = max(granted_at, r.revoked_at + 1)
                if expires_at is not None and expires_at <= granted_at:
                    raise GrantError("expires_at must lie after the grant's date", field="expires_at")
                payload = grant_payload(issuer, action, granted_at, expires_at, display)
                grant = Grant(issuer, action, granted_at, expires_at, display, key.sign(canonical_bytes(payload)).hex())
                _upsert(array, issuer, action, _grant_fields(grant))
                made.append(grant)
            atomic_write_text(self.path, tomlkit.dumps(doc).rstrip("\n") + "\n", mode=0o600)
        return made

    def revoke(
        self,
        daemon_key: Ed25519PrivateKey,
        issuer_pubkey: str,
        actions: Iterable[str],
        *,
        now_ms: int | None = None,
    ) -> list[str]:
        """Revoke ``actions`` from ``issuer_pubkey``; returns the ids of grants that lost an action.

        Grants wholly covered by a revoked action are removed from the file; a
        signed revocation is recorded (or moved forward) either way, so copies of
        the removed grants stay masked.
        """
        import tomlkit
        key = self._signer(daemon_key)
        actions = _checked_actions(actions)
        issuer = _checked_issuer(issuer_pubkey)
        with locked(self.path):
            current = self.load()
            doc = self._document()
            affected: list[str] = []
            for action in actions:
                # Date the revocation no earlier than the grants it must mask,
                # even if the clock stepped back since they were issued.
                revoked_at = _now(now_ms)
                for g in current.grants:
                    if g.issuer == issuer and (grant_covers(action, g.action) or grant_covers(g.action, action)):
                        revoked_at = max(revoked_at, g.granted_at)
                        if g.id not in affected:
                            affected.append(g.id)
                payload = revocation_payload(issuer, action, revoked_at)
                revocation = Revocation(issuer, action, revoked_at, key.sign(canonical_bytes(payload)).hex())
                grants = self._array(doc, "grant")
                for i in reversed(range(len(grants))):
                    t = grants[i]
                    granted = t.get("action")
                    if t.get("issuer") == issuer and isinstance(granted, str) and grant_covers(action, granted):
                        del grants[i]
                _upsert(self._array(doc, "revocation"), issuer, action, _revocation_fields(revocation))
            if not len(doc["grant"]):
                del doc["grant"]
            atomic_write_text(self.path, tomlkit.dumps(doc).rstrip("\n") + "\n", mode=0o600)
        return affected


def _now(now_ms: int | None) -> int:
    return _wall_ms() if now_ms is None else now_ms


def _checked_actions(actions: Iterable[str]) -> list[str]:
    chosen = list(dict.fromkeys(actions))
    if not chosen:
        raise GrantError("name at least one action (e.g. tool.web_fetch or tool.*)", field="action")
    for action in chosen:
        problem = action_problem(action, allow_wildcard=True)
        if problem:
            raise GrantError(problem, field="action", action=action)
    return chosen


def _checked_issuer(pubkey: str) -> str:
    if not isinstance(pubkey, str) or not _PUBKEY.match(pubkey):
        raise GrantError(f"issuer {pubkey!r} must be a 64-lowercase-hex public key", field="issuer")
    return pubkey


def _stamp(ms: int) -> Any:
    import tomlkit
    item = tomlkit.integer(ms)
    item.comment(iso_ms(ms))
    return item


def _grant_fields(grant: Grant) -> dict[str, Any]:
    return {
        "issuer": grant.issuer,
        "display": grant.display,
        "action": grant.action,
        "granted_at": _stamp(grant.granted_at),
        "expires_at": None if grant.expires_at is None else _stamp(grant.expires_at),
        "signature": grant.signature,
    }


def _revocation_fields(revocation: Revocation) -> dict[str, Any]:
    return {
        "issuer": revocation.issuer,
        "action": revocation.action,
        "revoked_at": _stamp(revocation.revoked_at),
        "signature": revocation.signature,
    }


def _upsert(array: Any, issuer: str, action: str, fields: dict[str, Any]) -> None:
    """Update the entry for (issuer, action) in place, or append one.

    Updating field by field keeps the operator's comments inside the entry
    and its position in the file; duplicates of the entry are dropped.
    """
    import tomlkit
    same = [i for i, t in enumerate(array) if t.get("issuer") == issuer and t.get("action") == action]
    if not same:
        table = tomlkit.table()
        for key, value in fields.items():
            if value is not None:
                table.add(key, value)
        table.add(tomlkit.nl())
        array.append(table)
        return
    table = array[same[0]]
    for key, value in fields.items():
        if value is not None:
            table[key] = value
        elif key in table:
            del table[key]
    for key in [k for k in table if k not in fields]:
        del table[key]
    for i in reversed(same[1:]):
        del array[i]
