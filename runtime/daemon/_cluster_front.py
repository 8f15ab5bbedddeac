"""The front: ``weald serve --front``, one JSON-RPC socket in front of the nodes of a cluster.

A client talks to a front as to a daemon: the same methods, params, errors
and framing on a Unix socket (and the observer over HTTP). The front holds
no state of its own; several may run. What it does with each request:

- **to the session's node** (``agent.prompt``, ``agent.abort``, ``debug_state``
  of an agent, ...): the node is the session's placement row, cached. A node
  that answers `NOT_OWNER` (the session moved), or whose connection is lost,
  makes the front look the owner up again. A node whose lease ran out is
  dead: the front has the live nodes adopt its sessions (``cluster.adopt``,
  spread over them, asleep) and sends the request on; a prompt lost with its
  node is sent again, once, with the same idempotency key (the front gives
  one to a prompt that has none), so it runs one turn. The wait for a
  failover is bounded (`FAILOVER_WAIT`).
- **to a node it chooses** (``agent.start``, ``agents.start``): the policy
  hook (``[cluster] placement``), else the nodes a ``project`` label pins the
  session's project to, else the least loaded live node that is not draining
  (fewest awake sessions, then fewest sessions, then least CPU). ``agents.start``
  sends one request per node.
- **to every node, merged** (``agent.list``, ``sessions.page``, ``tree``,
  ``actors.list``, ``events.subscribe`` without an agent, ``events.query``,
  ``permission.list``, ``mcp.servers``, ...): each node's part carries
  ``node``, its id.
- **its own** (``daemon.status``, ``daemon.stop``, ``observer.url``,
  ``cluster.status``, ``cluster.drain``).

Each client connection has its own connection to each node it needs (opened
on first use, closed when the client goes), so what a node ties to a
connection (ephemeral agents, subscriptions, the requests in flight, the
permission requests it routes) is tied to that client. Nodes are reached
over TCP at the address their row gives, with the cluster's handshake.

Runs on the front's trio loop, in the server actor (`FrontServer`).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import msgspec
import trio
from weald.runtime import ActorSystem, StoreError, mask_url, register_secret, restore_environ
from weald.runtime._version import VERSION
from weald.runtime.daemon._cluster import (
    ClusterError,
    HandshakeError,
    cluster_secret,
    cluster_status,
    tls_client_context,
)
from weald.runtime.daemon._cluster_link import LinkLost, NodeLink
from weald.runtime.daemon.server import (
    APP_ERROR,
    INVALID_PARAMS,
    NOT_FOUND,
    NOT_OWNER,
    ActorPathParams,
    ActorsListParams,
    ActorSnapshotParams,
    AgentHistoryParams,
    AgentListParams,
    AgentParams,
    AgentPromptParams,
    AgentSendParams,
    AgentsStartParams,
    AgentStartParams,
    AskUserRespondParams,
    ConfigTrustParams,
    ConfigUntrustParams,
    Connection,
    DebugStateParams,
    EventsQueryParams,
    EventsSubscribeParams,
    EventsUnsubscribeParams,
    FaultClearParams,
    FaultInjectParams,
    McpPromptParams,
    McpReadParams,
    McpServerParams,
    MetricsSeriesParams,
    NoParams,
    OpenPromptsParams,
    PermissionRespondParams,
    RPCError,
    Server,
    SessionsPageParams,
    TasksListParams,
    TreeParams,
    _check_batch_starts,
    _crash_on_error,
    _failure,
    _Params,
    prepare_socket,
)
from weald.supervisors import ChildSpec

__all__ = ["FAILOVER_WAIT", "ClusterDrainParams", "Front", "FrontServer", "NodeDown", "NodeRow", "check_front_config"]

logger = logging.getLogger("weald.runtime")

FAILOVER_WAIT: Final = 30.0
"""Seconds past a lease a request waits for its session's node to come back or be replaced."""
_NODES_FRESH: Final = 0.5  # seconds a read of the nodes table is reused
_CONNECT_TIMEOUT: Final = 3.0  # seconds to connect to a node and pass the handshake (a frozen node does neither)
_RETRY_PAUSE: Final = 0.1
_ADOPT_BATCH: Final = 2000


class NodeDown(Exception):
    """A node could not be reached (connection refused, handshake failed or timed out)."""


@attrs.frozen
class NodeRow:
    """A node as the front knows it, from its row in the nodes table."""

    node_id: str
    epoch: int
    live: bool
    address: str | None
    labels: dict[str, str]
    draining: bool
    awake: int
    asleep: int
    cpu: float
    sessions: int

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


class _ClientState:
    """What the front keeps for one client connection: its links to the nodes and its subscriptions."""

    def __init__(self) -> None:
        self.links: dict[str, NodeLink] = {}
        self.connecting: dict[str, trio.Event] = {}
        # front subscription id -> [(node, the node's subscription id)]
        self.subs: dict[str, list[tuple[str, str]]] = {}
        self.by_node_sub: dict[tuple[str, str], str] = {}


