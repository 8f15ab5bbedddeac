"""`ToolError`, the error a tool raises to end its call with a message for the model.

It lives apart from the contract (`weald.tools._contract`) so that the
modules the contract builds on (path resolution, `weald.tools._paths`) can
raise it without importing the contract: imports among the tool modules
point one way.
"""

from __future__ import annotations

from collections.abc import Iterable

from weald.runtime import WealdError

__all__ = ["ToolError"]


class ToolError(WealdError):
    """Raised by a tool to end the call with an error result for the model.

    The message is what the model reads, so say what went wrong and what to
    do next. Any other exception works too; this one just reads better.
    """

    def __init__(self, message: str, *, hints: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.hints = tuple(hints)
