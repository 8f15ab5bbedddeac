"""OpenTelemetry for the daemon: every turn a trace, the daemon's health as metrics, exported over OTLP.

Off unless configured (``[telemetry]`` in weald.toml, or the standard
``OTEL_EXPORTER_OTLP_ENDPOINT``): then this module is not even imported, and
a turn costs what it costs without it. On, it follows the daemon's event bus
(one subscription, on the loop) and turns events into spans and metric
points; nothing on a turn's path waits for it. Spans are batched and exported
by the OpenTelemetry SDK's own worker thread (``BatchSpanProcessor``); a
collector that is down or slow makes that thread drop batches, counted and
logged, never the loop wait.

Spans (names and ``gen_ai.*`` attributes per the OpenTelemetry GenAI semantic
conventions)::

    invoke_agent <agent id>            a turn (parent: the caller's traceparent, if any)
    ├── chat <model>                   each model call: tokens, finish reasons
    ├── execute_tool <tool>            each tool call: its id, outcome, actor path;
    │   │                              permission waits as events
    │   └── invoke_agent <sub-agent>   a sub-agent's turn, under its sub_agent call
    └── compact <agent id>             a compaction during the turn (else a trace of its own)

Restarts, crashes and injected faults in a session are events on the turn
running in it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from weald.runtime import ActorSystem, Event, redact, redact_text
from weald.runtime.daemon._telemetry_settings import TelemetrySettings

__all__ = ["Telemetry", "TelemetryStatistics"]

logger = logging.getLogger("weald.telemetry")

_TOPICS = [
    "agent.*",
    "tool.started",
    "tool.finished",
    "tool.failed",
    "permission.*",
    "supervisor.child_restarted",
    "supervisor.child_crashed",
    "fault.injected",
]
_CONTENT_CAP = 8192  # characters of a captured text
_PARENTS_CAP = 4096  # traceparents waiting for their turn


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _session_of(path: str) -> str | None:
    parts = path.split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "sessions" else None


@attrs.frozen
class TelemetryStatistics:
    """What telemetry did: spans exported and dropped, export failures."""

    endpoint: str
    protocol: str
    spans_started: int
    spans_exported: int
    spans_dropped: int
    export_failures: int


class _CountingExporter(SpanExporter):
    """The OTLP exporter, counting what it could not deliver (and saying so in the log, at most every 30 s)."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.exported = 0
        self.dropped = 0
        self.failures = 0
        self._warned = 0.0

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception as exc:  # an exporter that raises drops the batch like one that fails
            logger.debug("span export raised: %s", exc)
            result = SpanExportResult.FAILURE
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.exported += len(spans)
                return result
            self.dropped += len(spans)
            self.failures += 1
            now = time.monotonic()
            warn, self._warned = now - self._warned > 30.0, now if now - self._warned > 30.0 else self._warned
            dropped = self.dropped
        if warn:
            logger.warning(
                "telemetry: the OTLP collector did not take %d spans (%d dropped so far); turns go on",
                len(spans),
                dropped,
            )
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


