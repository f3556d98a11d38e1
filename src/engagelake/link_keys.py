"""The keys that sign recipients' links (preference center tokens), kept outside the store's data.

A link is a recipient's only credential, so its signing key must not be something a reader of
the store's files holds (the store's seed is in every `_ledger` row). The key ring is a small
JSON file of keys, a revocation epoch and a maximum lifetime:

    {"format": 1,
     "keys": [{"id": "3f9c2a71", "secret": "<256 bits, base64>", "created": "...", "retired": null}],
     "revoked_before": null, "max_lifetime_seconds": 7776000}

Where it is, first found: `Workspace.open(link_keys=PATH)`, `$ENGAGELAKE_LINK_KEYS`, and for a
local store `<store>/_secrets/link-keys.json` (the folder 0700, the file 0600: the tables' readers
never need it). A store on object storage has no safe default: without a setting, making or
checking a link raises `LinkKeysMissing`, which says what to set.

Every process of the store finds the same file, and reads it again when it changes (a stat per
use): a key rotated or a revocation made by `engagelake link-keys` counts at a running server's
next request. Changes are made under a lock file beside it and land by an atomic rename.
The newest key not retired signs; every key not retired verifies (`docs/security.md`).
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from engagelake.errors import ConfigError

LINK_KEYS_ENV = "ENGAGELAKE_LINK_KEYS"  # the key file of every store this process opens
SECRETS_FOLDER = "_secrets"  # inside a local store: the default key file's folder (0700)
KEY_FILE = "link-keys.json"
FORMAT = 1
DEFAULT_MAX_LIFETIME = timedelta(days=90)
SHORTEST_MAX_LIFETIME = timedelta(hours=1)
LONGEST_MAX_LIFETIME = timedelta(days=366)  # no setting allows links that live longer
SECRET_BYTES = 32  # 256 bits
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class LinkKeysMissing(ConfigError):
    """No key ring is set for a store on object storage: links can be neither made nor checked."""


def millis(moment: datetime) -> int:
    """Milliseconds since the Unix epoch, exactly (no float rounding)."""
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def _time(text: Any, where: str, path: Path) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ConfigError(f"the link keys at {path} are damaged: {where} is not an ISO 8601 time") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class LinkKey:
    """One signing key: its ID (in every token it signs), its secret, and when it was made and
    retired (a retired key verifies nothing)."""

    id: str
    secret: bytes
    created: datetime
    retired: datetime | None = None


@dataclass(frozen=True)
class Ring:
    """The keys, oldest first; tokens issued before `revoked_before` are refused, and so are
    tokens made to live longer than `max_lifetime`."""

    keys: tuple[LinkKey, ...] = ()
    revoked_before: datetime | None = None
    max_lifetime: timedelta = DEFAULT_MAX_LIFETIME

    def key(self, key_id: str) -> LinkKey | None:
        return next((k for k in self.keys if k.id == key_id), None)

    @property
    def signing(self) -> LinkKey | None:
        """The key new links are signed with: the newest one not retired."""
        return next((k for k in reversed(self.keys) if k.retired is None), None)

    def with_new_key(self, now: datetime) -> Ring:
        taken = {k.id for k in self.keys}
        key_id = secrets.token_hex(4)
        while key_id in taken:
            key_id = secrets.token_hex(4)
        return replace(self, keys=(*self.keys, LinkKey(key_id, secrets.token_bytes(SECRET_BYTES), now)))

    def to_json(self) -> bytes:
        return orjson.dumps({
            "format": FORMAT,
            "keys": [{"id": k.id, "secret": base64.b64encode(k.secret).decode(), "created": k.created.isoformat(),
                      "retired": None if k.retired is None else k.retired.isoformat()} for k in self.keys],
            "revoked_before": None if self.revoked_before is None else self.revoked_before.isoformat(),
            "max_lifetime_seconds": int(self.max_lifetime.total_seconds()),
        }, option=orjson.OPT_INDENT_2) + b"\n"

    @classmethod
    def from_json(cls, text: bytes, path: Path) -> Ring:
        damaged = f"the link keys at {path} are damaged"
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise ConfigError(f"{damaged}: not JSON. Restore the file from a backup, or move it away and make "
                              "new keys with `engagelake link-keys rotate` (every link sent stops working)") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("keys"), list):
            raise ConfigError(f"{damaged}: expected an object with format {FORMAT} and a list of keys")
        keys = []
        for i, item in enumerate(data["keys"]):
            if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"] \
                    or not isinstance(item.get("secret"), str):
                raise ConfigError(f"{damaged}: keys[{i}] needs an id and a secret")
            try:
                secret = base64.b64decode(item["secret"], validate=True)
            except (binascii.Error, ValueError):
                raise ConfigError(f"{damaged}: keys[{i}].secret is not base64") from None
            if len(secret) < SECRET_BYTES:
                raise ConfigError(f"{damaged}: keys[{i}].secret holds {len(secret) * 8} bits; at least "
                                  f"{SECRET_BYTES * 8} are needed")
            retired = item.get("retired")
            keys.append(LinkKey(item["id"], secret, _time(item.get("created"), f"keys[{i}].created", path),
                                None if retired is None else _time(retired, f"keys[{i}].retired", path)))
        revoked = data.get("revoked_before")
        lifetime = data.get("max_lifetime_seconds", int(DEFAULT_MAX_LIFETIME.total_seconds()))
        if not isinstance(lifetime, int) or isinstance(lifetime, bool) or not (
                SHORTEST_MAX_LIFETIME <= timedelta(seconds=lifetime) <= LONGEST_MAX_LIFETIME):
            raise ConfigError(f"{damaged}: max_lifetime_seconds must be whole seconds from "
                              f"{int(SHORTEST_MAX_LIFETIME.total_seconds())} to "
                              f"{int(LONGEST_MAX_LIFETIME.total_seconds())}")
        return cls(tuple(keys), None if revoked is None else _time(revoked, "revoked_before", path),
                   timedelta(seconds=lifetime))


def check_max_lifetime(lifetime: timedelta) -> timedelta:
    """`lifetime` when a ring may have it as its maximum, else ConfigError."""
    if not SHORTEST_MAX_LIFETIME <= lifetime <= LONGEST_MAX_LIFETIME:
        raise ConfigError(f"the longest link life must be from {SHORTEST_MAX_LIFETIME} (one hour) to "
                          f"{LONGEST_MAX_LIFETIME.days} days, not {lifetime}")
    return lifetime


class LinkKeys:
    """The key ring of one store: where it is (`path`, None for a store on object storage
    without a setting) and its current contents (`ring`, read again when the file changes)."""

    def __init__(self, path: Path | None, *, store: str, default: bool = False,
                 clock: Callable[[], datetime] | None = None):
        self.path = path
        self.store = store
        self.clock = clock or (lambda: datetime.now(UTC))  # the time of changes made without `now`
        self.default = default  # the store's own file: its folder is made (0700) when missing
        self._kept: tuple[tuple[int, int, int, int], Ring] | None = None  # (the file's stat, its ring)
        self._lock = threading.Lock()

    @classmethod
    def of_store(cls, uri: str, path: str | Path | None = None, *,
                 clock: Callable[[], datetime] | None = None) -> LinkKeys:
        """The ring of the store at `uri`: `path`, else `$ENGAGELAKE_LINK_KEYS`, else the
        store's own `_secrets/link-keys.json` when it is local."""
        chosen = path if path is not None else os.environ.get(LINK_KEYS_ENV) or None
        if chosen is not None:
            text = str(chosen)
            if "://" in text:
                raise ConfigError(f"the link keys must be a local file (owner-only), not {text}: keep it apart from "
                                  "the store's objects, and give each server process its copy")
            return cls(Path(text).expanduser().absolute(), store=uri, clock=clock)
        if "://" in uri:
            return cls(None, store=uri, clock=clock)
        return cls(Path(uri) / SECRETS_FOLDER / KEY_FILE, store=uri, default=True, clock=clock)

    def _where(self) -> Path:
        if self.path is None:
            raise LinkKeysMissing(
                f"the store at {self.store} is on object storage, which keeps no link keys: set {LINK_KEYS_ENV} to "
                "the path of a key file only the server's user can read (make one with `engagelake link-keys "
                f"rotate --store {self.store} --link-keys PATH`), or pass Workspace.open(link_keys=PATH); "
                "preference links can be neither made nor checked until then")
        return self.path

    # --- reading ---------------------------------------------------------------------------------
    def ring(self) -> Ring:
        """The ring as the file holds it now (an empty ring when there is no file yet: no link
        was ever signed, so none verifies). Read again only when the file changed."""
        path = self._where()
        try:
            info = path.stat()
        except FileNotFoundError:
            return Ring()
        except OSError as error:
            raise ConfigError(f"cannot read the link keys at {path}: {error.strerror}") from error
        stamp = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)
        kept = self._kept
        if kept is not None and kept[0] == stamp:
            return kept[1]
        ring = self._read(path)
        self._kept = (stamp, ring)
        return ring

    @staticmethod
    def _read(path: Path) -> Ring:
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return Ring()
        except OSError as error:
            raise ConfigError(f"cannot read the link keys at {path}: {error.strerror}") from error
        return Ring.from_json(text, path)

    def signing_key(self, now: datetime) -> LinkKey:
        """The key to sign a new link with; the ring's first key is made when it has none."""
        key = self.ring().signing
        if key is not None:
            return key
        made = self._update(lambda ring: ring if ring.signing is not None else ring.with_new_key(now)).signing
        assert made is not None
        return made

    # --- changes ---------------------------------------------------------------------------------
    def rotate(self, *, retire_others: bool = False, now: datetime | None = None) -> LinkKey:
        """A new key signs from now on; the older ones still verify the links they signed,
        unless `retire_others` (a key that leaked: every link it signed stops working)."""
        now = now or self.clock()

        def change(ring: Ring) -> Ring:
            if retire_others:
                ring = replace(ring, keys=tuple(k if k.retired else replace(k, retired=now) for k in ring.keys))
            return ring.with_new_key(now)

        made = self._update(change).keys[-1]
        return made

    def retire(self, key_id: str, *, now: datetime | None = None) -> LinkKey:
        """Retire a key that no longer signs: every link it signed stops working."""
        now = now or self.clock()

        def change(ring: Ring) -> Ring:
            key = ring.key(key_id)
            if key is None:
                raise ConfigError(f"no link key {key_id!r} at {self.path}: `engagelake link-keys list` shows them")
            if ring.signing is key:
                raise ConfigError(f"link key {key_id!r} signs new links: rotate first (`engagelake link-keys rotate`, "
                                  "with --retire-others to retire every older key at once)")
            if key.retired is not None:
                return ring
            return replace(ring, keys=tuple(replace(k, retired=now) if k is key else k for k in ring.keys))

        retired = self._update(change).key(key_id)
        assert retired is not None
        return retired

    def revoke(self, *, now: datetime | None = None) -> datetime:
        """Refuse every link issued before now, whatever key signed it; links made from now on
        work (the keys stay). Returns the new epoch."""
        now = now or self.clock()
        return self._update(lambda ring: replace(ring, revoked_before=max(now, ring.revoked_before or now))) \
            .revoked_before or now

    def set_max_lifetime(self, lifetime: timedelta) -> timedelta:
        """The longest life a link may be made with, and checked against: a link made to live
        longer, before the change too, is refused."""
        check_max_lifetime(lifetime)
        return self._update(lambda ring: replace(ring, max_lifetime=lifetime)).max_lifetime

    def _update(self, change: Callable[[Ring], Ring]) -> Ring:
        """Read the file, change its ring, write it back: under the lock file, through a new file
        (0600) renamed over the old one, so a reader sees one whole ring or the other."""
        path = self._where()
        with self._lock, self._locked(path):
            ring = self._read(path)
            changed = change(ring)
            if changed != ring:
                temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")
                try:
                    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                    try:
                        os.write(handle, changed.to_json())
                        os.fsync(handle)
                    finally:
                        os.close(handle)
                    os.replace(temporary, path)
                except OSError as error:
                    temporary.unlink(missing_ok=True)
                    raise ConfigError(f"cannot write the link keys at {path}: {error.strerror}") from error
                _sync_folder(path.parent)
            self._kept = None
            return changed

    @contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        folder = path.parent
        if self.default and not folder.is_dir():
            if not folder.parent.is_dir():
                raise ConfigError(f"no store folder at {folder.parent}: its link keys cannot be kept there")
            try:
                folder.mkdir(mode=0o700, exist_ok=True)
                os.chmod(folder, 0o700)  # whatever the umask
            except OSError as error:
                raise ConfigError(f"cannot make the link keys' folder {folder}: {error.strerror}") from error
        if not folder.is_dir():
            raise ConfigError(f"cannot keep link keys at {path}: the folder {folder} does not exist")
        try:
            handle = os.open(path.with_name(path.name + ".lock"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as error:
            raise ConfigError(f"cannot change the link keys at {path} ({error.strerror}): give the file's folder "
                              "to the user that runs engagelake, or change the keys where they can be written "
                              "and copy the file") from error
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            os.close(handle)  # closing releases the lock


def _sync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (a crash must not bring the old ring back)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def readable_by_others(path: Path) -> bool:
    """Whether the file's mode lets its group or other users read it (`link-keys list` warns)."""
    try:
        return bool(path.stat().st_mode & 0o044)
    except OSError:
        return False