class FrontServer(Server):
    """The front's JSON-RPC server: `Server`'s socket, framing and limits, with the front's method table.

    Args:
        daemon: the `Front`.
        socket_path: where to listen.
    """

    def __init__(self, daemon: Front, socket_path: Path | None = None) -> None:
        super().__init__(daemon, socket_path)
        self._front = daemon
        self._backend: Any = daemon.system.store.backend  # a PostgresBackend: the cluster's tables
        self._secret = daemon.secret
        self._tls = daemon.tls
        self._nodes: dict[str, NodeRow] = {}
        self._nodes_at = -1e9
        self._nodes_lock = trio.Lock()
        self._owners: dict[str, str] = {}  # agent id -> node, as last looked up
        self._placed: dict[str, int] = {}  # sessions placed on each node since its row was read
        self._recovering: dict[str, trio.Event] = {}  # dead node -> set once its sessions are adopted
        self._clients: dict[int, _ClientState] = {}
        self._control = _ClientState()  # the front's own links (adoption, drains, the relay)
        self._links_nursery: trio.Nursery | None = None
        self._links_ready = trio.Event()
        self._sub_ids = itertools.count(1)
        self._policy = _load_policy(daemon.config.cluster.placement)
        self.retried_prompts = 0
        self.failovers = 0
        # Each method: its params (checked as a node checks them) and the front's handler.
        self._methods = {
            "agent.start": (AgentStartParams, self._f_agent_start),
            "agents.start": (AgentsStartParams, self._f_agents_start),
            "agent.prompt": (AgentPromptParams, self._f_agent_prompt),
            "agent.abort": (AgentParams, self._by_agent("agent.abort")),
            "agent.stop": (AgentParams, self._f_agent_stop),
            "agent.send": (AgentSendParams, self._by_agent("agent.send", retry=False)),
            "agent.hibernate": (AgentParams, self._by_agent("agent.hibernate")),
            "agent.wake": (AgentParams, self._by_agent("agent.wake")),
            "agent.compact": (AgentParams, self._by_agent("agent.compact", retry=False)),
            "agent.history": (AgentHistoryParams, self._by_agent("agent.history", anywhere=True)),
            "agent.list": (AgentListParams, self._f_agent_list),
            "sessions.page": (SessionsPageParams, self._f_sessions_page),
            "debug_state": (DebugStateParams, self._f_debug_state),
            "tree": (TreeParams, self._f_tree),
            "tasks.list": (TasksListParams, self._f_any_node("tasks.list")),
            "permission.list": (OpenPromptsParams, self._f_open_prompts("permission.list")),
            "permission.respond": (PermissionRespondParams, self._f_answer("permission.respond")),
            "ask_user.list": (OpenPromptsParams, self._f_open_prompts("ask_user.list")),
            "ask_user.respond": (AskUserRespondParams, self._f_answer("ask_user.respond")),
            "actor.snapshot": (ActorSnapshotParams, self._f_actor("actor.snapshot")),
            "actor.restart": (ActorPathParams, self._f_actor("actor.restart")),
            "actors.list": (ActorsListParams, self._f_actors_list),
            "observer.url": (NoParams, self._observer_url),
            "events.subscribe": (EventsSubscribeParams, self._f_events_subscribe),
            "events.unsubscribe": (EventsUnsubscribeParams, self._f_events_unsubscribe),
            "events.query": (EventsQueryParams, self._f_events_query),
            "metrics.series": (MetricsSeriesParams, self._f_metrics_series),
            "fault.inject": (FaultInjectParams, self._f_each("fault.inject")),
            "fault.clear": (FaultClearParams, self._f_each("fault.clear")),
            "fault.list": (NoParams, self._f_fault_list),
            "mcp.servers": (NoParams, self._f_mcp_servers),
            "mcp.resources.list": (McpServerParams, self._f_any_node("mcp.resources.list")),
            "mcp.resources.read": (McpReadParams, self._f_any_node("mcp.resources.read")),
            "mcp.resources.subscribe": (McpReadParams, self._f_any_node("mcp.resources.subscribe")),
            "mcp.resources.unsubscribe": (McpReadParams, self._f_any_node("mcp.resources.unsubscribe")),
            "mcp.prompts.list": (McpServerParams, self._f_any_node("mcp.prompts.list")),
            "mcp.prompts.get": (McpPromptParams, self._f_any_node("mcp.prompts.get")),
            "daemon.status": (NoParams, self._f_status),
            "daemon.stop": (NoParams, self._daemon_stop),
            "history.gc": (NoParams, self._f_each("history.gc")),
            "config.reload": (NoParams, self._f_each("config.reload")),
            # Every node keeps the trust records in memory: each records (the same row of the shared store).
            "config.trust": (ConfigTrustParams, self._f_each("config.trust")),
            "config.untrust": (ConfigUntrustParams, self._f_each("config.untrust")),
            "config.trusted": (NoParams, self._f_any_node("config.trusted")),
            "cluster.status": (NoParams, self._f_cluster_status),
            "cluster.drain": (ClusterDrainParams, self._f_cluster_drain),
        }

    # -- lifecycle ------------------------------------------------------------------------------

    async def _start(self) -> None:
        # Each task ending on an error crashes the server, so its supervisor restarts it.
        self.run_io(self._host_links, reply=_crash_on_error, name="node links")
        await self._links_ready.wait()
        self.run_io(self._watch_nodes, reply=_crash_on_error, name="node watch")
        self.run_io(self._relay_events, reply=_crash_on_error, name="event relay")
        if self._socket_path is not None:
            listener = self._listen(self._socket_path)
            self.run_io(self._serve_socket, listener, reply=_crash_on_error, name="socket listener")

    async def _host_links(self) -> None:
        """The nursery every node link's reader runs in (links outlive the requests that opened them)."""
        async with trio.open_nursery() as nursery:
            self._links_nursery = nursery
            self._links_ready.set()
            await trio.sleep_forever()

    def on_stop(self) -> None:
        for state in [*self._clients.values(), self._control]:
            for link in state.links.values():
                link.close()
        super().on_stop()

    async def _serve_connection(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream, peer: str) -> None:
        try:
            await super()._serve_connection(receive, send, peer)
        finally:
            state = self._clients.pop(id(send), None)
            if state is not None:
                for link in state.links.values():
                    link.close()  # the node reaps what this client started ephemeral, as a daemon does

    def _state(self, conn: Connection) -> _ClientState:
        if conn is self._local:
            return self._control
        key = id(conn._stream)
        state = self._clients.get(key)
        if state is None:
            state = self._clients[key] = _ClientState()
        return state

    # -- nodes -----------------------------------------------------------------------------------

    async def nodes(self, *, fresh: bool = False) -> dict[str, NodeRow]:
        """The nodes by id, from their rows (reread when older than `_NODES_FRESH`, or ``fresh``)."""
        async with self._nodes_lock:
            if not fresh and trio.current_time() - self._nodes_at < _NODES_FRESH:
                return self._nodes
            snapshot = await trio.to_thread.run_sync(self._backend.cluster_snapshot, 0)
            rows: dict[str, NodeRow] = {}
            for row in snapshot["nodes"]:
                info = row["info"] if isinstance(row["info"], dict) else {}
                rows[row["node_id"]] = NodeRow(
                    node_id=row["node_id"],
                    epoch=row["epoch"],
                    live=row["lease_until"] > snapshot["as_of"],
                    address=info.get("address"),
                    labels=dict(info.get("labels") or {}),
                    draining=bool(info.get("draining")),
                    awake=int(info.get("awake") or 0),
                    asleep=int(info.get("asleep") or 0),
                    cpu=float(info.get("cpu") or 0.0),
                    sessions=row["placed"],
                )
            self._nodes = rows
            self._nodes_at = trio.current_time()
            self._placed.clear()
            return rows

    async def _watch_nodes(self) -> None:
        """Keep the nodes fresh; close the links to a node whose lease ran out (its calls then fail over)."""
        while True:
            with contextlib.suppress(StoreError):
                nodes = await self.nodes(fresh=True)
                for node_id, row in nodes.items():
                    if not row.live:
                        self._close_links(node_id, f"node {node_id!r} lost its lease")
            await trio.sleep(_NODES_FRESH)

    def _close_links(self, node_id: str, why: str) -> None:
        for state in [*self._clients.values(), self._control]:
            link = state.links.get(node_id)
            if link is not None and not link.closed:
                link.error = why
                link.close()

    async def _link(self, state: _ClientState, node_id: str) -> NodeLink:
        """This client's link to ``node_id``, opened (and authenticated) on first use.

        Raises:
            NodeDown: the node cannot be reached or refused the front.
        """
        while True:
            link = state.links.get(node_id)
            if link is not None and not link.closed:
                return link
            opening = state.connecting.get(node_id)
            if opening is None:
                break
            await opening.wait()
        opening = state.connecting[node_id] = trio.Event()
        try:
            row = (await self.nodes()).get(node_id)
            if row is None or not row.address:
                raise NodeDown(f"node {node_id!r} serves no fronts (it was started without --listen)")
            link = NodeLink(node_id, row.address, self._secret, self._tls, self._notifier(state, node_id))
            try:
                await link.connect(_CONNECT_TIMEOUT)
            except (OSError, HandshakeError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                reason = str(exc) or type(exc).__name__
                raise NodeDown(f"node {node_id!r} at {row.address} cannot be reached: {reason}") from exc
            assert self._links_nursery is not None
            self._links_nursery.start_soon(link.run)
            state.links[node_id] = link
            return link
        finally:
            del state.connecting[node_id]
            opening.set()

    def _notifier(self, state: _ClientState, node_id: str) -> Callable[[str, Any], None]:
        """What a link does with a node's notification: relabelled, to its client."""

        def notify(method: str, params: Any) -> None:
            if not isinstance(params, dict):
                return
            if method == "event":
                front_sub = state.by_node_sub.get((node_id, str(params.get("subscription"))))
                if front_sub is None:
                    return
                event = params.get("event")
                if isinstance(event, dict):
                    event["node"] = node_id
                params["subscription"] = front_sub
            else:
                params["node"] = node_id
            conn = self._conn_of(state)
            if conn is not None:
                conn.notify(method, params)

        return notify

    def _conn_of(self, state: _ClientState) -> Connection | None:
        for conn in self._connections.values():
            if self._clients.get(id(conn._stream)) is state:
                return conn
        return None

    async def _call_node(
        self, conn: Connection, node_id: str, method: str, params: Any, *, control: bool = False
    ) -> dict[str, Any]:
        """One request to one node on the client's link (the front's own with ``control``).

        Raises:
            NodeDown: the node cannot be reached.
            LinkLost: the connection broke before the reply.
        """
        state = self._control if control else self._state(conn)
        link = await self._link(state, node_id)
        return await link.call(method, params)

    # -- where a session is ----------------------------------------------------------------------------

    async def _owner(self, agent_id: str, deadline: float) -> str | None:
        """The live node running ``agent_id`` (after a failover if its node died); None: it is placed nowhere.

        Raises:
            RPCError: the wait for its node passed ``deadline``.
        """
        while True:
            nodes = await self.nodes()
            cached = self._owners.get(agent_id)
            if cached is not None and (row := nodes.get(cached)) is not None and row.live:
                return cached
            found = (await trio.to_thread.run_sync(self._backend.placement, [agent_id])).get(agent_id)
            if found is None or found[0] is None:
                self._owners.pop(agent_id, None)
                return None
            owner, _, live = found
            if live:
                self._owners[agent_id] = owner
                return str(owner)
            if trio.current_time() > deadline:
                raise RPCError(APP_ERROR, f"agent {agent_id!r}: its node {owner!r} is dead and no node took it over")
            await self._recover(owner)

    async def _recover(self, dead: str) -> None:
        """Have the live nodes adopt the sessions of ``dead`` (its lease ran out): one recovery at a time per node."""
        running = self._recovering.get(dead)
        if running is not None:
            await running.wait()
            return
        done = self._recovering[dead] = trio.Event()
        try:
            await self._adopt_from(dead)
        finally:
            del self._recovering[dead]
            done.set()

    async def _adopt_from(self, dead: str) -> None:
        nodes = await self.nodes(fresh=True)
        row = nodes.get(dead)
        if row is not None and row.live:
            return  # it came back (or renewed in time)
        orphans = await trio.to_thread.run_sync(self._backend.placed_on, dead)
        if not orphans:
            return
        targets = [n for n in nodes.values() if n.live and not n.draining and n.address and n.node_id != dead]
        if not targets:
            await trio.sleep(_RETRY_PAUSE * 5)  # nobody to take them yet: the caller waits on
            return
        self.failovers += 1
        started = time.monotonic()
        shares = _split(orphans, targets)
        adopted = 0

        async def adopt(target: str, ids: list[str]) -> None:
            nonlocal adopted
            for first in range(0, len(ids), _ADOPT_BATCH):
                batch = ids[first : first + _ADOPT_BATCH]
                try:
                    outcome = await self._call_node(self._local, target, "cluster.adopt", {"agent_ids": batch})
                except (NodeDown, LinkLost) as exc:
                    logger.warning("front: node %s could not adopt sessions of %s: %s", target, dead, exc)
                    return
                for agent_id in (outcome.get("result") or {}).get("adopted", []):
                    self._owners[agent_id] = target
                    adopted += 1

        async with trio.open_nursery() as nursery:
            for target, ids in shares.items():
                nursery.start_soon(adopt, target, ids)
        self.system.events.publish(
            "front.failover",
            self.path,
            {
                "node": dead,
                "sessions": len(orphans),
                "adopted": adopted,
                "seconds": round(time.monotonic() - started, 3),
            },
        )

    async def _to_owner(
        self,
        conn: Connection,
        method: str,
        agent_id: str,
        params: dict[str, Any],
        *,
        retries: int,
        anywhere: bool = False,
    ) -> dict[str, Any]:
        """Send a request about ``agent_id`` to its node, following it through moves and failovers.

        ``retries``: how many times a request lost with its connection is sent
        again (0: never, when it may have run; -1: until the deadline, for reads).
        ``anywhere``: a session placed nowhere (stopped) is asked of any node.
        """
        lease = self._front.config.store.lease
        deadline = trio.current_time() + lease + FAILOVER_WAIT
        lost = 0
        while True:
            owner = await self._owner(agent_id, deadline)
            if owner is None:
                if anywhere:
                    return await self._any_node(conn, method, params)
                return _failure(NOT_FOUND, f"no running agent {agent_id!r}; agent.list shows the running ones")
            try:
                outcome = await self._call_node(conn, owner, method, params)
            except NodeDown:
                self._owners.pop(agent_id, None)
                if trio.current_time() > deadline:
                    raise
                await trio.sleep(_RETRY_PAUSE * 2)
                continue
            except LinkLost as exc:
                self._owners.pop(agent_id, None)
                lost += 1
                if retries >= 0 and lost > retries:
                    raise RPCError(
                        APP_ERROR,
                        f"{method}: the connection to node {owner!r}, which runs agent {agent_id!r}, was lost "
                        f"before it answered ({exc}); it may or may not have been done",
                    ) from exc
                if method == "agent.prompt":
                    self.retried_prompts += 1
                continue
            error = outcome.get("error")
            if isinstance(error, dict) and error.get("code") == NOT_OWNER:
                self._owners.pop(agent_id, None)
                if trio.current_time() > deadline:
                    return outcome
                await trio.sleep(_RETRY_PAUSE)
                continue
            if isinstance(error, dict) and error.get("code") == NOT_FOUND and self._owners.pop(agent_id, None):
                # Looked up in a cache: the session may have moved since; the placement says.
                found = (await trio.to_thread.run_sync(self._backend.placement, [agent_id])).get(agent_id)
                if found is not None and found[0] not in (None, owner):
                    continue
            self._owners[agent_id] = owner
            return outcome

    def _by_agent(
        self, method: str, *, retry: bool = True, anywhere: bool = False
    ) -> Callable[[Connection, Any], Awaitable[Any]]:
        async def handler(conn: Connection, p: Any) -> Any:
            return await self._outcome(
                self._to_owner(conn, method, p.agent_id, _raw(p), retries=-1 if retry else 0, anywhere=anywhere)
            )

        return handler

    async def _outcome(self, pending: Awaitable[dict[str, Any]]) -> Any:
        """A node's outcome as this server's handler result: its result, or its error raised as the node's."""
        outcome = await pending
        error = outcome.get("error")
        if error is not None:
            raise RPCError(int(error.get("code", APP_ERROR)), str(error.get("message")), error.get("data"))
        return outcome.get("result")

    async def _live(self) -> list[str]:
        return sorted(n.node_id for n in (await self.nodes()).values() if n.live and n.address)

    async def _any_node(self, conn: Connection, method: str, params: Any) -> dict[str, Any]:
        """Send a request any live node can answer (it reads the shared store); the next is tried if one fails."""
        errors = []
        for node_id in await self._live():
            try:
                return await self._call_node(conn, node_id, method, params)
            except (NodeDown, LinkLost) as exc:
                errors.append(str(exc))
        raise RPCError(APP_ERROR, f"{method}: no node of the cluster answers ({'; '.join(errors) or 'none is live'})")

    def _f_any_node(self, method: str) -> Callable[[Connection, Any], Awaitable[Any]]:
        async def handler(conn: Connection, p: Any) -> Any:
            return await self._outcome(self._any_node(conn, method, _raw(p)))

        return handler

    async def _each(self, conn: Connection, method: str, params: Any) -> dict[str, dict[str, Any]]:
        """The outcome of ``method`` on every live node, by node id (a node that cannot be reached says so)."""
        outcomes: dict[str, dict[str, Any]] = {}

        async def one(node_id: str) -> None:
            try:
                outcomes[node_id] = await self._call_node(conn, node_id, method, params)
            except (NodeDown, LinkLost) as exc:
                outcomes[node_id] = _failure(APP_ERROR, str(exc))

        async with trio.open_nursery() as nursery:
            for node_id in await self._live():
                nursery.start_soon(one, node_id)
        return dict(sorted(outcomes.items()))

    def _f_each(self, method: str) -> Callable[[Connection, Any], Awaitable[Any]]:
        async def handler(conn: Connection, p: Any) -> Any:
            outcomes = await self._each(conn, method, _raw(p))
            if outcomes and all("error" in outcome for outcome in outcomes.values()):
                return await self._outcome(_ready(next(iter(outcomes.values()))))
            merged: dict[str, Any] = {}
            for outcome in outcomes.values():
                if isinstance(outcome.get("result"), dict) and not merged:
                    merged.update(outcome["result"])
            merged["nodes"] = outcomes
            return merged

        return handler

    # -- starting sessions -----------------------------------------------------------------------------

    async def _choose(self, start: dict[str, Any], batch: dict[str, int] | None = None) -> str:
        """The node a new session goes to (see the module docstring); ``batch``: what a batch placed so far.

        Raises:
            RPCError: no live node takes new sessions.
        """
        nodes = await self.nodes()
        placed = self._placed if batch is None else batch
        live = [n for n in nodes.values() if n.live and n.address and not n.draining]
        if not live:
            raise RPCError(
                APP_ERROR, "no live node of the cluster takes new sessions (weald cluster status shows them)"
            )
        if self._policy is not None:
            chosen = self._policy(dict(start), [n.to_dict() for n in live])
            if isinstance(chosen, str) and any(n.node_id == chosen for n in live):
                return chosen
        place = str(start.get("project") or start.get("working_dir") or "")
        pinned = [n for n in live if _pins(n.labels.get("project"), place)]
        live = pinned or [n for n in live if not n.labels.get("project")] or live
        # CPU only breaks ties: it is a moment's reading, the same for a whole batch, and a node busy
        # for a second when its row was written would otherwise get none of a batch of 1,000.
        best = min(
            live,
            key=lambda n: (
                n.awake,
                n.sessions + placed.get(n.node_id, 0),
                round(n.cpu, 1),
                n.node_id,
            ),
        )
        placed[best.node_id] = placed.get(best.node_id, 0) + 1
        return best.node_id

    async def _f_agent_start(self, conn: Connection, p: AgentStartParams) -> Any:
        self._refuse_when_stopping("agent.start")
        params = _raw(p)
        if p.agent_id is not None:
            found = (await trio.to_thread.run_sync(self._backend.placement, [p.agent_id])).get(p.agent_id)
            if found is not None and found[0] is not None and found[2]:
                # Placed on a live node already: that node answers (it runs it, or says why not).
                return await self._outcome(self._start_on(conn, found[0], "agent.start", params))
        node_id = await self._choose(params)
        return await self._outcome(self._start_on(conn, node_id, "agent.start", params))

    async def _start_on(self, conn: Connection, node_id: str, method: str, params: Any) -> dict[str, Any]:
        try:
            outcome = await self._call_node(conn, node_id, method, params)
        except (NodeDown, LinkLost) as exc:
            return _failure(APP_ERROR, f"{method}: node {node_id!r} failed before it answered: {exc}")
        result = outcome.get("result")
        if isinstance(result, dict):
            if "agent_id" in result:
                self._owners[result["agent_id"]] = node_id
            for item in result.get("results") or []:
                inner = item.get("result") if isinstance(item, dict) else None
                if isinstance(inner, dict) and "agent_id" in inner:
                    self._owners[inner["agent_id"]] = node_id
        return outcome

    async def _f_agents_start(self, conn: Connection, p: AgentsStartParams) -> Any:
        """``agents.start``: each entry placed, one request per node; each answered in its place."""
        self._refuse_when_stopping("agents.start")
        results, valid = _check_batch_starts(p.agents)
        groups: dict[str, list[tuple[int, Any]]] = {}
        placed: dict[str, int] = {}  # the batch's own count: the nodes' rows do not show it yet
        await self.nodes(fresh=True)
        for index, raw, checked in valid:
            node_id = await self._choose(_raw(checked), placed)
            groups.setdefault(node_id, []).append((index, raw))

        async def batch(node_id: str, entries: list[tuple[int, Any]]) -> None:
            outcome = await self._start_on(conn, node_id, "agents.start", {"agents": [raw for _, raw in entries]})
            replies = (outcome.get("result") or {}).get("results")
            for position, (index, _) in enumerate(entries):
                if isinstance(replies, list) and position < len(replies):
                    results[index] = replies[position]
                else:
                    results[index] = {"error": outcome.get("error") or {"code": APP_ERROR, "message": "no answer"}}

        async with trio.open_nursery() as nursery:
            for node_id, entries in groups.items():
                nursery.start_soon(batch, node_id, entries)
        return {"results": results}

    async def _f_agent_prompt(self, conn: Connection, p: AgentPromptParams) -> Any:
        """``agent.prompt`` to its session's node; lost with its node, sent once more with the same key."""
        self._refuse_when_stopping("agent.prompt")
        params = _raw(p)
        if p.idempotency_key is None:
            params["idempotency_key"] = f"front-{uuid.uuid4().hex}"
        outcome = await self._to_owner(conn, "agent.prompt", p.agent_id, params, retries=1)
        result = outcome.get("result")
        if isinstance(result, dict) and not result.get("ok") and "StoreFencedError" in str(result.get("error")):
            # Its node lost the session mid-turn (frozen past its lease): nothing of the turn was committed
            # there. The new owner runs it, once (the same key).
            self._owners.pop(p.agent_id, None)
            self.retried_prompts += 1
            outcome = await self._to_owner(conn, "agent.prompt", p.agent_id, params, retries=1)
        return await self._outcome(_ready(outcome))

    async def _f_agent_stop(self, conn: Connection, p: AgentParams) -> Any:
        outcome = await self._to_owner(conn, "agent.stop", p.agent_id, _raw(p), retries=-1)
        error = outcome.get("error")
        if isinstance(error, dict) and error.get("code") == NOT_FOUND:
            return {"stopped": False}
        self._owners.pop(p.agent_id, None)
        return await self._outcome(_ready(outcome))

    # -- merged views ------------------------------------------------------------------------------------

    async def _f_agent_list(self, conn: Connection, p: AgentListParams) -> Any:
        """Every node's list merged: a session's row from the node that runs it, labelled with that node.

        Each node lists the one store in id order, so a page (``limit``,
        ``after``) is each node's page of the same ids, merged and cut to
        ``limit``; a node's row of a session it does not run gives way to the
        row of the node that runs it.
        """
        outcomes = await self._each(conn, "agent.list", _raw(p))
        rows: dict[str, dict[str, Any]] = {}
        order: list[str] = []
        paged = p.limit is not None or p.after is not None or p.agent_id is not None
        more = False
        limit = 0
        for node_id, outcome in outcomes.items():
            result = outcome.get("result")
            if paged:
                if not isinstance(result, dict):
                    continue
                more = more or result.get("next_after") is not None
                limit = max(limit, int(result.get("limit") or 0))
                result = result.get("rows")
            for row in result or []:
                agent_id = row.get("agent_id")
                here = row.get("state") not in ("not running", "stopped")
                if agent_id not in rows:
                    order.append(agent_id)
                    rows[agent_id] = {**row, "node": node_id if here else None}
                elif here:
                    rows[agent_id] = {**row, "node": node_id}
        if not paged:
            return [rows[agent_id] for agent_id in order]
        if not outcomes or all("error" in outcome for outcome in outcomes.values()):
            return await self._outcome(_ready(next(iter(outcomes.values()), _failure(APP_ERROR, "no node is up"))))
        ids = sorted(rows)  # the ids one node saw and another not (a start between the two reads) in their place
        more = more or len(ids) > limit
        page = ids[:limit]
        next_after = page[-1] if more and page else None
        return {"rows": [rows[agent_id] for agent_id in page], "next_after": next_after, "limit": limit}

    async def _f_sessions_page(self, conn: Connection, p: SessionsPageParams) -> Any:
        """A page of every node's sessions: each node's first ``offset + limit`` rows, merged and cut."""
        params = _raw(p)
        if p.state == "stopped":
            return await self._outcome(self._any_node(conn, "sessions.page", params))
        params.update(offset=0, limit=min(p.offset + p.limit, 500))
        outcomes = await self._each(conn, "sessions.page", params)
        rows: list[dict[str, Any]] = []
        total = 0
        counts = {"active": 0, "awake": 0, "asleep": 0}
        projects: dict[str, int] = {}
        models: dict[str, int] = {}
        for node_id, outcome in outcomes.items():
            page = outcome.get("result")
            if not isinstance(page, dict):
                continue
            total += int(page.get("total") or 0)
            for key in counts:
                counts[key] += int((page.get("counts") or {}).get(key) or 0)
            for item in page.get("projects") or []:
                projects[item["working_dir"]] = projects.get(item["working_dir"], 0) + int(item["sessions"])
            for item in page.get("models") or []:
                models[item["model"]] = models.get(item["model"], 0) + int(item["sessions"])
            rows += [{**row, "node": node_id} for row in page.get("rows") or []]
        descending = p.order == "desc" if p.order is not None else p.sort in ("state", "started")
        if p.sort == "state":
            rows.sort(key=lambda r: (bool(r.get("awake")) != descending, r.get("agent_id", "")))
        elif p.sort == "id":
            rows.sort(key=lambda r: r.get("agent_id", ""), reverse=descending)
        elif p.sort in ("project", "model"):
            field = "working_dir" if p.sort == "project" else "model"
            rows.sort(key=lambda r: (str(r.get(field) or ""), r.get("agent_id", "")), reverse=descending)
        return {
            "total": total,
            "offset": p.offset,
            "limit": p.limit,
            "counts": counts,
            "projects": [{"working_dir": k, "sessions": v} for k, v in sorted(projects.items(), key=lambda i: -i[1])][
                :200
            ],
            "models": [{"model": k, "sessions": v} for k, v in sorted(models.items(), key=lambda i: -i[1])][:200],
            "rows": rows[p.offset : p.offset + p.limit],
            "nodes": {node_id: _error_of(outcome) for node_id, outcome in outcomes.items() if "error" in outcome},
        }

    async def _f_tree(self, conn: Connection, p: TreeParams) -> Any:
        """A session's subtree from its node; anything else, every node's tree merged by path, each part labelled."""
        session = _session_of(p.path)
        if session:
            return await self._outcome(self._to_owner(conn, "tree", session, _raw(p), retries=-1))
        outcomes = await self._each(conn, "tree", _raw(p))
        merged: dict[str, Any] | None = None
        for node_id, outcome in outcomes.items():
            root = outcome.get("result")
            if not isinstance(root, dict):
                continue
            merged = _merge_tree(merged, root, node_id)
        if merged is None:
            errors = "; ".join(f"{n}: {_error_of(o)}" for n, o in outcomes.items())
            raise RPCError(NOT_FOUND, f"no live actor at {p.path} on any node ({errors or 'no live node'})")
        merged["cluster"] = {"nodes": sorted(outcomes)}
        return merged

    async def _f_actors_list(self, conn: Connection, p: ActorsListParams) -> Any:
        params = _raw(p)
        params.update(offset=0, limit=min(p.offset + p.limit, 500))
        outcomes = await self._each(conn, "actors.list", params)
        rows: list[dict[str, Any]] = []
        total = 0
        for node_id, outcome in outcomes.items():
            page = outcome.get("result")
            if isinstance(page, dict):
                total += int(page.get("total") or 0)
                rows += [{**row, "node": node_id} for row in page.get("rows") or []]
        numeric = p.sort in ("mailbox", "handled", "restarts", "memory")
        descending = p.order == "desc" if p.order is not None else numeric
        key = p.sort
        rows.sort(key=lambda r: (r.get(key) or 0, r["path"]) if numeric else (str(r.get(key)), r["path"]))
        if descending:
            rows.reverse()
        return {"total": total, "offset": p.offset, "limit": p.limit, "rows": rows[p.offset : p.offset + p.limit]}

    async def _f_debug_state(self, conn: Connection, p: DebugStateParams) -> Any:
        if p.agent_id is not None:
            return await self._outcome(self._to_owner(conn, "debug_state", p.agent_id, _raw(p), retries=-1))
        outcomes = await self._each(conn, "debug_state", _raw(p))
        return {
            "daemon": await self._f_status(conn, NoParams()),
            "nodes": {n: o.get("result") if "result" in o else _error_of(o) for n, o in outcomes.items()},
        }

    def _f_open_prompts(self, method: str) -> Callable[[Connection, Any], Awaitable[Any]]:
        async def handler(conn: Connection, p: OpenPromptsParams) -> Any:
            if p.agent_id is not None:
                return await self._outcome(self._to_owner(conn, method, p.agent_id, _raw(p), retries=-1))
            outcomes = await self._each(conn, method, {})
            return [{**item, "node": n} for n, o in outcomes.items() for item in o.get("result") or []]

        return handler

    def _f_answer(self, method: str) -> Callable[[Connection, Any], Awaitable[Any]]:
        """An answer to a permission request or a question: the node that asked it is the one that knows it."""

        async def handler(conn: Connection, p: Any) -> Any:
            outcomes = await self._each(conn, method, _raw(p))
            for outcome in outcomes.values():
                if "result" in outcome:
                    return outcome["result"]
            for outcome in outcomes.values():
                error = outcome.get("error") or {}
                if error.get("code") not in (NOT_FOUND, APP_ERROR):
                    return await self._outcome(_ready(outcome))
            first = next(iter(outcomes.values()), None)
            if first is None:
                raise RPCError(APP_ERROR, f"{method}: no node of the cluster is live")
            return await self._outcome(_ready(first))

        return handler

    def _f_actor(self, method: str) -> Callable[[Connection, Any], Awaitable[Any]]:
        async def handler(conn: Connection, p: Any) -> Any:
            session = _session_of(p.path)
            if session:
                return await self._outcome(self._to_owner(conn, method, session, _raw(p), retries=-1))
            raise RPCError(
                INVALID_PARAMS,
                f"invalid params for {method}: {p.path} is each node's own; through a front, name an actor of a "
                "session (/sessions/ID/...), or ask the node itself",
                {"field": "path"},
            )

        return handler

    async def _f_events_subscribe(self, conn: Connection, p: EventsSubscribeParams) -> Any:
        """A subscription on the agent's node, or on every node: one id, each event labelled with its node."""
        state = self._state(conn)
        front_sub = f"sub-{next(self._sub_ids)}"
        params = _raw(p)
        if p.agent_id is not None:
            deadline = trio.current_time() + self._front.config.store.lease + FAILOVER_WAIT
            owner = await self._owner(p.agent_id, deadline)
            if owner is None:
                raise RPCError(NOT_FOUND, f"no running agent {p.agent_id!r}; agent.list shows the running ones")
            targets = [owner]
        else:
            targets = await self._live()
        state.subs[front_sub] = []
        for node_id in targets:
            try:
                outcome = await self._call_node(conn, node_id, "events.subscribe", params)
            except (NodeDown, LinkLost) as exc:
                if p.agent_id is not None:
                    raise RPCError(APP_ERROR, f"events.subscribe: {exc}") from exc
                continue
            node_sub = (outcome.get("result") or {}).get("subscription")
            if node_sub is None:
                await self._outcome(_ready(outcome))
                continue
            state.subs[front_sub].append((node_id, node_sub))
            state.by_node_sub[(node_id, node_sub)] = front_sub
        return {"subscription": front_sub, "nodes": [node for node, _ in state.subs[front_sub]]}

    async def _f_events_unsubscribe(self, conn: Connection, p: EventsUnsubscribeParams) -> Any:
        state = self._state(conn)
        parts = state.subs.pop(p.subscription, None)
        if parts is None:
            raise RPCError(NOT_FOUND, f"no subscription {p.subscription!r} on this connection")
        for node_id, node_sub in parts:
            state.by_node_sub.pop((node_id, node_sub), None)
            with contextlib.suppress(NodeDown, LinkLost):
                await self._call_node(conn, node_id, "events.unsubscribe", {"subscription": node_sub})
        return {"ok": True}

    async def _f_events_query(self, conn: Connection, p: EventsQueryParams) -> Any:
        """The newest events of every node, merged by time (each with its node); ``before`` pages each node alike."""
        outcomes = await self._each(conn, "events.query", _raw(p))
        events: list[dict[str, Any]] = []
        held = published = 0
        for node_id, outcome in outcomes.items():
            page = outcome.get("result")
            if isinstance(page, dict):
                events += [{**event, "node": node_id} for event in page.get("events") or []]
                held += int(page.get("held") or 0)
                published += int(page.get("published") or 0)
        events.sort(key=lambda e: e.get("time", 0.0))
        return {
            "events": events[-p.limit :] if p.limit else [],
            "next_before": None,
            "held": held,
            "published": published,
        }

    async def _f_metrics_series(self, conn: Connection, p: MetricsSeriesParams) -> Any:
        """The nodes' samples summed (the first live node's clock and cursor), each node's own under ``nodes``."""
        live = await self._live()
        if not live:
            raise RPCError(NOT_FOUND, "no live node samples metrics")
        first = await self._outcome(_labelled_call(self, conn, live[0], "metrics.series", _raw(p)))
        others = await self._each(conn, "metrics.series", {"since": 0})
        points = len(first.get("t") or [])
        nodes = {live[0]: first.get("values") or {}}
        summed = {name: list(values) for name, values in (first.get("values") or {}).items()}
        for node_id, outcome in others.items():
            if node_id == live[0] or not isinstance(outcome.get("result"), dict):
                continue
            values = outcome["result"].get("values") or {}
            nodes[node_id] = {name: series[-points:] if points else [] for name, series in values.items()}
            for name, series in nodes[node_id].items():
                target = summed.get(name)
                if target is None:
                    continue
                offset = len(target) - len(series)
                for index, value in enumerate(series):
                    at = offset + index
                    if at >= 0 and isinstance(value, int | float) and isinstance(target[at], int | float):
                        target[at] += value
        return {**first, "values": summed, "nodes": nodes}

    async def _f_fault_list(self, conn: Connection, p: NoParams) -> Any:
        outcomes = await self._each(conn, "fault.list", {})
        for outcome in outcomes.values():
            if "error" in outcome:
                return await self._outcome(_ready(outcome))
        faults = [{**f, "node": n} for n, o in outcomes.items() for f in (o.get("result") or {}).get("faults", [])]
        return {
            "faults": faults,
            "statistics": {n: (o.get("result") or {}).get("statistics") for n, o in outcomes.items()},
        }

    async def _f_mcp_servers(self, conn: Connection, p: NoParams) -> Any:
        outcomes = await self._each(conn, "mcp.servers", {})
        return [{**row, "node": n} for n, o in outcomes.items() for row in o.get("result") or []]

    # -- the front's own ---------------------------------------------------------------------------------

    async def _f_status(self, conn: Connection, p: NoParams) -> dict[str, Any]:
        nodes = await self.nodes()
        statuses = await self._each(conn, "daemon.status", {})
        counts = [o["result"] for o in statuses.values() if isinstance(o.get("result"), dict)]
        return {
            "role": "front",
            "pid": os.getpid(),
            "version": VERSION,
            "socket": str(self._socket_path) if self._socket_path else None,
            "uptime": round(time.time() - self._front.started_at, 3),
            "agents": sum(int(c.get("agents") or 0) for c in counts),
            "hibernated": sum(int(c.get("hibernated") or 0) for c in counts),
            "connections": len(self._connections),
            "store": mask_url(self._front.config.store.url or ""),
            "store_kind": "postgresql",
            "node": None,
            "cluster": {
                "nodes": [
                    {"node_id": n.node_id, "live": n.live, "address": n.address, "labels": n.labels}
                    for n in nodes.values()
                ],
                "failovers": self.failovers,
                "retried_prompts": self.retried_prompts,
            },
            "max_message_bytes": self._max_message_bytes,
            "front": self._front_status(),
        }

    async def _f_cluster_status(self, conn: Connection, p: NoParams) -> Any:
        return await trio.to_thread.run_sync(cluster_status, self._backend)

    async def _f_cluster_drain(self, conn: Connection, p: ClusterDrainParams) -> Any:
        """Move every session of a node to the others, then let it stop (see `drain`)."""
        self._refuse_when_stopping("cluster.drain")
        return await self.drain(p.node, stop=p.stop, timeout=p.timeout)

    async def drain(self, node_id: str, *, stop: bool = True, timeout: float = 300.0) -> dict[str, Any]:
        """Hand each session of ``node_id`` to the least loaded other node, then stop the node.

        The node is marked draining first (no front places new sessions on
        it). Then, a batch at a time: the node puts each session to sleep
        once idle and hands its placement over (epoch + 1); the new owner
        adopts it asleep; it wakes there at its next message. Sessions busy
        past ``timeout`` stay (``busy``), and the node then keeps running.
        """
        nodes = await self.nodes(fresh=True)
        row = nodes.get(node_id)
        if row is None:
            raise RPCError(NOT_FOUND, f"no node {node_id!r} in this cluster; weald cluster status lists them")
        if not row.live:
            raise RPCError(APP_ERROR, f"node {node_id!r} is not live; its sessions go to the others on their own")
        others = [n for n in nodes.values() if n.live and n.address and not n.draining and n.node_id != node_id]
        if not others:
            raise RPCError(APP_ERROR, f"node {node_id!r} is the only live node: there is nowhere to move its sessions")
        await trio.to_thread.run_sync(self._backend.set_node_info, node_id, {"draining": True})
        self._nodes_at = -1e9
        started = time.monotonic()
        moved: list[str] = []
        busy: list[str] = []
        failed: list[str] = []
        sessions = await trio.to_thread.run_sync(self._backend.placed_on, node_id)
        shares = _split(sessions, others)
        for target, ids in shares.items():
            for first in range(0, len(ids), _ADOPT_BATCH):
                batch = ids[first : first + _ADOPT_BATCH]
                handed = await self._outcome(
                    _labelled_call(
                        self,
                        self._local,
                        node_id,
                        "cluster.handover",
                        {"agent_ids": batch, "to": target, "timeout": timeout},
                    )
                )
                busy += handed.get("busy", [])
                failed += handed.get("missing", [])
                ids_handed = handed.get("handed", [])
                if not ids_handed:
                    continue
                adopted = await self._outcome(
                    _labelled_call(self, self._local, target, "cluster.adopt", {"agent_ids": ids_handed})
                )
                for agent_id in adopted.get("adopted", []):
                    self._owners[agent_id] = target
                    moved.append(agent_id)
                failed += adopted.get("refused", [])
        stopped = False
        if stop and not busy:
            with contextlib.suppress(NodeDown, LinkLost):
                await self._call_node(self._local, node_id, "daemon.stop", {}, control=True)
                stopped = True
        else:
            await trio.to_thread.run_sync(self._backend.set_node_info, node_id, {"draining": False})
        report = {
            "node": node_id,
            "moved": len(moved),
            "busy": busy,
            "failed": failed,
            "stopped": stopped,
            "seconds": round(time.monotonic() - started, 3),
            "to": {target: len(ids) for target, ids in shares.items()},
        }
        self.system.events.publish("front.drained", self.path, report)
        return report

    # -- the observer's events --------------------------------------------------------------------------

    async def _relay_events(self) -> None:
        """While someone watches this front's bus (an observer's viewer), every node's events come onto it, labelled."""
        bus = self.system.events
        while True:
            if not bus.statistics()["subscribers"]:
                await trio.sleep(0.5)
                continue
            async with trio.open_nursery() as nursery:
                for node_id in await self._live():
                    nursery.start_soon(self._relay_from, node_id)

                async def until_unwatched() -> None:
                    while bus.statistics()["subscribers"]:  # noqa: ASYNC110 - the bus has no event for it
                        await trio.sleep(1.0)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until_unwatched)

    async def _relay_from(self, node_id: str) -> None:
        bus = self.system.events

        def relay(method: str, params: Any) -> None:
            if method != "event" or not isinstance(params, dict):
                return
            event = params.get("event")
            if isinstance(event, dict):
                data = dict(event.get("data") or {})
                data["node"] = node_id
                bus.publish(str(event.get("topic")), str(event.get("source", "")), data)

        row = (await self.nodes()).get(node_id)
        if row is None or not row.address:
            return
        link = NodeLink(node_id, row.address, self._secret, self._tls, relay)
        try:
            await link.connect(_CONNECT_TIMEOUT)
            assert self._links_nursery is not None
            self._links_nursery.start_soon(link.run)
            await link.call("events.subscribe", {"topics": ["*"]})
            await link.ended.wait()
        except (OSError, HandshakeError, trio.TooSlowError, trio.BrokenResourceError, LinkLost) as exc:
            logger.warning("front: cannot relay node %s's events: %s", node_id, exc)
        finally:
            link.close()


