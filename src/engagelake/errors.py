"""One error tree; HTTP statuses appear only where requests are answered."""


class EngagelakeError(Exception):
    """Base of every error engagelake raises on purpose."""


class StoreError(EngagelakeError):
    """The store cannot be read or written as expected."""


class ConfigError(EngagelakeError):
    """A setting or argument is wrong; the message says what to fix."""


class StaleStoreError(StoreError):
    """Another writer committed while a batch was being computed; recompute and retry."""
