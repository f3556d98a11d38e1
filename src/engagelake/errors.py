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


class NotAStore(StoreError):
    """The path holds no engagelake store (a file, a folder of other things, or nothing where a
    store must exist); nothing was created or changed there."""


class StoreExists(StoreError):
    """`Workspace.create` found a store where it was asked to make a new one."""


class StoreDamaged(StoreError):
    """A store whose ledger, Delta logs or data files are missing or unreadable. The message
    names the file and what to do (`engagelake check`, a backup, `engagelake repair`)."""


class StoreReadOnly(StoreError):
    """A write to a store the process may not write (a read-only folder or file system)."""


class ConfigError(EngagelakeError):
    """A setting or argument is wrong; the message says what to fix."""


class StaleStoreError(StoreError):
    """Another writer committed while a batch was being computed; recompute and retry."""


class TurnEndedError(StoreError):
    """A writer on object storage lost its lease before its ledger row (a pause past the lease,
    renewals that failed): the batch was not committed, whatever another writer committed
    meanwhile under the same batch number."""


class IdempotencyKeyReused(StoreError):
    """`apply` got an idempotency key that a committed batch of different requests holds:
    nothing was applied, and the stored responses (of the other batch) are not answered."""

    def __init__(self, key: str, committed_at: object):
        super().__init__(
            f"idempotency key {key!r} belongs to a different batch, committed at {committed_at}; nothing "
            "was applied. Send new requests with a new key; the same key answers only the same requests "
            "(method, path, query and body, in order) again."
        )
        self.key = key
        self.committed_at = committed_at


class IdempotentResponsesExpired(StoreError):
    """`apply` got the idempotency key of a committed batch whose stored responses are gone:
    kept only for the workspace's retention window, or dropped at once by a compaction after
    the batch concerned a deleted user (`docs/privacy.md`). The batch was applied when it was
    committed (`committed_at`); nothing was applied again. `reason`: "expired" or "erased"."""

    def __init__(self, key: str, committed_at: object, reason: str):
        why = ("they concerned a user deleted since" if reason == "erased"
               else "they were older than the workspace's response retention window")
        super().__init__(
            f"the batch of idempotency key {key!r} was applied at {committed_at}; its stored responses "
            f"were dropped because {why}. Nothing was applied again; treat the batch as done (the "
            "flows log it as skipped), or send it with a new key to apply it once more."
        )
        self.key = key
        self.committed_at = committed_at
        self.reason = reason
