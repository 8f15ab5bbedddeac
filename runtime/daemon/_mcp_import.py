"""MCP servers from other hosts' config files, and the ``[mcp.servers.NAME]`` tables of ``weald.toml``.

Reads Claude Desktop's ``claude_desktop_config.json`` and Claude Code's
``.mcp.json`` / ``~/.claude.json`` (an ``mcpServers`` object) and OpenCode's
``opencode.json[c]`` (an ``mcp`` object, or ``mcp.servers`` in its v2
layout), and translates each server into the table weald.toml spells it
with, saying what it could not translate. Used by ``weald mcp import`` (which
writes the tables) and by ``[mcp] import = [...]`` (read at every start).

Also the text edits behind ``weald mcp add`` and ``weald mcp remove``: a
server's tables are appended to, or cut out of, a weald.toml, leaving the
rest of the file (comments included) as it was.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from weald.runtime._secrets import is_secret_env_name, is_secret_name, is_secret_value

__all__ = [
    "ImportedServers",
    "read_foreign_config",
    "remove_server_tables",
    "secrets_to_variables",
    "server_tables",
    "translate",
]

#: The largest config file read (``~/.claude.json`` holds project histories too).
MAX_FILE_BYTES = 16 * 1024 * 1024

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_OPENCODE_ENV = re.compile(r"\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


@attrs.frozen
class ImportedServers:
    """What one foreign config file holds, translated.

    Attributes:
        path: The file read.
        kind: ``claude`` (Claude Desktop, Claude Code) or ``opencode``.
        servers: Each server's ``[mcp.servers.NAME]`` table, by name.
        notes: What could not be translated, or was changed on the way,
            one sentence each, naming the server and the key.
    """

    path: Path
    kind: str
    servers: Mapping[str, Mapping[str, Any]] = attrs.field(hash=False)
    notes: tuple[str, ...]


def read_foreign_config(path: Path) -> ImportedServers:
    """Read and translate a Claude Desktop / Claude Code / OpenCode config file.

    Raises:
        ValueError: The file cannot be read, is not JSON (comments and
            trailing commas are allowed, as OpenCode allows them), or holds
            neither ``mcpServers`` nor ``mcp``.
    """
    try:
        raw = path.read_bytes()[: MAX_FILE_BYTES + 1]
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{path} is over {MAX_FILE_BYTES // (1024 * 1024)} MB; is it an MCP config file?")
    try:
        data = json.loads(_strip_jsonc(raw.decode("utf-8")))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    except RecursionError:
        raise ValueError(f"{path} is nested too deep to be an MCP config file") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")  # noqa: TRY004 - bad input, reported as ValueError
    where = _lone_surrogate(data)
    if where is not None:
        raise ValueError(f"{path}: {where} holds a lone surrogate (a \\uD800-\\uDFFF escape), which is not text")
    kind, servers, notes = translate(data)
    return ImportedServers(path=path, kind=kind, servers=servers, notes=tuple(notes))


def _lone_surrogate(data: object) -> str | None:
    """Where in parsed JSON a string (a key or a value) holds a lone surrogate, which no UTF-8 file can hold."""
    stack: list[tuple[object, str]] = [(data, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if any("\ud800" <= char <= "\udfff" for char in value):
                return where or "the file"
        elif isinstance(value, dict):
            for key, item in value.items():
                if any("\ud800" <= char <= "\udfff" for char in key):
                    return f"a key of {where}" if where else "a key"
                stack.append((item, f"{where}.{key}" if where else key))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{index}]") for index, item in enumerate(value))
    return None


def translate(data: Mapping[str, Any]) -> tuple[str, dict[str, dict[str, Any]], list[str]]:
    """``(kind, tables, notes)`` for a parsed config: see `read_foreign_config`.

    Raises:
        ValueError: The data holds neither ``mcpServers`` nor ``mcp``.
    """
    servers: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    if isinstance(data.get("mcpServers"), Mapping):
        for name, entry in data["mcpServers"].items():
            table = _claude_server(str(name), entry, notes)
            if table is not None:
                servers[str(name)] = table
        if isinstance(data.get("projects"), Mapping):
            notes.append("the per-project servers under projects.* are not imported; import that project's .mcp.json")
        return "claude", servers, notes
    mcp = data.get("mcp")
    if isinstance(mcp, Mapping):
        entries = mcp["servers"] if isinstance(mcp.get("servers"), Mapping) else mcp
        for name, entry in entries.items():
            table = _opencode_server(str(name), entry, notes)
            if table is not None:
                servers[str(name)] = table
        return "opencode", servers, notes
    raise ValueError('it holds no MCP servers: expected "mcpServers" (Claude) or "mcp" (OpenCode)')


# -- Claude Desktop / Claude Code --------------------------------------------------------------------

_CLAUDE_KEYS = {"type", "command", "args", "env", "url", "headers", "cwd", "disabled", "enabled"}


def _claude_server(name: str, entry: object, notes: list[str]) -> dict[str, Any] | None:
    if not isinstance(entry, Mapping):
        notes.append(f"{name}: not an object; skipped")
        return None
    kind = entry.get("type", "stdio" if "command" in entry else "http")
    table: dict[str, Any] = {}
    if kind == "stdio":
        if not isinstance(entry.get("command"), str):
            notes.append(f"{name}: a stdio server without a command; skipped")
            return None
        table["command"] = entry["command"]
        table.update(_strings(name, "args", entry.get("args", []), notes, as_list=True))
        table.update(_strings(name, "env", entry.get("env", {}), notes))
        if isinstance(entry.get("cwd"), str):
            table["cwd"] = entry["cwd"]
    elif kind in ("http", "streamable-http", "streamableHttp", "sse"):
        if not isinstance(entry.get("url"), str):
            notes.append(f"{name}: a {kind} server without a url; skipped")
            return None
        table["url"] = entry["url"]
        table.update(_strings(name, "headers", entry.get("headers", {}), notes))
        if kind == "sse":
            notes.append(
                f"{name}: type sse needs nothing more: weald tries Streamable HTTP first and falls back to HTTP+SSE"
            )
    else:
        notes.append(f"{name}: type {kind!r} is not a transport weald knows (stdio, http, sse); skipped")
        return None
    if entry.get("disabled") is True or entry.get("enabled") is False:
        table["enabled"] = False
    notes.extend(f"{name}: {key} is not translated ({_why_not(key)})" for key in sorted(set(entry) - _CLAUDE_KEYS))
    return secrets_to_variables(name, table, notes)


# -- OpenCode ------------------------------------------------------------------------------------------

_OPENCODE_KEYS = {"type", "command", "environment", "url", "headers", "enabled", "disabled", "timeout", "cwd"}


def _opencode_server(name: str, entry: object, notes: list[str]) -> dict[str, Any] | None:
    if not isinstance(entry, Mapping):
        notes.append(f"{name}: not an object; skipped")
        return None
    kind = entry.get("type")
    table: dict[str, Any] = {}
    if kind == "local":
        command = entry.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(part, str) for part in command):
            notes.append(f"{name}: a local server whose command is not a non-empty list of strings; skipped")
            return None
        table["command"] = _opencode_text(command[0])
        if command[1:]:
            table["args"] = [_opencode_text(part) for part in command[1:]]
        environment = _strings(name, "environment", entry.get("environment", {}), notes)
        if environment:
            table["env"] = {key: _opencode_text(value) for key, value in environment["environment"].items()}
        if isinstance(entry.get("cwd"), str):
            table["cwd"] = entry["cwd"]
    elif kind == "remote":
        if not isinstance(entry.get("url"), str):
            notes.append(f"{name}: a remote server without a url; skipped")
            return None
        table["url"] = _opencode_text(entry["url"])
        headers = _strings(name, "headers", entry.get("headers", {}), notes)
        if headers:
            table["headers"] = {key: _opencode_text(value) for key, value in headers["headers"].items()}
        oauth = entry.get("oauth")
        if oauth not in (None, False):
            notes.append(
                f"{name}: oauth is not translated; give weald's own [mcp.servers.{_key(name)}.auth] table "
                "(client_id, scopes, client_secret_env naming the variable that holds the secret)"
            )
    else:
        notes.append(f"{name}: type {kind!r} is neither local nor remote; skipped")
        return None
    if entry.get("enabled") is False or entry.get("disabled") is True:
        table["enabled"] = False
    timeout = entry.get("timeout")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        table["connect_timeout"] = timeout / 1000  # OpenCode's is in milliseconds, for starting and listing tools
    elif isinstance(timeout, Mapping):
        for key, field in (("startup", "connect_timeout"), ("request", "call_timeout")):
            value = timeout.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                table[field] = value / 1000
    unknown = sorted(set(entry) - _OPENCODE_KEYS - {"oauth"})
    notes.extend(f"{name}: {key} is not translated ({_why_not(key)})" for key in unknown)
    if any("{file:" in text for text in _texts(table)):
        notes.append(f"{name}: a {{file:...}} reference is not translated; weald reads ${{VARIABLE}}s only")
    return secrets_to_variables(name, table, notes)


def _opencode_text(text: str) -> str:
    """OpenCode's ``{env:NAME}`` as weald's ``${NAME}``."""
    return _OPENCODE_ENV.sub(lambda match: "${" + match.group(1) + "}", text)


# -- shared -----------------------------------------------------------------------------------------------


def _strings(name: str, key: str, value: object, notes: list[str], *, as_list: bool = False) -> dict[str, Any]:
    """``{key: value}`` when ``value`` is a list (``as_list``) or table of strings; numbers and booleans become text."""
    if as_list:
        if not isinstance(value, list):
            notes.append(f"{name}: {key} is not a list; left out")
            return {}
        items = [_scalar_text(item) for item in value]
        if any(item is None for item in items):
            notes.append(f"{name}: {key} holds something that is not text; left out")
            return {}
        return {key: items} if items else {}
    if not isinstance(value, Mapping):
        notes.append(f"{name}: {key} is not an object; left out")
        return {}
    table: dict[str, str] = {}
    for entry_key, entry in value.items():
        text = _scalar_text(entry)
        if text is None:
            notes.append(f"{name}: {key}.{entry_key} is not text; left out")
        else:
            table[str(entry_key)] = text
    return {key: table} if table else {}


def _scalar_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return None


def secrets_to_variables(name: str, table: dict[str, Any], notes: list[str]) -> dict[str, Any] | None:
    """A server's table with every secret written out in full made a ``${VARIABLE}`` reference, or None.

    A secret is known by its name (``env.DB_PASSWORD``, ``headers.Authorization``)
    or by its shape (a URL with a password, a token with a known prefix:
    ``sk-ant-...``, ``ghp_...``, ``xoxb-...``, ``AKIA...``). Secrets do not belong
    in weald.toml: an ``env`` or ``headers`` value, or the ``url``, becomes a
    variable, and a note says which to set. A secret on the command line
    (``command`` or ``args``, written out or as a ``${VARIABLE}`` of one)
    cannot be moved there, since every user of the machine can read a
    process's command line: the server is left out (None), with a note
    saying so. Notes name the key, never the value.
    """
    for field in ("env", "headers"):
        for key, value in list(table.get(field, {}).items()):
            if not value or "${" in value or not (is_secret_name(key) or is_secret_value(value)):
                continue
            variable = re.sub(r"[^A-Za-z0-9_]+", "_", key).upper() if field == "env" else _header_variable(name, key)
            table[field][key] = _keep_scheme(value, variable)
            notes.append(
                f"{name}: {field}.{key} held a secret; it is written as ${{{variable}}}: set {variable} "
                "in the daemon's environment"
            )
    url = table.get("url")
    if isinstance(url, str) and "${" not in url and is_secret_value(url):
        variable = _header_variable(name, "url")
        table["url"] = f"${{{variable}}}"
        notes.append(
            f"{name}: url held a secret (a password); it is written as ${{{variable}}}: set {variable} "
            "to the whole URL in the daemon's environment"
        )
    command = [("command", table.get("command")), *((f"args[{i}]", a) for i, a in enumerate(table.get("args", [])))]
    for field, text in command:
        if not isinstance(text, str):
            continue
        secret = [variable for variable in _variables_in(text) if is_secret_env_name(variable)]
        if secret or is_secret_value(text):
            what = f"uses ${{{secret[0]}}}, a secret" if secret else "holds a secret"
            notes.append(
                f"{name}: {field} {what}, and every user of this machine can read a process's command "
                "line (/proc/PID/cmdline): the server is left out; give it the secret in its env instead, "
                "if it reads one there"
            )
            return None
    return table


def _variables_in(text: str) -> list[str]:
    from weald.runtime.mcp import referenced_variables

    try:
        return referenced_variables(text)
    except ValueError:  # a malformed ${...}: the configuration says so when it is read
        return []


def _header_variable(server: str, header: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", f"{server}_{header}").strip("_").upper()


def _keep_scheme(value: str, variable: str) -> str:
    """``Bearer <token>`` keeps its scheme word: ``Bearer ${VARIABLE}``."""
    scheme, _, rest = value.partition(" ")
    if rest and scheme.lower() in ("bearer", "token", "basic"):
        return f"{scheme} ${{{variable}}}"
    return f"${{{variable}}}"


def _texts(table: Mapping[str, Any]) -> list[str]:
    texts: list[str] = []
    for value in table.values():
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, list):
            texts.extend(str(item) for item in value)
        elif isinstance(value, Mapping):
            texts.extend(str(item) for item in value.values())
    return texts


_WHY: Mapping[str, str] = {
    "alwaysAllow": 'set permissions in [tools.permissions], e.g. mcp__SERVER__TOOL = "allow"',
    "autoApprove": 'set permissions in [tools.permissions], e.g. mcp__SERVER__TOOL = "allow"',
    "headersHelper": "weald runs no helper for headers; use ${VARIABLE}s in headers",
    "oauth": "give weald's own [mcp.servers.NAME.auth] table",
    "timeout": "set call_timeout and connect_timeout, in seconds",
}


def _why_not(key: str) -> str:
    return _WHY.get(key, "weald has no such setting")


def _strip_jsonc(text: str) -> str:
    """JSON with ``//`` and ``/* */`` comments and trailing commas (JSONC) as plain JSON."""
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        char = text[i]
        if in_string:
            out.append(char)
            if char == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if char == '"':
                in_string = False
            i += 1
            continue
        if char == '"':
            in_string = True
            out.append(char)
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        else:
            out.append(char)
            i += 1
    return re.sub(r",(\s*[}\]])", r"\1", "".join(out))


