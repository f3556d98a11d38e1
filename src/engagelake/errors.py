"""One error tree; HTTP statuses appear only where requests are answered."""


class EngagelakeError(Exception):
    """Base of every error engagelake raises on purpose."""


class RequestError(EngagelakeError):
    """A request answered with an error, raised by the friendly per-resource methods: `status`
    and `body` are exactly what `Workspace.call` (and the REST API) answered."""

    def __init__(self, message: str, status: int, body: object):
        super().__init__(message)
        self.status = status
        self.body = body


class StoreError(EngagelakeError):
    """The store cannot be read or written as expected."""


class ConfigError(EngagelakeError):
    """A setting or argument is wrong; the message says what to fix."""


class StaleStoreError(StoreError):
    """Another writer committed while a batch was being computed; recompute and retry."""
