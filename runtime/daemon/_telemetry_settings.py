"""Whether and where the daemon exports OpenTelemetry, from ``[telemetry]`` and the standard ``OTEL_*`` variables.

Decided without importing OpenTelemetry: with telemetry off, nothing of it is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import unquote

import attrs
from weald.runtime import is_secret_name, register_secret

__all__ = ["TelemetrySettings", "telemetry_settings"]


def _frozen(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


_DEFAULT_ENDPOINTS = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}


@attrs.frozen
class TelemetrySettings:
    """Telemetry as the daemon runs it.

    Attributes:
        endpoint: the OTLP endpoint (HTTP: the base, ``/v1/traces`` and ``/v1/metrics`` are added).
        traces_url: where spans go (HTTP: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else ``endpoint``'s ``/v1/traces``).
        metrics_url: where metrics go (likewise ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``, ``[telemetry]
            metrics_endpoint``, else ``endpoint``'s ``/v1/metrics``).
        protocol: ``http/protobuf`` or ``grpc``.
        service_name: the ``service.name`` resource attribute.
        capture_content: whether prompts, answers and tool arguments go on spans.
        metrics_interval: seconds between metric exports.
        export_timeout: seconds an export may take before its batch is dropped.
        headers: headers sent with every export (``OTEL_EXPORTER_OTLP_HEADERS``); secret-looking values are
            made unprintable.
        resource_attributes: from ``OTEL_RESOURCE_ATTRIBUTES``.
        source: where the endpoint came from: ``weald.toml`` or ``environment``.
    """

    endpoint: str
    protocol: str
    service_name: str
    traces_url: str = ""
    metrics_url: str = ""
    capture_content: bool = False
    metrics_interval: float = 15.0
    export_timeout: float = 5.0
    headers: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen)
    resource_attributes: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen)
    source: str = "weald.toml"


def _pairs(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` (percent-encoded values, as the OpenTelemetry variables have them)."""
    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out[key.strip()] = unquote(value.strip())
    return out


def telemetry_settings(config: Any, environ: Mapping[str, str] | None = None) -> TelemetrySettings | None:
    """The settings ``[telemetry]`` (``config``) and the environment ask for, or None for telemetry off.

    Off when ``enabled = false``, when ``OTEL_SDK_DISABLED`` is true, or when
    neither ``[telemetry] endpoint`` nor ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set
    and ``enabled`` is not true. Read when the daemon is made, before it takes
    secrets out of its environment.
    """
    env = os.environ if environ is None else environ
    if config.enabled is False or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    from_env = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or None
    if config.enabled is None and config.endpoint is None and from_env is None:
        return None
    protocol = config.protocol or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip() or "http/protobuf"
    if protocol not in _DEFAULT_ENDPOINTS:
        protocol = "http/protobuf"  # http/json is not offered by the SDK's exporters: protobuf it is
    endpoint = config.endpoint or from_env or _DEFAULT_ENDPOINTS[protocol]
    grpc = protocol == "grpc"
    traces_url = endpoint if grpc else f"{endpoint.rstrip('/')}/v1/traces"
    if not config.endpoint and env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        traces_url = env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].strip()
    metrics_base = config.metrics_endpoint or endpoint
    metrics_url = metrics_base if grpc else f"{metrics_base.rstrip('/')}/v1/metrics"
    if not config.metrics_endpoint and env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        metrics_url = env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"].strip()
    headers = _pairs(env.get("OTEL_EXPORTER_OTLP_HEADERS", ""))
    for name, value in headers.items():
        if is_secret_name(name) or name.lower() == "authorization":
            register_secret(value)
            for part in value.split():
                register_secret(part)
    return TelemetrySettings(
        endpoint=endpoint,
        protocol=protocol,
        traces_url=traces_url,
        metrics_url=metrics_url,
        service_name=config.service_name or env.get("OTEL_SERVICE_NAME", "").strip() or "weald",
        capture_content=config.capture_content,
        metrics_interval=config.metrics_interval,
        headers=headers,
        resource_attributes=_pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", "")),
        source="weald.toml" if config.endpoint or config.enabled else "environment",
    )
