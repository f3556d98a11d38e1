"""uvicorn's access log without recipients' link tokens.

A recipient's link carries its token in the query string (`/preferences/<center>?token=...`),
and uvicorn's access log prints the whole path: whoever reads the log could open the page and
change the recipient's subscriptions. The filter writes `token=<redacted>` in its place.
"""

from __future__ import annotations

import logging
import re

ACCESS_LOGGER = "uvicorn.access"
_TOKEN = re.compile(r"(?<=[?&]token=)[^&#\s]*")
REDACTED = "<redacted>"


def redacted(path: str) -> str:
    """`path` with the value of every `token` query parameter replaced."""
    return _TOKEN.sub(REDACTED, path)


class TokenRedactor(logging.Filter):
    """Rewrites the path argument of uvicorn's access records (client, method, path, version,
    status) before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str) and "token=" in args[2]:
            record.args = (*args[:2], redacted(args[2]), *args[3:])
        return True


REDACTOR = TokenRedactor()


def install() -> None:
    """Filter uvicorn's access log (once: a logger keeps a filter object at most once)."""
    logging.getLogger(ACCESS_LOGGER).addFilter(REDACTOR)
