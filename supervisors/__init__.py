"""OTP supervision for weald actors: `Supervisor`, `DynamicSupervisor`, `ChildSpec`.

No other Python actor library restarts failed actors by OTP's rules; these do.
Build on `weald.runtime` only through its public API.
"""

from __future__ import annotations

import logging as _logging

from weald.supervisors._core import SupervisorBase, SupervisorSnapshot, SupervisorStatistics
from weald.supervisors._dynamic import DynamicSupervisor
from weald.supervisors._errors import (
    ChildExistsError,
    ChildNotFoundError,
    ChildRunningError,
    MaxChildrenError,
    RestartIntensityError,
    SupervisorError,
)
from weald.supervisors._spec import (
    RESTART_TYPES,
    STRATEGIES,
    Backoff,
    ChildInfo,
    ChildSpec,
    ChildStatus,
    Restart,
    Strategy,
)
from weald.supervisors._supervisor import Supervisor

__all__ = [
    "RESTART_TYPES",
    "STRATEGIES",
    "Backoff",
    "ChildExistsError",
    "ChildInfo",
    "ChildNotFoundError",
    "ChildRunningError",
    "ChildSpec",
    "ChildStatus",
    "DynamicSupervisor",
    "MaxChildrenError",
    "Restart",
    "RestartIntensityError",
    "Strategy",
    "Supervisor",
    "SupervisorBase",
    "SupervisorError",
    "SupervisorSnapshot",
    "SupervisorStatistics",
]

_logging.getLogger(__name__).addHandler(_logging.NullHandler())
