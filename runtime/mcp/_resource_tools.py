"""The model's tools for MCP resources: ``mcp_list_resources`` and ``mcp_read_resource``.

Servers offer documents, files and data as resources (``resources/list``,
``resources/read``), and tool results link to them (resource links). These
two built-in tools let the model list and read them, as Claude Code's
ListMcpResources / ReadMcpResource do. The ``mcp`` supervisor registers them
while it runs (see `MCPSupervisor`); each call goes to the connection actor
as a request of its own, never holding its mailbox.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio
from weald.runtime import ActorDeadError
from weald.tools import Tool, ToolContext, ToolError, ToolImage, ToolResult

from ._exceptions import MCPError
from ._registry import NotConnected
from ._values import MCPResource, MCPResourceContent, _blob_text, image_for_model

if TYPE_CHECKING:
    from weald.runtime import ActorSystem

__all__ = ["LIST_RESOURCES", "READ_RESOURCE", "resource_tools"]

LIST_RESOURCES = "mcp_list_resources"
READ_RESOURCE = "mcp_read_resource"
# Seconds one listing or read may take: a server's default call_timeout, plus its ping.
RESOURCE_TIMEOUT = 70.0


def resource_tools(system: ActorSystem, supervisor_path: str) -> list[Tool]:
    """The two tools, bound to the ``mcp`` supervisor at ``supervisor_path`` of ``system``."""
    lister = _Resources(system, supervisor_path)
    return [
        Tool(
            name=LIST_RESOURCES,
            description=(
                "List the resources (documents, files, data) the connected MCP servers offer: each one's URI, "
                "name, type and description, by server. Read one with mcp_read_resource."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "server": {
                        "type": "string",
                        "description": "Only this MCP server's resources; omit for every server's.",
                    }
                },
                "additionalProperties": False,
            },
            fn=lister.list_resources,
            is_async=True,
            permission="allow",
            timeout=RESOURCE_TIMEOUT,
            kind="read",
        ),
        Tool(
            name=READ_RESOURCE,
            description=(
                "Read one resource of an MCP server by its URI (from mcp_list_resources, or a resource link in "
                "a tool result). Text comes back as text, images as images; other binary content is described."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "server": {"type": "string", "description": "The MCP server that offers the resource."},
                    "uri": {"type": "string", "description": "The resource's URI."},
                },
                "required": ["server", "uri"],
                "additionalProperties": False,
            },
            fn=lister.read_resource,
            is_async=True,
            permission="allow",
            timeout=RESOURCE_TIMEOUT,
            kind="read",
        ),
    ]


class _Resources:
    """The tools' functions; they run in the tool runner's task on the loop."""

    def __init__(self, system: ActorSystem, supervisor_path: str) -> None:
        self._system = system
        self._path = supervisor_path

    async def list_resources(self, ctx: ToolContext, server: str | None = None) -> ToolResult:  # noqa: ARG002 - tool signature
        snapshots = await self._servers()
        if server is not None:
            snapshots = [s for s in snapshots if s.server == server]
            if not snapshots:
                raise ToolError(await self._unknown(server))
        if not snapshots:
            raise ToolError("no MCP servers are configured, so there are no resources to list")
        lines: list[str] = []
        found: dict[str, list[dict[str, Any]]] = {}
        errors: dict[str, str] = {}
        for snapshot in snapshots:
            name = snapshot.server
            try:
                resources: tuple[MCPResource, ...] = await self._ask(name, snapshot.path, lambda p: p.list_resources())
            except MCPError as exc:
                errors[name] = str(exc)
                lines.append(f"{name}: {_first_line(str(exc))}")
                continue
            found[name] = [
                {"uri": r.uri, "name": r.name, "mime_type": r.mime_type, "description": r.description}
                for r in resources
            ]
            lines.append(f"{name}: {len(resources)} resource{'' if len(resources) == 1 else 's'}")
            for r in resources:
                mime = f" ({r.mime_type})" if r.mime_type else ""
                about = f": {r.description}" if r.description else ""
                lines.append(f"- {r.uri}  {r.name}{mime}{about}")
        if not found and len(errors) == len(snapshots) and server is not None:
            raise ToolError(lines[0])
        return ToolResult.success("\n".join(lines), data={"resources": found, "errors": errors})

    async def read_resource(self, ctx: ToolContext, server: str, uri: str) -> ToolResult:  # noqa: ARG002 - tool signature
        snapshot = next((s for s in await self._servers() if s.server == server), None)
        if snapshot is None:
            raise ToolError(await self._unknown(server))
        try:
            parts: tuple[MCPResourceContent, ...] = await self._ask(
                server, snapshot.path, lambda p: p.read_resource(uri)
            )
        except MCPError as exc:
            raise ToolError(
                f"could not read {uri} from MCP server {server!r}: {_first_line(str(exc))}",
                hints=[f"{LIST_RESOURCES} shows the resources the server offers"],
            ) from exc
        images: list[ToolImage] = []
        texts = [_part_text(part, images, several=len(parts) > 1) for part in parts]
        if not texts:
            texts = [f"{uri} is empty"]
        return ToolResult(ok=True, output="\n".join(texts), images=images)

    # -- helpers --------------------------------------------------------------------------

    async def _servers(self) -> list[Any]:
        supervisor = self._system.whereis(self._path)
        if supervisor is None:
            raise ToolError("MCP is not running in this daemon, so there are no resources")
        try:
            return list(await supervisor.proxy().servers())
        except ActorDeadError as exc:
            raise ToolError("MCP is stopping; there are no resources to list") from exc

    async def _unknown(self, server: str) -> str:
        names = ", ".join(sorted(s.server for s in await self._servers())) or "none"
        return f"there is no MCP server named {server!r}; the configured servers are: {names}"

    async def _ask(self, server: str, path: str, request: Callable[[Any], Any]) -> Any:
        """Run one request on the server's connection actor; its answer, or `MCPError`."""
        ref = self._system.whereis(path)
        if ref is None:
            raise NotConnected(await self._unavailable(server), server=server)
        try:
            started: Awaitable[Any] = request(ref.proxy())
            reply = await started
        except ActorDeadError as exc:
            raise NotConnected(await self._unavailable(server), server=server) from exc
        with trio.fail_after(RESOURCE_TIMEOUT):
            return await reply

    async def _unavailable(self, server: str) -> str:
        supervisor = self._system.whereis(self._path)
        if supervisor is None:
            return f"MCP server {server!r} is not running"
        try:
            reason: str = await supervisor.proxy().unavailable(server)
        except ActorDeadError:
            return f"MCP server {server!r} is not running"
        return reason


def _part_text(part: MCPResourceContent, images: list[ToolImage], *, several: bool) -> str:
    mime = f" ({part.mime_type})" if part.mime_type else ""
    header = f"[resource: {part.uri}{mime}]\n" if several else ""
    if part.text is not None:
        return header + part.text
    blob = part.blob or b""
    encoded = base64.b64encode(blob).decode("ascii")
    text = _blob_text(part.mime_type, encoded)
    if text is not None:
        return header + text
    if (part.mime_type or "").startswith("image/"):
        why = image_for_model(part.mime_type or "", encoded, images)
        if why is None:
            return f"[image: {part.uri}{mime}, {len(blob)} bytes]"
        return f"[image: {part.uri}{mime}, {len(blob)} bytes; not shown: {why}]"
    return f"[binary: {part.uri}{mime}, {len(blob)} bytes; not shown: models take text and images only]"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