def _exporters(settings: TelemetrySettings) -> tuple[SpanExporter, Any]:
    """The span and metric exporters for the configured protocol (each imported only when chosen)."""
    timeout = settings.export_timeout
    headers = dict(settings.headers) or None
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans

        return (
            GrpcSpans(
                endpoint=settings.traces_url,
                insecure=settings.traces_url.startswith("http://"),
                headers=headers,
                timeout=timeout,
            ),
            GrpcMetrics(
                endpoint=settings.metrics_url,
                insecure=settings.metrics_url.startswith("http://"),
                headers=headers,
                timeout=timeout,
            ),
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

    return (
        HttpSpans(endpoint=settings.traces_url, headers=headers, timeout=timeout),
        HttpMetrics(endpoint=settings.metrics_url, headers=headers, timeout=timeout),
    )


class Telemetry:
    """The daemon's OpenTelemetry: providers, exporters, and the task that follows the event bus.

    Threads: `start` and `shutdown` run on the thread that starts and stops
    the daemon; `follow` is a task on the loop; `expect_parent` is called by
    the server (on the loop); metric callbacks run on the SDK's reader thread.

    Args:
        settings: where and how to export.
        system: the daemon's system (its events, store and registry).
        sessions_counts: returns ``(awake, asleep)`` sessions, for the gauge (from any thread).
        model_spec: ``provider:model`` for a session's model, ``(session id, model)`` (an alias is
            resolved under the session's project); called on the loop.
        capture_content: whether a session's project puts message contents on spans (called on the
            loop); default: ``settings.capture_content`` for every session.
    """

    def __init__(
        self,
        settings: TelemetrySettings,
        system: ActorSystem,
        sessions_counts: Callable[[], tuple[int, int]] | None = None,
        model_spec: Callable[[str, str], str] | None = None,
        capture_content: Callable[[str], bool] | None = None,
    ) -> None:
        self._model_spec = model_spec or (lambda _session, model: model)
        self._capture = capture_content or (lambda _session: settings.capture_content)
        self.settings = settings
        self._system = system
        self._sessions_counts = sessions_counts
        resource = Resource.create({"service.name": settings.service_name, **settings.resource_attributes})
        span_exporter, metric_exporter = _exporters(settings)
        self._exporter = _CountingExporter(span_exporter)
        self._tracer_provider = TracerProvider(resource=resource)
        # The SDK's batch processor: its own thread, a bounded queue (spans past it are dropped and counted).
        self._tracer_provider.add_span_processor(BatchSpanProcessor(self._exporter, max_queue_size=8192))
        self._tracer = self._tracer_provider.get_tracer("weald")
        reader = PeriodicExportingMetricReader(
            metric_exporter,
            export_interval_millis=settings.metrics_interval * 1000,
            export_timeout_millis=settings.export_timeout * 1000,
        )
        self._meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        self._instruments()
        self._propagator = TraceContextTextMapPropagator()
        # Touched only on the loop thread (`follow`, `expect_parent`).
        self._parents: dict[str, otel_context.Context] = {}
        self._turns: dict[str, tuple[Any, otel_context.Context]] = {}  # agent path -> turn span, its context
        self._chats: dict[str, tuple[Any, float, dict[str, Any]]] = {}  # agent path -> span, start, attributes
        self._tools: dict[tuple[str, str], Any] = {}  # (agent path, call id) -> span
        self._permissions: dict[str, Any] = {}  # request id -> the call's span
        self._compactions: dict[str, Any] = {}  # agent path -> span
        self._mcp_calls: dict[tuple[str, str], Any] = {}  # (agent path, call id) -> the MCP request's span
        self._subscription: Any = None
        self._loop_lag = 0.0
        # Store commits whose durations went into their histogram, or were made before (the reader's thread).
        self._commits_seen = system.store.commit_latency.count
        self.spans_started = 0

    # -- metrics --------------------------------------------------------------------------------------------

    def _instruments(self) -> None:
        meter = self._meter_provider.get_meter("weald")
        self._token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens used by model calls"
        )
        self._operation_duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="Duration of model calls"
        )
        self._turns_counter = meter.create_counter("weald.turns", unit="{turn}", description="Turns ended, by status")
        self._turn_duration = meter.create_histogram("weald.turn.duration", unit="s", description="Turn latency")
        self._tool_calls = meter.create_counter("weald.tool.calls", unit="{call}", description="Tool calls, by outcome")
        self._tool_duration = meter.create_histogram("weald.tool.duration", unit="s", description="Tool call latency")
        self._restarts = meter.create_counter(
            "weald.supervisor.restarts", unit="{restart}", description="Children restarted, by supervisor"
        )
        meter.create_observable_gauge(
            "weald.sessions",
            unit="{session}",
            description="Sessions awake and asleep",
            callbacks=[self._observe_sessions],
        )
        meter.create_observable_gauge(
            "weald.mailbox.length",
            unit="{message}",
            description="Messages waiting",
            callbacks=[self._observe_mailboxes],
        )
        meter.create_observable_gauge(
            "weald.store.size", unit="By", description="The store file's size", callbacks=[self._observe_store_size]
        )
        meter.create_observable_counter(
            "weald.store.commits", unit="{commit}", description="Store commits", callbacks=[self._observe_commits]
        )
        self._commit_duration = meter.create_histogram(
            "weald.store.commit.duration", unit="s", description="Store commit latency (one transaction each)"
        )
        meter.create_observable_gauge(
            "weald.loop.lag",
            unit="s",
            description="How late the loop woke a sleeping task",
            callbacks=[self._observe_lag],
        )

    def _observe_sessions(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        if self._sessions_counts is None or not self._system.running:
            return []
        awake, asleep = self._sessions_counts()
        return [
            Observation(awake, {"weald.session.state": "awake"}),
            Observation(asleep, {"weald.session.state": "asleep"}),
        ]

    def _observe_mailboxes(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        total = largest = 0
        for path in self._system.registered():
            ref = self._system.whereis(path)
            if ref is not None:
                size = ref.mailbox_size()
                total += size
                largest = max(largest, size)
        return [Observation(total, {"weald.aggregate": "sum"}), Observation(largest, {"weald.aggregate": "max"})]

    def _observe_store_size(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        if not self._system.running:
            return []
        return [Observation(self._system.store.statistics()["bytes"])]

    def _observe_commits(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        if not self._system.running:
            return []
        store = self._system.store
        # The commits' durations since the last collection go into their histogram here, on the reader's
        # thread, before it collects: the committer only notes each one (`Store.commit_latency`).
        self._commits_seen, durations = store.commit_latency.since(self._commits_seen)
        for seconds in durations:
            self._commit_duration.record(seconds)
        return [Observation(store.statistics()["commits"])]

    def _observe_lag(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        return [Observation(self._loop_lag)]

    # -- lifecycle --------------------------------------------------------------------------------------------

    def expect_parent(self, agent_id: str, traceparent: str) -> None:
        """The next turn of ``agent_id`` continues the caller's trace (``agent.prompt``'s ``traceparent``)."""
        carrier = {"traceparent": traceparent}
        if len(self._parents) >= _PARENTS_CAP:
            self._parents.pop(next(iter(self._parents)))
        self._parents[agent_id] = self._propagator.extract(carrier)

    async def follow(self) -> None:
        """Turn the daemon's events into spans and metric points until cancelled (a task on the loop)."""
        with self._system.events.subscribe(_TOPICS, max_buffer=65536) as subscription:
            self._subscription = subscription
            try:
                async for event in subscription:
                    self._record(event)
            finally:
                self._subscription = None

    def _record(self, event: Event) -> None:
        try:
            self._on_event(event)
        except Exception:  # telemetry never takes the daemon down: the event is skipped, and said
            logger.exception("telemetry could not record %s", event.topic)

    def mcp_call_traceparent(self, ctx: Any, server: str, tool: str, path: str) -> str | None:
        """The ``traceparent`` of an MCP tool call starting now: a ``tools/call`` span under its ``execute_tool``.

        The provider `weald.runtime.mcp.set_trace_context_provider` calls, on
        the loop, as the call starts. Events not yet recorded (the call's
        ``tool.started`` among them) are recorded first, so the call's span is there.
        """
        if self._subscription is not None:
            for event in self._subscription.drain_nowait():
                self._record(event)
        session, agent_id, call_id = ctx.session_id, ctx.agent_id, ctx.call_id
        prefix = f"/sessions/{session}/"
        found = [
            (agent, span)
            for (agent, call), span in self._tools.items()
            if call == call_id
            and agent.startswith(prefix)
            and (agent.endswith(f"/{agent_id}") or (agent_id == session and agent.endswith("/agent")))
        ]
        if not found:
            return None
        agent, parent = found[0]
        attributes = {
            "mcp.method.name": "tools/call",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
            "weald.mcp.server": server,
            "weald.actor.path": path,
        }
        span = self._start(
            f"tools/call {tool}", time.time(), trace.set_span_in_context(parent), attributes, SpanKind.CLIENT
        )
        self._mcp_calls[(agent, call_id)] = span
        context = span.get_span_context()
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"

    async def measure_lag(self) -> None:
        """Measure how late the loop wakes a task sleeping half a second, until cancelled (a task on the loop)."""
        while True:
            began = trio.current_time()
            await trio.sleep(0.5)
            self._loop_lag = max(0.0, trio.current_time() - began - 0.5)

    def shutdown(self, timeout: float = 5.0) -> None:
        """End what is open, export what is queued (at most ``timeout`` seconds each), and stop."""
        now = time.time()
        for span, _ in list(self._turns.values()):
            span.set_status(Status(StatusCode.ERROR, "the daemon stopped"))
            span.end(_ns(now))
        open_spans = [*self._mcp_calls.values(), *self._tools.values(), *self._compactions.values()]
        for span in [*open_spans, *(c[0] for c in self._chats.values())]:
            span.end(_ns(now))
        self._turns.clear()
        self._mcp_calls.clear()
        self._tools.clear()
        self._chats.clear()
        self._compactions.clear()
        with contextlib.suppress(Exception):  # a collector that is gone must not stop the shutdown
            self._tracer_provider.force_flush(int(timeout * 1000))
        with contextlib.suppress(Exception):
            self._meter_provider.shutdown(timeout_millis=timeout * 1000)
        with contextlib.suppress(Exception):
            self._tracer_provider.shutdown()

    def statistics(self) -> TelemetryStatistics:
        """Spans started, exported and dropped so far."""
        return TelemetryStatistics(
            endpoint=self.settings.endpoint,
            protocol=self.settings.protocol,
            spans_started=self.spans_started,
            spans_exported=self._exporter.exported,
            spans_dropped=self._exporter.dropped,
            export_failures=self._exporter.failures,
        )

    # -- events -> spans ----------------------------------------------------------------------------------

    def _start(
        self,
        name: str,
        at: float,
        parent: otel_context.Context | None,
        attributes: Mapping[str, Any],
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> Any:
        self.spans_started += 1
        return self._tracer.start_span(
            name, context=parent or otel_context.Context(), kind=kind, attributes=attributes, start_time=_ns(at)
        )

    def _content(self, source: str, text: Any) -> str | None:
        session = _session_of(source)
        if text is None or session is None or not self._capture(session):
            return None
        value = text if isinstance(text, str) else json.dumps(redact(text), default=str)
        return redact_text(value)[:_CONTENT_CAP]

    def _on_event(self, event: Event) -> None:
        topic, data, source, at = event.topic, event.data, event.source, event.time
        if topic.startswith("agent."):
            self._on_agent(topic, data, source, at)
        elif topic.startswith("tool."):
            self._on_tool(topic, data, source, at)
        elif topic == "permission.requested":
            span = self._tools.get((data.get("agent_path") or "", data.get("call_id") or ""))
            if span is not None:
                self._permissions[data["request_id"]] = span
                span.add_event(
                    "weald.permission.requested",
                    {
                        "weald.permission.subject": str(data.get("subject") or ""),
                        "weald.permission.reason": data.get("reason") or "",
                    },
                    _ns(at),
                )
        elif topic in ("permission.answered", "permission.timed_out"):
            span = self._permissions.pop(data.get("request_id", ""), None)
            if span is not None:
                decision = data.get("decision") or "timed_out"
                span.add_event("weald.permission.answered", {"weald.permission.decision": decision}, _ns(at))
        elif topic in ("supervisor.child_restarted", "supervisor.child_crashed"):
            self._on_supervision(topic, data, source, at)
        elif topic == "fault.injected":
            path = str(data.get("path") or source)
            self._session_event(
                path,
                "weald.fault_injected",
                {
                    "weald.fault.id": str(data.get("id", "")),
                    "weald.fault.kind": str(data.get("kind", "")),
                    "weald.actor.path": path,
                },
                at,
            )

    def _session_event(self, path: str, name: str, attributes: Mapping[str, Any], at: float) -> bool:
        """Add an event to the turns running in the session of ``path``; whether there was one."""
        session = _session_of(path)
        if session is None:
            return False
        prefix = f"/sessions/{session}/"
        found = False
        for agent, (span, _) in self._turns.items():
            if agent.startswith(prefix):
                span.add_event(name, attributes, _ns(at))
                found = True
        return found

    def _on_supervision(self, topic: str, data: Mapping[str, Any], source: str, at: float) -> None:
        path = str(data.get("path") or "")
        if topic == "supervisor.child_restarted":
            self._restarts.add(1, {"weald.supervisor": source})
            attributes = {
                "weald.actor.path": path,
                "weald.supervisor": source,
                "weald.restarts": int(data.get("restarts") or 0),
            }
            self._session_event(path, "weald.restart", attributes, at)
        else:
            attributes = {
                "weald.actor.path": path,
                "weald.exit": str(data.get("exit", "")),
                "weald.error": str(data.get("error") or ""),
            }
            self._session_event(path, "weald.crash", attributes, at)
        # An agent restarted mid-turn comes back without ending that turn: its span ends here.
        if topic == "supervisor.child_restarted" and path in self._turns:
            self._end_turn(path, at, "interrupted", "the agent was restarted during the turn")

    def _on_agent(self, topic: str, data: Mapping[str, Any], source: str, at: float) -> None:
        if topic == "agent.turn_start":
            agent_id = str(data.get("agent_id") or "")
            parent = self._parent_of(source, agent_id)
            attributes = {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.id": agent_id,
                "gen_ai.agent.name": source.rsplit("/", 1)[-1] if "/sub_agents/" in source else agent_id,
                "gen_ai.conversation.id": str(data.get("session_id") or ""),
                "weald.turn.id": str(data.get("turn_id") or ""),
                "weald.actor.path": source,
            }
            name = f"invoke_agent {attributes['gen_ai.agent.name']}"
            span = self._start(name, at, parent, attributes)
            self._turns[source] = (span, trace.set_span_in_context(span))
        elif topic == "agent.message_start":
            turn = self._turns.get(source)
            model = self._model_spec(_session_of(source) or "", str(data.get("model") or "unknown"))
            provider, _, model = model.rpartition(":")
            attributes = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider or "weald",
                "gen_ai.request.model": model,
            }
            span = self._start(f"chat {model}", at, turn[1] if turn else None, attributes, SpanKind.CLIENT)
            self._chats[source] = (span, at, attributes)
        elif topic in ("agent.message_end", "agent.error"):
            chat = self._chats.pop(source, None)
            if chat is None:
                return
            span, began, attributes = chat
            if topic == "agent.error":
                span.set_attribute("error.type", str(data.get("kind") or "error"))
                span.set_status(Status(StatusCode.ERROR, str(data.get("error") or "")[:500]))
                attributes = {**attributes, "error.type": str(data.get("kind") or "error")}
            else:
                usage = data.get("usage") or {}
                inputs = int(usage.get("input_tokens") or 0) + int(usage.get("cache_read_tokens") or 0)
                outputs = int(usage.get("output_tokens") or 0)
                span.set_attributes(
                    {
                        "gen_ai.usage.input_tokens": inputs,
                        "gen_ai.usage.output_tokens": outputs,
                        "gen_ai.usage.cache_read.input_tokens": int(usage.get("cache_read_tokens") or 0),
                        "gen_ai.response.finish_reasons": [str(data.get("stop_reason") or "")],
                        "gen_ai.response.model": attributes["gen_ai.request.model"],
                    }
                )
                content = self._content(source, data.get("text"))
                if content is not None:
                    # The conventions' shape: a JSON list of messages, each with its parts.
                    message = {"role": "assistant", "parts": [{"type": "text", "content": content}]}
                    span.set_attribute("gen_ai.output.messages", json.dumps([message]))
                self._token_usage.record(inputs, {**attributes, "gen_ai.token.type": "input"})
                self._token_usage.record(outputs, {**attributes, "gen_ai.token.type": "output"})
            self._operation_duration.record(max(0.0, at - began), attributes)
            span.end(_ns(at))
        elif topic == "agent.turn_end":
            self._end_turn(source, at, str(data.get("status") or ""), data.get("error"), data.get("usage"))
        elif topic == "agent.compacting":
            turn = self._turns.get(source)
            compaction: dict[str, Any] = {
                "weald.compaction.reason": str(data.get("reason") or ""),
                "weald.compaction.tokens_before": int(data.get("tokens_before") or 0),
                "weald.actor.path": source,
            }
            self._compactions[source] = self._start(
                f"compact {data.get('agent_id')}", at, turn[1] if turn else None, compaction
            )
        elif topic in ("agent.compacted", "agent.compaction_failed"):
            span = self._compactions.pop(source, None)
            if span is not None:
                if topic == "agent.compaction_failed":
                    span.set_status(Status(StatusCode.ERROR, str(data.get("error") or "")[:500]))
                else:
                    span.set_attribute("weald.compaction.tokens_after", int(data.get("tokens_after") or 0))
                span.end(_ns(at))
        elif topic == "agent.recovered" and data.get("interrupted_turn"):
            self._session_event(source, "weald.recovered", {"weald.restarts": int(data.get("restarts") or 0)}, at)

    def _parent_of(self, source: str, agent_id: str) -> otel_context.Context | None:
        if "/sub_agents/" in source:
            # sub-<n>-<call id>: the turn runs under its parent's sub_agent call.
            call_id = source.rsplit("/", 1)[-1].split("-", 2)[-1]
            session = f"/sessions/{_session_of(source)}/"
            for (agent, call), span in self._tools.items():
                if call == call_id and agent.startswith(session):
                    return trace.set_span_in_context(span)
            return None
        return self._parents.pop(agent_id, None)

    def _end_turn(self, source: str, at: float, status: str, error: Any, usage: Any = None) -> None:
        turn = self._turns.pop(source, None)
        if turn is None:
            return
        span, _ = turn
        span.set_attribute("weald.turn.status", status)
        if isinstance(usage, Mapping):
            span.set_attributes(
                {
                    "gen_ai.usage.input_tokens": int(usage.get("input_tokens") or 0)
                    + int(usage.get("cache_read_tokens") or 0),
                    "gen_ai.usage.output_tokens": int(usage.get("output_tokens") or 0),
                }
            )
        if status not in ("done", ""):
            span.set_status(Status(StatusCode.ERROR, str(error or status)[:500]))
        began = span.start_time / 1e9 if getattr(span, "start_time", None) else at
        self._turns_counter.add(1, {"weald.turn.status": status})
        self._turn_duration.record(max(0.0, at - began), {"weald.turn.status": status})
        span.end(_ns(at))
        # A model call or tool call the turn left open (an abort, a crash) ends with it.
        for key in [key for key in self._mcp_calls if key[0] == source]:
            self._mcp_calls.pop(key).end(_ns(at))
        for key in [key for key in self._tools if key[0] == source]:
            self._tools.pop(key).end(_ns(at))
        chat = self._chats.pop(source, None)
        if chat is not None:
            chat[0].end(_ns(at))

    def _on_tool(self, topic: str, data: Mapping[str, Any], source: str, at: float) -> None:
        agent, call_id = str(data.get("agent") or ""), str(data.get("call_id") or "")
        if topic == "tool.started":
            turn = self._turns.get(agent)
            tool = str(data.get("tool") or "")
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "extension" if tool.startswith("mcp__") else "function",
                "weald.actor.path": source,
                "weald.agent.path": agent,
            }
            if tool.startswith("mcp__"):
                attributes["weald.mcp.server"] = tool.split("__")[1]
            arguments = self._content(agent, data.get("arguments"))
            if arguments is not None:
                attributes["gen_ai.tool.call.arguments"] = arguments
            self._tools[(agent, call_id)] = self._start(
                f"execute_tool {tool}", at, turn[1] if turn else None, attributes
            )
            return
        span = self._tools.pop((agent, call_id), None)
        mcp_call = self._mcp_calls.pop((agent, call_id), None)
        ok = topic == "tool.finished"
        outcome = "ok" if ok else "error"
        tool = str(data.get("tool") or "")
        self._tool_calls.add(1, {"gen_ai.tool.name": tool, "weald.tool.outcome": outcome})
        duration = float(data.get("duration_ms") or 0.0) / 1000
        self._tool_duration.record(duration, {"gen_ai.tool.name": tool, "weald.tool.outcome": outcome})
        if mcp_call is not None:
            if not ok:
                mcp_call.set_status(Status(StatusCode.ERROR, str(data.get("error") or "")[:500]))
            mcp_call.end(_ns(at))
        if span is None:
            return
        span.set_attribute("weald.tool.outcome", outcome)
        if not ok:
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, str(data.get("error") or "")[:500]))
        span.end(_ns(at))