class ClusterDrainParams(_Params):
    node: str
    stop: bool = True
    timeout: float = 300.0


async def _labelled_call(
    server: FrontServer, conn: Connection, node_id: str, method: str, params: Any
) -> dict[str, Any]:
    try:
        return await server._call_node(conn, node_id, method, params, control=conn is server._local)
    except (NodeDown, LinkLost) as exc:
        return _failure(APP_ERROR, f"{method}: node {node_id!r}: {exc}")


async def _ready(outcome: dict[str, Any]) -> dict[str, Any]:
    await trio.lowlevel.checkpoint()
    return outcome


def _raw(params: Any) -> dict[str, Any]:
    """A method's checked params, as plain data to send on (defaults included)."""
    raw: dict[str, Any] = msgspec.to_builtins(params)
    return raw


def _error_of(outcome: dict[str, Any]) -> str:
    error = outcome.get("error") or {}
    return str(error.get("message", ""))


def _session_of(path: str) -> str:
    parts = path.rstrip("/").split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "sessions" and parts[2] else ""


def _pins(label: str | None, place: str) -> bool:
    """Whether a node's ``project`` label (a directory) pins a session of ``place`` to it."""
    if not label or not place:
        return False
    base = label.rstrip("/") or "/"
    return place == base or place.startswith(base + "/") or base == "/"


