"""Preference center tokens (`preference_centers.py`): signed with a key of the store's link key
ring (`link_keys.py`), read back and checked; the messages of a refused token. A module of its
own, beside the handlers' (which re-exports every name)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from typing import Any

from engagelake.link_keys import LinkKey, Ring, millis
from engagelake.resources.refusals import Refused

ERR_TOKEN = "invalid token: use the submit URL of a freshly rendered page"  # 403
ERR_TOKEN_CENTER = "token belongs to another preference center"  # 403
ERR_TOKEN_EXPIRED = "token expired at {expires}: render the page again for a new submit URL"  # 403
ERR_TOKEN_REVOKED = "this link was revoked: ask for a new link"  # 403 (a retired key, or before the epoch)
ERR_TOKEN_LIFETIME = ("this link was made to work longer than the store allows ({days:g} days at most): ask for a "
                      "new link")  # 403
# what a token's MAC covers besides its payload: a key of the ring signs nothing else the same way
TOKEN_DOMAIN = b"engagelake preference link 2\n"


def format_time(moment: datetime) -> str:
    """ISO 8601 UTC with milliseconds, as the export writes timestamps."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_token(key: LinkKey, center_id: str, service_id: str, issued: datetime, expires: datetime) -> str:
    """`<payload>.<signature>`, both base64url; payload = key ID, center ID, service_id, issue
    time (unix ms) and expiry (unix s), `|` between; signature = HMAC-SHA256 of the key's secret."""
    payload = f"{key.id}|{center_id}|{service_id}|{millis(issued)}|{int(expires.timestamp())}".encode()
    return b64(payload) + "." + b64(hmac.new(key.secret, TOKEN_DOMAIN + payload, hashlib.sha256).digest())


def read_token(ring: Ring, token: Any, center_id: str, now: datetime) -> tuple[str, datetime]:
    """(service_id, expiry) of a valid token for this center, or 403: malformed, an unknown key
    (tokens of before the key ring, signed from the store's seed, among them) or a bad
    signature; a retired key or issued before the ring's revocation; another center; made to
    live longer than the ring's maximum; expired."""
    if not isinstance(token, str) or token.count(".") != 1:
        raise Refused(403, ERR_TOKEN)
    payload_text, signature_text = token.split(".")
    try:
        payload, signature = unb64(payload_text), unb64(signature_text)
        key_id, token_center, service_id, issued_text, expires_text = payload.decode().split("|")
        issued_ms, expires_s = int(issued_text), int(expires_text)
    except ValueError:  # not base64 (binascii.Error), not UTF-8, not five fields, not numbers
        raise Refused(403, ERR_TOKEN) from None
    key = ring.key(key_id)
    if key is None:
        hmac.compare_digest(signature, bytes(32))  # an unknown key costs what a known one does
        raise Refused(403, ERR_TOKEN)
    expected = hmac.new(key.secret, TOKEN_DOMAIN + payload, hashlib.sha256).digest()
    if not hmac.compare_digest(signature, expected):
        raise Refused(403, ERR_TOKEN)
    if key.retired is not None or (ring.revoked_before is not None and issued_ms < millis(ring.revoked_before)):
        raise Refused(403, ERR_TOKEN_REVOKED)
    if token_center != center_id:
        raise Refused(403, ERR_TOKEN_CENTER)
    if expires_s * 1000 - issued_ms > ring.max_lifetime // timedelta(milliseconds=1):
        raise Refused(403, ERR_TOKEN_LIFETIME.format(days=ring.max_lifetime / timedelta(days=1)))
    expires = datetime.fromtimestamp(expires_s, UTC)
    if now >= expires:
        raise Refused(403, ERR_TOKEN_EXPIRED.format(expires=format_time(expires)))
    return service_id, expires
