"""How a resource handler ends early with an error answer: raise `Refused(status, message)`
anywhere below a handler wrapped in `answering`, and the client gets `{"message": ...}` with
that status. SCIM answers in its own error shape (`scim.py`)."""

from __future__ import annotations

from collections.abc import Callable

from engagelake.routing import Context, Handler, Request, Response


class Refused(Exception):
    """Ends a handler early with an error response `{"message": ...}`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.response = Response(status, {"message": message})


def answering(handler: Callable[[Context, Request], Response]) -> Handler:
    """A handler whose `Refused` errors become their responses."""

    def run(ctx: Context, req: Request) -> Response:
        try:
            return handler(ctx, req)
        except Refused as refused:
            return refused.response

    return run
