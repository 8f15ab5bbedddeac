"""Exceptions raised by weald's supervisors.

The tree::

    WealdError (weald.runtime)
    └── SupervisorError
        ├── ChildExistsError        start_child with an id already present
        ├── ChildNotFoundError      no child with that id (or ref)
        ├── ChildRunningError       restart_child / delete_child on a running child
        ├── MaxChildrenError        a DynamicSupervisor is full
        └── RestartIntensityError   more restarts than max_restarts within max_seconds;
                                    the supervisor's crash reason when it escalates
"""

from __future__ import annotations

from weald.runtime import WealdError

__all__ = [
    "ChildExistsError",
    "ChildNotFoundError",
    "ChildRunningError",
    "MaxChildrenError",
    "RestartIntensityError",
    "SupervisorError",
]


class SupervisorError(WealdError):
    """Base of the errors a supervisor raises."""


class ChildExistsError(SupervisorError):
    """A child with that id is already present."""


class ChildNotFoundError(SupervisorError):
    """The supervisor has no child with that id or ref."""


class ChildRunningError(SupervisorError):
    """The operation needs the child stopped, and it is running."""


class MaxChildrenError(SupervisorError):
    """A DynamicSupervisor already has ``max_children`` children."""


class RestartIntensityError(SupervisorError):
    """Children needed more restarts than allowed; the supervisor gave up and escalates."""
