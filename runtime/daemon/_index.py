"""The daemon's index of its sessions: id, project and model of every active session, in memory, in start order.

What a page of 100,000 sessions needs answered at once (``sessions.page``:
filter by project or model, search by id or project, sort) without
reading 100,000 records from the store. One dict entry a session: the id
(the same string object the session's supervisor keys it by) maps to one
small int standing for its (project, model) pair, and the int objects are
shared by every session of the pair, so 100,000 sessions cost a few MB.
Insertion order is start order. Touched only on the loop thread.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["MODEL_SLOTS", "SessionIndex"]

MODEL_SLOTS = 1 << 16
"""A packed int is ``project number * MODEL_SLOTS + model number``."""
_MODELS = MODEL_SLOTS


class SessionIndex:
    """Every active session's id, project and model; O(1) to add or remove one."""

    def __init__(self) -> None:
        self._sessions: dict[str, int] = {}  # id -> project number * _MODELS + model number
        self._projects: list[str] = []
        self._project_numbers: dict[str, int] = {}
        self._models: list[str] = []
        self._model_numbers: dict[str, int] = {}
        self._packs: dict[int, int] = {}  # one int object per (project, model) pair, shared
        self._per_project: dict[int, int] = {}
        self._per_model: dict[int, int] = {}
        self.version = 0  # bumped by every change: what a cached order is checked against

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def add(self, session_id: str, working_dir: str, model: str) -> None:
        """Note an active session (again: its project and model are replaced, its place kept)."""
        project = self._number(working_dir, self._projects, self._project_numbers, None)
        model_number = self._number(model, self._models, self._model_numbers, _MODELS)
        packed = project * _MODELS + model_number
        packed = self._packs.setdefault(packed, packed)
        old = self._sessions.get(session_id)
        if old == packed:
            return
        if old is not None:
            self._count(old, -1)
        self._sessions[session_id] = packed
        self._count(packed, 1)
        self.version += 1

    def remove(self, session_id: str) -> None:
        """Forget a session (stopped for good); nothing if it is not known."""
        old = self._sessions.pop(session_id, None)
        if old is not None:
            self._count(old, -1)
            self.version += 1

    def packed(self, session_id: str) -> int | None:
        """The packed project and model of a session; None if it is not in the index."""
        return self._sessions.get(session_id)

    def items(self, *, reverse: bool = False) -> Iterator[tuple[str, int]]:
        """(id, packed project and model) of every session, in start order (``reverse``: newest first)."""
        items = self._sessions.items()
        return reversed(items) if reverse else iter(items)

    def project_of(self, packed: int) -> str:
        return self._projects[packed // _MODELS]

    def model_of(self, packed: int) -> str:
        return self._models[packed % _MODELS]

    def project_number(self, working_dir: str) -> int | None:
        return self._project_numbers.get(working_dir)

    def model_number(self, model: str) -> int | None:
        return self._model_numbers.get(model)

    def projects(self) -> list[tuple[str, int]]:
        """(working dir, active sessions) of each project with any, most sessions first."""
        counts = [(self._projects[n], count) for n, count in self._per_project.items() if count]
        return sorted(counts, key=lambda item: (-item[1], item[0]))

    def models(self) -> list[tuple[str, int]]:
        """(model, active sessions) of each model with any, most sessions first."""
        counts = [(self._models[n], count) for n, count in self._per_model.items() if count]
        return sorted(counts, key=lambda item: (-item[1], item[0]))

    def _count(self, packed: int, delta: int) -> None:
        project, model = divmod(packed, _MODELS)
        self._per_project[project] = self._per_project.get(project, 0) + delta
        self._per_model[model] = self._per_model.get(model, 0) + delta

    @staticmethod
    def _number(value: str, values: list[str], numbers: dict[str, int], cap: int | None) -> int:
        number = numbers.get(value)
        if number is None:
            if cap is not None and len(values) >= cap:
                msg = f"the session index holds at most {cap} distinct models"
                raise OverflowError(msg)
            number = numbers[value] = len(values)
            values.append(value)
        return number