def _split(ids: Sequence[str], nodes: Sequence[NodeRow]) -> dict[str, list[str]]:
    """``ids`` shared among ``nodes``, more to those with fewer sessions (each ends up near the same total)."""
    totals = {n.node_id: n.sessions for n in nodes}
    shares: dict[str, list[str]] = {n.node_id: [] for n in nodes}
    for agent_id in ids:
        target = min(totals, key=lambda node: (totals[node], node))
        shares[target].append(agent_id)
        totals[target] += 1
    return {node: share for node, share in shares.items() if share}


def _merge_tree(into: dict[str, Any] | None, node: dict[str, Any], node_id: str) -> dict[str, Any]:
    """Merge one node's tree into the cluster's: the same path once, its ``nodes`` listed; the rest labelled."""
    if into is None:
        copy = {**node, "nodes": [node_id], "children": []}
        for child in node.get("children") or []:
            copy["children"].append(_merge_tree(None, child, node_id))
        if _session_of(node.get("path", "")):
            copy["node"] = node_id
        return copy
    into["nodes"] = [*into.get("nodes", []), node_id]
    into.pop("node", None)
    if isinstance(node.get("restarts"), int) and isinstance(into.get("restarts"), int):
        into["restarts"] += node["restarts"]
    for key in ("children_hidden", "children_asleep"):
        if isinstance(node.get(key), int):
            into[key] = int(into.get(key) or 0) + node[key]
    by_path = {child["path"]: child for child in into["children"]}
    for child in node.get("children") or []:
        mine = by_path.get(child["path"])
        if mine is None:
            merged = _merge_tree(None, child, node_id)
            into["children"].append(merged)
            by_path[child["path"]] = merged
        else:
            _merge_tree(mine, child, node_id)
    return into


