"""The REST server (`engagelake serve`): `create_app(workspace)` returns the FastAPI app."""

from engagelake.api.app import create_app

__all__ = ["create_app"]
