"""Helpers for tests of weald systems: wait by condition, never by a bare sleep.

These are public so that projects testing their own agents and tools on
weald can use them too; the pytest plugin (``weald.runtime.pytest_plugin``,
``docs/faults.md``) hands them out as fixtures:

- waiting: `wait_until`, `await_until`, `wait_for_event`;
- a real daemon on a temporary socket and store: `DaemonHarness` (it imports
  the daemon layer when it starts, so that this module stays importable
  from every layer);
- fault injection: `Faults`, a handle on a `FaultInjector` to inject, list
  and assert fired faults;
- scripted models: `ScriptBuilder` writes scripts turn by turn; `Recording`
  reads a recording (``weald run --record``);
- assertions: `tree_node`, `restarts`, `escalations` on the ``tree``
  method's JSON; `tool_results`, `assert_tool_ok`, `assert_tool_failed` on a
  history;
- the loop guard (`install_loop_guard`, `take_loop_guard_violations`), which
  names every blocking call made on a trio loop thread, and `fill_disk`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import trio
from weald.runtime._actor import Actor
from weald.runtime._events import Event, EventBus
from weald.runtime._guard import LOOP_GUARD_ENV, LoopViolation, install_loop_guard, take_loop_guard_violations
from weald.runtime.agents.tool_runner import ToolResults
from weald.runtime.faults import FaultInjector, FaultSpec, FaultStatus
from weald.runtime.llm import ScriptedProvider

if TYPE_CHECKING:
    from weald.runtime.daemon.tree import Daemon
    from weald.tools import ToolRegistry

__all__ = [
    "LOOP_GUARD_ENV",
    "DaemonHarness",
    "Faults",
    "LoopViolation",
    "Recording",
    "ResultCollector",
    "ScriptBuilder",
    "WaitTimeout",
    "assert_tool_failed",
    "assert_tool_ok",
    "await_until",
    "escalations",
    "fill_disk",
    "install_loop_guard",
    "live_members",
    "process_alive",
    "restarts",
    "take_loop_guard_violations",
    "tool_results",
    "tree_node",
    "wait_for_event",
    "wait_mcp_running",
    "wait_until",
]

_T = TypeVar("_T")


class WaitTimeout(AssertionError):
    """A condition did not become true in time (an AssertionError, so tests fail clearly)."""


def wait_until(
    predicate: Callable[[], _T],
    *,
    timeout: float = 10.0,
    interval: float = 0.001,
    message: str | Callable[[], str] = "condition",
) -> _T:
    """Block until ``predicate()`` is truthy and return its value.

    The predicate is polled with a growing interval (capped at 50 ms), so
    a condition that is already true costs one call.

    Raises:
        WaitTimeout: still false after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    delay = interval
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            msg = f"timed out after {timeout} s waiting for {text}"
            raise WaitTimeout(msg)
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


async def await_until(
    predicate: Callable[[], _T],
    *,
    timeout: float = 10.0,
    interval: float = 0.001,
    message: str = "condition",
) -> _T:
    """`wait_until` for trio code."""
    delay = interval
    with trio.move_on_after(timeout):
        while True:
            value = predicate()
            if value:
                return value
            await trio.sleep(delay)
            delay = min(delay * 2, 0.05)
    msg = f"timed out after {timeout} s waiting for {message}"
    raise WaitTimeout(msg)


def wait_for_event(
    bus: EventBus,
    topic: str,
    where: Callable[[Event], bool] | None = None,
    *,
    timeout: float = 10.0,
    since: int = 0,
) -> Event:
    """Block until an event matching ``topic`` (and ``where``) with seq > ``since`` is published.

    Events already in the bus's ring count, so there is no race between
    causing an event and starting to wait for it.

    Raises:
        WaitTimeout: no such event within ``timeout`` seconds.
    """
    with bus.subscribe(topic) as sub:
        for event in bus.recent(limit=1000000, topic=topic):
            if event.seq > since and (where is None or where(event)):
                return event
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            event_or_none = sub.get(timeout=max(remaining, 0.0)) if remaining > 0 else None
            if event_or_none is None:
                msg = f"timed out after {timeout} s waiting for a {topic!r} event"
                raise WaitTimeout(msg)
            if event_or_none.seq > since and (where is None or where(event_or_none)):
                return event_or_none