def _load_policy(spec: str | None) -> Callable[[dict[str, Any], list[dict[str, Any]]], Any] | None:
    """The ``[cluster] placement`` hook, ``module:function``.

    Raises:
        ClusterError: it cannot be imported, or is not callable.
    """
    if not spec:
        return None
    module_name, _, name = spec.partition(":")
    try:
        policy = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as exc:
        msg = f"[cluster] placement = {spec!r}: cannot import it ({exc}); give module:function"
        raise ClusterError(msg) from exc
    if not callable(policy):
        msg = f"[cluster] placement = {spec!r} is not a function"
        raise ClusterError(msg)
    return policy  # type: ignore[no-any-return]


class Front:
    """The front process's parts: a system (for the loop, the bus and the store's tables), the server, the observer.

    Args:
        config: the configuration: ``[store] url`` (the cluster's database),
            ``[cluster]`` (its secret, TLS), ``[server]`` (the socket, the observer).
        socket_path: the Unix socket clients connect to.
        http: ``HOST:PORT`` for the observer (None: ``[server] http``).

    Raises:
        ClusterError: the store is not a database, or the secret or TLS is not usable.
    """

    def __init__(self, config: Any, *, socket_path: str | Path, http: str | None = None) -> None:
        if not config.store.url:
            msg = "a front needs the cluster's database: --store postgresql://... (or [store] url)"
            raise ClusterError(msg)
        self.config = config
        self.secret = cluster_secret(config.cluster)
        self.tls = tls_client_context(config.cluster)
        self.socket_path = Path(socket_path)
        self.http = http or config.server.http
        self.faults = None
        self.sessions = None
        self.observer_port: int | None = None
        self.observer_token: str | None = None
        if self.http:
            from weald.runtime.daemon.http import new_token

            self.observer_token = new_token()
            register_secret(self.observer_token)
        state_dir = Path(config.store.path).expanduser().parent
        self.system = ActorSystem(
            store_path=state_dir / "front.db", store_url=config.store.url, ring_size=config.server.event_history
        )
        self.started_at = 0.0
        self._stop_requested = False

    def start(self) -> Front:
        """Start serving: the socket, then the observer.

        Raises:
            SocketInUseError: a live daemon or front serves the socket.
            StartError: a part failed to start (the store: the database cannot be used).
        """
        prepare_socket(self.socket_path)
        self.system.start()
        self.started_at = time.time()
        root = self.system.root.proxy()
        try:
            root.start_child(
                ChildSpec("server", FrontServer, kwargs={"daemon": self, "socket_path": self.socket_path}, shutdown=10)
            ).get(timeout=30)
            if self.http:
                from weald.runtime.daemon.http import Observer

                observer = {"daemon": self, "address": self.http, "token": self.observer_token}
                observer["remote"] = self.config.server.http_remote
                root.start_child(ChildSpec("http", Observer, kwargs=observer, shutdown=10)).get(timeout=30)
        except BaseException:
            self.system.shutdown()
            raise
        return self

    def request_stop(self) -> None:
        """Ask the process running the front to stop it."""
        self._stop_requested = True

    @property
    def stop_requested(self) -> bool:
        """True once `request_stop` was called."""
        return self._stop_requested

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop accepting, answer what is in flight, close every link, stop."""
        server = self.system.whereis("/server")
        if server is not None and self.system.running:

            async def wind_down() -> None:
                with trio.move_on_after(timeout):
                    await server.proxy().stop_accepting()
                    await server.proxy().wait_replies_written()

            with contextlib.suppress(Exception):
                self.system.loop.run(wind_down)
        self.system.shutdown(timeout=timeout)
        restore_environ()


def check_front_config(config: Any) -> None:
    """Check what a front needs before it starts (a clear error, not a failed start).

    Raises:
        ClusterError: what is missing or wrong.
    """
    if not config.store.url:
        msg = "a front needs the cluster's database: --store postgresql://... (or [store] url)"
        raise ClusterError(msg)
    cluster_secret(config.cluster)
    tls_client_context(config.cluster)
    _load_policy(config.cluster.placement)
