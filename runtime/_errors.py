"""Exceptions raised by the weald runtime.

The tree::

    WealdError
    ├── ActorError
    │   ├── LoopBlockedError      a blocking wait was attempted on the loop thread
    │   ├── NameTakenError        a live actor already holds that path
    │   ├── StartError            an actor's on_start failed (the cause is chained)
    │   ├── IOCancelledError      a run_io task was cancelled before it finished
    │   └── NoSystemError         no running ActorSystem to host an actor
    ├── UnreadableFileError       a file a request names is not a readable regular file of bounded size
    ├── LinkInPathError           a directory on a path walked without following links is a link or a file
    └── StoreError
        ├── StoreCorruptError     the database file is unreadable or not a database
        ├── StoreClosedError      the store was closed (stopped, not broken)
        ├── StoreFullError        no space left on the device holding the store (or on the database server)
        ├── StoreCodecError       a value could not be encoded or decoded
        ├── StoreConnectionError  the database server cannot be reached, or the connection was lost
        ├── StoreConflictError    the database refused a transaction as conflicting (serialization, deadlock)
        ├── StoreReadOnlyError    the database takes no writes (a read-only standby)
        ├── StoreSchemaError      the database holds a weald schema of another version
        └── StoreFencedError      this node no longer owns the session (its owner or epoch changed)

pykka's own `ActorDeadError` (the actor is not running) and `Timeout` (a
`get()` ran out of time) keep their pykka meaning and are re-exported by
`weald.runtime` unchanged.
"""

from __future__ import annotations

__all__ = [
    "ActorError",
    "IOCancelledError",
    "LinkInPathError",
    "LoopBlockedError",
    "NameTakenError",
    "NoSystemError",
    "StartError",
    "StoreClosedError",
    "StoreCodecError",
    "StoreConflictError",
    "StoreConnectionError",
    "StoreCorruptError",
    "StoreError",
    "StoreFencedError",
    "StoreFullError",
    "StoreReadOnlyError",
    "StoreSchemaError",
    "UnreadableFileError",
    "WealdError",
]


class WealdError(Exception):
    """Base of every error weald raises."""


class ActorError(WealdError):
    """Something about an actor's lifecycle or messaging went wrong."""


class LoopBlockedError(ActorError):
    """A blocking wait was attempted on the trio loop thread.

    Every loop-hosted actor shares that thread; blocking it would stop every
    one of them, including the actor whose reply is awaited. Use ``await``
    in an ``async def`` handler instead.
    """


class NameTakenError(ActorError):
    """A live actor is already registered under the requested path."""


class StartError(ActorError):
    """An actor's ``on_start`` failed; the original exception is chained."""


class IOCancelledError(ActorError):
    """A ``run_io`` task was cancelled (by its handle, or its actor ended) before it finished."""


class NoSystemError(ActorError):
    """No running `ActorSystem` exists to host the actor."""


class UnreadableFileError(WealdError):
    """A file named by a request or a config cannot be read: missing, not a regular file, or too large."""


class LinkInPathError(WealdError):
    """A directory on a path walked without following links (`open_directory_nofollow`) was not one.

    Attributes:
        path: the component that stopped the walk (the path up to it).
        is_link: True for a symlink (never followed), False for a file or
            other non-directory where a directory was expected.
    """

    def __init__(self, path: str, *, is_link: bool) -> None:
        what = "a symbolic link, which was not followed" if is_link else "not a directory"
        super().__init__(f"{path} is {what}")
        self.path = path
        self.is_link = is_link


class StoreError(WealdError):
    """The persistent store failed."""


class StoreCorruptError(StoreError):
    """The store's database file is unreadable, corrupt, or not a database."""


class StoreFullError(StoreError):
    """A write failed because the device holding the store has no space left.

    Nothing acknowledged is lost: the write was not acknowledged. Queued
    writes that failed this way are kept and committed once space returns.
    """


class StoreClosedError(StoreError):
    """The store has been closed; it was stopped, not broken."""


class StoreCodecError(StoreError):
    """A value could not be encoded to, or decoded from, the store."""


class StoreConnectionError(StoreError):
    """The database server cannot be reached, refused the login, or the connection was lost.

    Queued writes that failed this way are kept and committed once the
    connection is back (the store reconnects with backoff).
    """


class StoreConflictError(StoreError):
    """The database refused a transaction as conflicting with another (a serialization failure, a deadlock).

    Nothing of it was written; a queued group is tried again.
    """


class StoreReadOnlyError(StoreError):
    """The database takes no writes: it is a read-only standby, or the transaction was read-only."""


class StoreSchemaError(StoreError):
    """The database holds weald tables of another schema version; it was left untouched."""


class StoreFencedError(StoreError):
    """A write for a session this node no longer owns was refused.

    Another node claimed the session (its placement's owner or epoch
    changed), or this node lost its lease. Nothing of the write landed; the
    session stops on this node. This fence, checked in the same transaction
    as every commit, is what keeps a session from having two writers.

    Attributes:
        sessions: the sessions refused.
    """

    def __init__(self, message: str, sessions: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.sessions = sessions