# -- weald.toml text ------------------------------------------------------------------------------------


def _key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def server_tables(servers: Mapping[str, Mapping[str, Any]]) -> str:
    """The ``[mcp.servers.NAME]`` tables (with their ``env``, ``headers``, ``auth`` subtables) as TOML text."""
    blocks: list[str] = []
    for name, table in servers.items():
        head = f"mcp.servers.{_key(name)}"
        lines = [f"[{head}]"]
        subtables: list[str] = []
        for key, value in table.items():
            if isinstance(value, Mapping):
                body = "".join(f"{_key(k)} = {_value(v)}\n" for k, v in value.items())
                subtables.append(f"[{head}.{_key(key)}]\n{body}")
            else:
                lines.append(f"{_key(key)} = {_value(value)}")
        blocks.append("\n".join(lines) + "\n" + "".join("\n" + sub for sub in subtables))
    return "\n".join(blocks)


def _header_names(name: str) -> set[str]:
    """The spellings of the table header ``[mcp.servers.NAME]`` (bare, quoted, spaced) TOML allows."""
    quoted = json.dumps(name, ensure_ascii=False)
    literal = f"'{name}'"
    keys = {quoted, literal} | ({name} if _BARE_KEY.fullmatch(name) else set())
    return {f"mcp.servers.{key}" for key in keys}


_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")


def remove_server_tables(text: str, name: str) -> tuple[str, bool]:
    """``text`` without the ``[mcp.servers.NAME]`` table and its subtables; and whether it had one."""
    heads = _header_names(name)
    kept: list[str] = []
    removing = False
    found = False
    for line in text.splitlines(keepends=True):
        match = _HEADER.match(line)
        if match:
            header = re.sub(r"\s*\.\s*", ".", match.group(1))
            removing = header in heads or any(header.startswith(head + ".") for head in heads)
            found = found or removing
        if not removing:
            kept.append(line)
    result = "".join(kept)
    return re.sub(r"\n{3,}", "\n\n", result), found