def wait_mcp_running(ref: Any, *, timeout: float = 30.0) -> Any:
    """Block until the MCP connection actor ``ref`` is ``running``; returns its snapshot.

    An `weald.runtime.mcp.MCPConnection` starts connecting when it starts and
    is connected (its tools registered) a moment later; this waits for that.

    Raises:
        WaitTimeout: not running within ``timeout`` seconds (the message
            carries its status and last error).
    """
    last: list[Any] = []

    def running() -> Any:
        snapshot = ref.proxy().snapshot().get(timeout=timeout)
        last[:] = [snapshot]
        return snapshot if snapshot.status == "running" else None

    def why() -> str:
        snapshot = last[0] if last else None
        if snapshot is None:
            return f"{ref} to be running"
        return f"{ref} to be running; it is {snapshot.status}, last error: {snapshot.last_error}"

    return wait_until(running, timeout=timeout, message=why)


class ResultCollector(Actor):
    """Stands in for an agent in tool-runner tests: keeps the `ToolResults` it is sent.

    Give its ref as a `RunCalls` reply-to, then wait on ``result(batch_id)``
    through a proxy, e.g. ``wait_until(lambda: collector.proxy().result(b).get())``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._results: list[ToolResults] = []

    def on_receive(self, message: Any) -> None:
        """Keep a `ToolResults`; ignore anything else."""
        if isinstance(message, ToolResults):
            self._results.append(message)

    def received(self) -> list[ToolResults]:
        """Every `ToolResults` so far, in the order they arrived (a batch sent twice shows twice)."""
        return list(self._results)

    def result(self, batch_id: str) -> ToolResults | None:
        """The first results of batch ``batch_id``; None while it runs."""
        return next((r for r in self._results if r.batch_id == batch_id), None)


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return stat.rpartition(b")")[2].split()  # the command name may hold spaces and parens


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (Linux, from /proc): a zombie waiting to be reaped is dead."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in (b"Z", b"X")


def live_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid`` or in session ``pgid`` (Linux, from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is not None and fields[0] not in (b"Z", b"X") and pgid in (int(fields[2]), int(fields[3])):
            found.append(int(entry.name))
    return found


def fill_disk(directory: Path) -> Path:
    """Write a file in ``directory`` until its device is full (ENOSPC); returns the file.

    For tests of what happens when the disk fills up: use a small filesystem
    of the test's own (a tmpfs), never a shared one.
    """
    filler = directory / "weald-filler"
    with filler.open("wb", buffering=0) as f:
        for size in (1 << 20, 65536, 4096, 512, 1):
            chunk = b"\0" * size
            try:
                while True:
                    f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return filler


# -- scripted models ------------------------------------------------------------------------------------------


class ScriptBuilder:
    """Writes a scripted model's turns (the ``scripted:FILE`` format), one call at a time.

    ::

        model = ScriptBuilder(tmp_path).call("read_file", {"path": "notes.txt"}).say("Done.").model
        daemon.start_agent(model)

    Each method adds one turn (one model call) and returns the builder.
    `model` writes the script and returns its ``scripted:`` spec.

    Args:
        directory: where the script file goes.
        name: the file's name, without ``.json``.
    """

    def __init__(self, directory: str | os.PathLike[str], name: str = "script") -> None:
        self.path = Path(directory) / f"{name}.json"
        self.turns: list[dict[str, Any]] = []

    def say(self, text: str) -> ScriptBuilder:
        """A turn that answers ``text`` and calls no tool (it ends the agent's turn)."""
        self.turns.append({"text": text})
        return self

    def call(self, tool: str, arguments: Mapping[str, Any] | None = None, *, text: str = "") -> ScriptBuilder:
        """A turn that calls ``tool`` with ``arguments`` (after saying ``text``, if given)."""
        return self.calls((tool, arguments or {}), text=text)

    def calls(self, *calls: tuple[str, Mapping[str, Any]], text: str = "") -> ScriptBuilder:
        """A turn that calls several tools at once, each ``(tool, arguments)``."""
        turn: dict[str, Any] = {"tool_calls": [{"name": name, "arguments": dict(args)} for name, args in calls]}
        if text:
            turn["text"] = text
        self.turns.append(turn)
        return self

    def error(self, status: int = 500, message: str = "scripted provider error") -> ScriptBuilder:
        """A turn where the model call fails with HTTP ``status``."""
        self.turns.append({"error": {"status": status, "message": message}})
        return self

    def turn(self, **fields: Any) -> ScriptBuilder:
        """A turn given as the script format has it (``text``, ``tool_calls``, ``delay``, ``usage``...)."""
        self.turns.append(dict(fields))
        return self

    def save(self) -> Path:
        """Write the script (checked: a bad turn raises ``MalformedScriptError``); returns its path."""
        data = {"turns": self.turns}
        ScriptedProvider.from_dict(data, name=str(self.path))
        self.path.write_text(json.dumps(data, indent=2))
        return self.path

    @property
    def model(self) -> str:
        """The script written, as a model spec: ``scripted:<path>``."""
        return f"scripted:{self.save()}"


class Recording:
    """A recording made with ``weald run --record`` (or ``agent.start`` ``record``), read for a test.

    Attributes:
        path: the file.
        model: the spec that replays it: ``scripted:<path>``.
        recorded_from: the model it was recorded from.
        turns: each model call as recorded (plain data), in order.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Read and check a recording (blocking).

        Raises:
            MalformedScriptError: it is not a valid recording.
        """
        self.path = Path(path).resolve()
        ScriptedProvider.from_file(self.path)  # checks it, digests and all
        data = json.loads(self.path.read_text())
        self.recorded_from: str | None = data.get("recorded_from")
        self.turns: list[dict[str, Any]] = data["turns"]
        self.model = f"scripted:{self.path}"

    def __repr__(self) -> str:
        return f"<Recording {self.path} of {self.steps} model calls>"

    @property
    def steps(self) -> int:
        """How many model calls it recorded."""
        return len(self.turns)

    def tool_calls(self) -> list[tuple[int, str, Any]]:
        """Every tool call the model made, as ``(step, tool, arguments)``; steps count from 1."""
        return [
            (step, call["name"], call.get("arguments", {}))
            for step, turn in enumerate(self.turns, 1)
            for call in turn.get("tool_calls", [])
        ]


# -- faults ------------------------------------------------------------------------------------------------


class Faults:
    """A handle on a fault injector: inject, list and clear faults, and assert which fired.

    Args:
        injector: the injector of the system or daemon under test.
    """

    def __init__(self, injector: FaultInjector) -> None:
        self.injector = injector

    def __repr__(self) -> str:
        return f"<Faults {self.injector!r}>"

    @property
    def seed(self) -> int:
        """The seed every fault's decisions derive from."""
        return self.injector.seed

    def inject(self, spec: FaultSpec | Mapping[str, Any] | None = None, /, **declaration: Any) -> str:
        """Inject a fault, given as a declaration or as its keys; returns its id.

        ``faults.inject(target="tool", kind="hang", tool="shell", count=1)``
        is the same as the fault file's ``[[faults]]`` entry with those keys.

        Raises:
            FaultSpecError: the declaration is not valid, or its id is taken.
        """
        return self.injector.inject(spec if spec is not None else declaration)

    def load(self, path: str | os.PathLike[str]) -> list[str]:
        """Inject every fault of a fault file (TOML or JSON); returns their ids."""
        return self.injector.load(Path(path))

    def clear(self, fault_id: str | None = None) -> int:
        """Clear one fault, or every fault; returns how many."""
        return self.injector.clear(fault_id)

    def list(self) -> list[FaultStatus]:
        """The injected faults with their counters."""
        return self.injector.list()

    def fired(self, fault_id: str | None = None) -> int:
        """How many times a fault fired (cleared ones too), or all of them with no id."""
        statistics = self.injector.statistics()
        return statistics.fires if fault_id is None else statistics.fires_by_fault.get(fault_id, 0)

    def assert_fired(self, fault_id: str, times: int | None = None) -> int:
        """Assert that ``fault_id`` fired (exactly ``times`` times, if given); returns how many times.

        Raises:
            AssertionError: it did not, with the fires of every fault.
        """
        fired = self.fired(fault_id)
        if (times is None and fired == 0) or (times is not None and fired != times):
            expected = "at least once" if times is None else f"{times} times"
            fires = dict(self.injector.statistics().fires_by_fault)
            msg = f"fault {fault_id!r} fired {fired} times, expected {expected} (fires by fault: {fires})"
            raise AssertionError(msg)
        return fired

    def wait_fired(self, fault_id: str, times: int = 1, *, timeout: float = 10.0) -> int:
        """Wait until ``fault_id`` has fired at least ``times`` times; returns how many.

        Raises:
            WaitTimeout: it had not within ``timeout``.
        """
        return wait_until(
            lambda: fired if (fired := self.fired(fault_id)) >= times else 0,
            timeout=timeout,
            message=lambda: f"fault {fault_id!r} to fire {times} times (it fired {self.fired(fault_id)})",
        )


# -- a real daemon ----------------------------------------------------------------------------------------------


def _merged(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


class DaemonHarness:
    """A real weald daemon in this process, on a temporary socket and store, with fault injection on.

    It is the daemon ``weald serve --faults`` runs (the JSON-RPC server, the
    supervision tree, the store), started on a private socket. Every call
    goes through that socket, as a client's would; the event bus and the
    fault injector are read in this process. With no one to answer
    permission requests, every tool is allowed unless ``config`` says
    otherwise.

    ::

        with DaemonHarness(tmp_path, registry=my_tools) as daemon:
            agent = daemon.start_agent(ScriptBuilder(tmp_path).say("hi").model)
            assert daemon.prompt(agent, "hello")["ok"]

    Args:
        root: a directory of its own (the project and the store go in it).
        config: weald.toml settings as a mapping, merged over the harness's
            (``{"tools": {"timeouts": {"my_tool": 5}}}``).
        registry: the tools; default: a copy of the built-ins (tools you
            define with ``@tool`` are among them).
        seed: the fault injector's seed.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        config: Mapping[str, Any] | None = None,
        registry: ToolRegistry | None = None,
        seed: int = 0,
    ) -> None:
        self.root = Path(root)
        self.project = self.root / "project"
        self.store = self.root / "store.db"
        self._config = dict(config or {})
        self._registry = registry
        self.faults = Faults(FaultInjector(seed=seed))
        self.socket: Path | None = None
        self.daemon: Daemon | None = None
        self._socket_dir: str | None = None

    def __repr__(self) -> str:
        return f"<DaemonHarness {self.root} on {self.socket}>"

    def start(self) -> DaemonHarness:
        """Start the daemon (blocking, a second or so); returns the harness.

        Raises:
            ConfigError: ``config`` is not a valid configuration.
        """
        from weald.runtime.daemon.config import config_from_dict
        from weald.runtime.daemon.tree import Daemon
        from weald.tools import default_registry

        self.project.mkdir(parents=True, exist_ok=True)
        registry = self._registry if self._registry is not None else default_registry.copy()
        # A short directory: a Unix socket's path has room for about 100 bytes.
        self._socket_dir = tempfile.mkdtemp(prefix="weald-test-")
        self.socket = Path(self._socket_dir) / "weald.sock"
        allowed = {t.name: "allow" for t in registry.select(None) if t.permission == "ask"}
        base = {
            "store": {"path": str(self.store)},
            "server": {"socket": str(self.socket)},
            "faults": {"enabled": True},
            "tools": {"permissions": allowed},
        }
        config = config_from_dict(_merged(base, self._config), source="DaemonHarness")
        self.daemon = Daemon(config, socket_path=self.socket, faults=self.faults.injector, registry=registry)
        try:
            self.daemon.start(restore=False)
        except BaseException:
            self.daemon = None
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop the daemon (its turns are aborted, its state saved) and remove the socket's directory."""
        daemon, self.daemon = self.daemon, None
        try:
            if daemon is not None:
                daemon.shutdown(timeout=30)
        finally:
            if self._socket_dir is not None:
                shutil.rmtree(self._socket_dir, ignore_errors=True)
                self._socket_dir = None

    def __enter__(self) -> DaemonHarness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def system(self) -> Any:
        """The daemon's `ActorSystem` (its store, bus and registry)."""
        if self.daemon is None:
            msg = "the daemon is not running; call start() first"
            raise RuntimeError(msg)
        return self.daemon.system

    def call(self, method: str, params: Mapping[str, Any] | None = None, *, timeout: float = 60.0) -> Any:
        """Call a JSON-RPC method over the daemon's socket (a connection per call); returns its result.

        Raises:
            RPCCallError: the daemon answered with an error.
        """
        from weald.runtime.daemon.client import Client

        if self.socket is None:
            msg = "the daemon is not running; call start() first"
            raise RuntimeError(msg)
        with Client.connect(self.socket) as client:
            return client.call(method, dict(params or {}), timeout=timeout)

    def start_agent(
        self,
        model: str | None = None,
        *,
        agent_id: str | None = None,
        tools: Sequence[str] | None = None,
        system_prompt: str | None = None,
        record: str | os.PathLike[str] | None = None,
        working_dir: str | os.PathLike[str] | None = None,
    ) -> str:
        """Start an agent (``agent.start``) in the project; returns its id."""
        optional = {"model": model, "agent_id": agent_id, "system_prompt": system_prompt}
        params: dict[str, Any] = {k: v for k, v in optional.items() if v is not None}
        params["working_dir"] = str(Path(working_dir or self.project).resolve())
        if tools is not None:
            params["tools"] = list(tools)
        if record is not None:
            params["record"] = os.fspath(record)
        agent: str = self.call("agent.start", params)["agent_id"]
        return agent

    def prompt(self, agent_id: str, text: str, *, timeout: float = 60.0) -> dict[str, Any]:
        """Run a turn (``agent.prompt``); returns its result (``ok``, ``text``, ``error``, ``steps``...)."""
        result: dict[str, Any] = self.call("agent.prompt", {"agent_id": agent_id, "text": text}, timeout=timeout)
        return result

    def abort(self, agent_id: str) -> bool:
        """Abort the agent's running turn; returns whether there was one."""
        return bool(self.call("agent.abort", {"agent_id": agent_id})["aborted"])

    def history(self, agent_id: str) -> list[dict[str, Any]]:
        """The agent's messages, oldest first, as plain data."""
        messages: list[dict[str, Any]] = self.call("agent.history", {"agent_id": agent_id})["messages"]
        return messages

    def tree(self, path: str = "/") -> dict[str, Any]:
        """The live supervision tree under ``path`` (the ``tree`` method's JSON)."""
        root: dict[str, Any] = self.call("tree", {"path": path})
        return root

    def restarts(self, path: str) -> int:
        """How many times the actor at ``path`` was restarted by its supervisor."""
        return restarts(self.tree(path), path)

    def escalations(self, path: str) -> int:
        """How many times the supervisor at ``path`` gave up and escalated (``supervisor.gave_up``)."""
        return escalations(self.tree(path), path)

    def events(self, topic: str = "*", *, source: str | None = None, limit: int = 10_000) -> list[Event]:
        """Recent events from the daemon's bus (a bounded ring), oldest first."""
        recent: list[Event] = self.system.events.recent(limit, topic=topic, source=source)
        return recent

    def wait_for_event(
        self, topic: str, where: Callable[[Event], bool] | None = None, *, timeout: float = 10.0
    ) -> Event:
        """Wait for an event (one already published counts); see `wait_for_event`."""
        return wait_for_event(self.system.events, topic, where, timeout=timeout)


# -- assertions ------------------------------------------------------------------------------------------------


def tree_node(tree: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """The node at ``path`` in the ``tree`` method's JSON.

    Raises:
        AssertionError: there is none (the message lists the paths there are).
    """
    stack = [tree]
    seen: list[str] = []
    while stack:
        node = stack.pop()
        if node.get("path") == path:
            return node
        seen.append(str(node.get("path")))
        stack.extend(node.get("children", ()))
    msg = f"no node {path} in the tree (it has {', '.join(sorted(seen))})"
    raise AssertionError(msg)


def restarts(tree: Mapping[str, Any], path: str) -> int:
    """How many times the actor at ``path`` was restarted, from the ``tree`` method's JSON."""
    return int(tree_node(tree, path).get("restarts", 0))


def escalations(tree: Mapping[str, Any], path: str) -> int:
    """How many times the supervisor at ``path`` gave up, from the ``tree`` method's JSON."""
    return int(tree_node(tree, path).get("escalations", 0))


def _plain(message: Any) -> dict[str, Any]:
    if isinstance(message, Mapping):
        return dict(message)
    plain: dict[str, Any] = msgspec.to_builtins(message)
    return plain


def tool_results(history: Sequence[Any], tool: str | None = None) -> list[dict[str, Any]]:
    """The tool results in a history (``agent.history``'s messages, or `Message` s), of ``tool`` if given."""
    found = [_plain(m) for m in history]
    return [m for m in found if m.get("role") == "tool" and (tool is None or m.get("name") == tool)]


def _tool_result(history: Sequence[Any], tool: str, index: int, ok: bool, contains: str | None) -> dict[str, Any]:
    results = tool_results(history, tool)
    try:
        result = results[index]
    except IndexError:
        msg = f"the history has {len(results)} results of {tool}; there is no result {index}"
        raise AssertionError(msg) from None
    failed = bool(result.get("is_error"))
    if failed == ok:
        state = "failed" if failed else "succeeded"
        msg = f"result {index} of {tool} {state}, expected it to {'succeed' if ok else 'fail'}: {result['content']!r}"
        raise AssertionError(msg)
    if contains is not None and contains not in result["content"]:
        msg = f"result {index} of {tool} does not contain {contains!r}: {result['content']!r}"
        raise AssertionError(msg)
    return result


def assert_tool_ok(
    history: Sequence[Any], tool: str, *, index: int = -1, contains: str | None = None
) -> dict[str, Any]:
    """Assert that a result of ``tool`` (the last, or ``index``) succeeded (and holds ``contains``); returns it.

    Raises:
        AssertionError: it failed, is not there, or lacks ``contains``; the message quotes it.
    """
    return _tool_result(history, tool, index, True, contains)


def assert_tool_failed(
    history: Sequence[Any], tool: str, *, index: int = -1, contains: str | None = None
) -> dict[str, Any]:
    """Assert that a result of ``tool`` (the last, or ``index``) is an error (holding ``contains``); returns it.

    Raises:
        AssertionError: it succeeded, is not there, or lacks ``contains``; the message quotes it.
    """
    return _tool_result(history, tool, index, False, contains)
