"""The weald actor core: light actors on pykka and trio, the actor system, the bus, the store.

Higher layers (agents, tool runner, MCP, the daemon) live in submodules of
this package and are imported explicitly (``weald.runtime.agents``, ``weald.runtime.daemon``...); this
module exports only the core, so `weald.supervisors` can build on it.
"""

from __future__ import annotations

import logging as _logging

from pykka import ActorDeadError, Timeout
from weald.runtime._actor import Actor, ActorMemory, ActorSnapshot, Down, Exit, IOHandle, Ref, ThreadActor
from weald.runtime._codec import msgspec_convert, msgspec_decoder
from weald.runtime._errors import (
    ActorError,
    IOCancelledError,
    LinkInPathError,
    LoopBlockedError,
    NameTakenError,
    NoSystemError,
    StartError,
    StoreClosedError,
    StoreCodecError,
    StoreConflictError,
    StoreConnectionError,
    StoreCorruptError,
    StoreError,
    StoreFencedError,
    StoreFullError,
    StoreReadOnlyError,
    StoreSchemaError,
    UnreadableFileError,
    WealdError,
)
from weald.runtime._events import Event, EventBus, Subscription
from weald.runtime._files import (
    PLACEHOLDER_DIR_MODE,
    PLACEHOLDER_FILE_MODE,
    check_regular_file,
    is_placeholder,
    make_private_dirs,
    open_directory_nofollow,
    read_regular_file,
    replace_file,
)
from weald.runtime._future import Future, is_loop_thread
from weald.runtime._links import LinkIdentity, ProtectedLinks, RestoredLink, link_identity, replaced_link
from weald.runtime._loop import Loop, LoopStatistics
from weald.runtime._processes import (
    MARK_VARIABLE,
    ChildProcess,
    LeftoverProcess,
    marked_processes,
    new_process_mark,
    open_child_process,
    scan_proc,
    set_process_owner,
    stop_leftover_processes,
)
from weald.runtime._secrets import (
    REDACTED,
    environ_value,
    is_known_secret,
    is_secret_name,
    is_secret_value,
    redact,
    redact_secret_values,
    redact_text,
    register_secret,
    restore_environ,
    sanitized_env,
    scrub_environ,
)
from weald.runtime._store import Store, StoreTransaction
from weald.runtime._store_backend import NodeLease, TextHit, mask_url, query_terms
from weald.runtime._stub import Stub, StubState
from weald.runtime._system import (
    ActorSystem,
    ComponentSnapshot,
    EventsActor,
    FaultHook,
    IOActor,
    SleepingChild,
    StoreActor,
    StoreSnapshot,
    SystemStatistics,
)

__all__ = [
    "MARK_VARIABLE",
    "PLACEHOLDER_DIR_MODE",
    "PLACEHOLDER_FILE_MODE",
    "REDACTED",
    "Actor",
    "ActorDeadError",
    "ActorError",
    "ActorMemory",
    "ActorSnapshot",
    "ActorSystem",
    "ChildProcess",
    "ComponentSnapshot",
    "Down",
    "Event",
    "EventBus",
    "EventsActor",
    "Exit",
    "FaultHook",
    "Future",
    "IOActor",
    "IOCancelledError",
    "IOHandle",
    "LeftoverProcess",
    "LinkIdentity",
    "LinkInPathError",
    "Loop",
    "LoopBlockedError",
    "LoopStatistics",
    "NameTakenError",
    "NoSystemError",
    "NodeLease",
    "ProtectedLinks",
    "Ref",
    "RestoredLink",
    "SleepingChild",
    "StartError",
    "Store",
    "StoreActor",
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
    "StoreSnapshot",
    "StoreTransaction",
    "Stub",
    "StubState",
    "Subscription",
    "SystemStatistics",
    "TextHit",
    "ThreadActor",
    "Timeout",
    "UnreadableFileError",
    "WealdError",
    "check_regular_file",
    "environ_value",
    "is_known_secret",
    "is_loop_thread",
    "is_placeholder",
    "is_secret_name",
    "is_secret_value",
    "link_identity",
    "make_private_dirs",
    "marked_processes",
    "mask_url",
    "msgspec_convert",
    "msgspec_decoder",
    "new_process_mark",
    "open_child_process",
    "open_directory_nofollow",
    "query_terms",
    "read_regular_file",
    "redact",
    "redact_secret_values",
    "redact_text",
    "register_secret",
    "replace_file",
    "replaced_link",
    "restore_environ",
    "sanitized_env",
    "scan_proc",
    "scrub_environ",
    "set_process_owner",
    "stop_leftover_processes",
]

_logging.getLogger(__name__).addHandler(_logging.NullHandler())
