"""The weald actor core: light actors on pykka and trio, the actor system, the bus, the store.

Higher layers (agents, tool runner, MCP, the daemon) live in submodules of
this package and are imported explicitly (``weald.runtime.agent``...); this
module exports only the core, so `weald.supervisors` can build on it.
"""

from __future__ import annotations

import logging as _logging

from pykka import ActorDeadError, Timeout
from weald.runtime._actor import Actor, ActorSnapshot, Down, Exit, IOHandle, Ref, ThreadActor
from weald.runtime._errors import (
    ActorError,
    IOCancelledError,
    LoopBlockedError,
    NameTakenError,
    NoSystemError,
    StartError,
    StoreClosedError,
    StoreCodecError,
    StoreCorruptError,
    StoreError,
    StoreFullError,
    UnreadableFileError,
    WealdError,
)
from weald.runtime._events import Event, EventBus, Subscription
from weald.runtime._files import check_regular_file, read_regular_file
from weald.runtime._future import Future, is_loop_thread
from weald.runtime._loop import Loop, LoopStatistics
from weald.runtime._secrets import (
    REDACTED,
    is_known_secret,
    is_secret_name,
    redact,
    redact_text,
    register_secret,
    sanitized_env,
)
from weald.runtime._store import Store
from weald.runtime._system import (
    ActorSystem,
    ComponentSnapshot,
    EventsActor,
    FaultHook,
    IOActor,
    StoreActor,
    StoreSnapshot,
    SystemStatistics,
)

__all__ = [
    "REDACTED",
    "Actor",
    "ActorDeadError",
    "ActorError",
    "ActorSnapshot",
    "ActorSystem",
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
    "Loop",
    "LoopBlockedError",
    "LoopStatistics",
    "NameTakenError",
    "NoSystemError",
    "Ref",
    "StartError",
    "Store",
    "StoreActor",
    "StoreClosedError",
    "StoreCodecError",
    "StoreCorruptError",
    "StoreError",
    "StoreFullError",
    "StoreSnapshot",
    "Subscription",
    "SystemStatistics",
    "ThreadActor",
    "Timeout",
    "UnreadableFileError",
    "WealdError",
    "check_regular_file",
    "is_known_secret",
    "is_loop_thread",
    "is_secret_name",
    "read_regular_file",
    "redact",
    "redact_text",
    "register_secret",
    "sanitized_env",
]

_logging.getLogger(__name__).addHandler(_logging.NullHandler())
