"""The one cattrs converter for ``weald.toml``, strict where cattrs is lenient, and its error reports.

cattrs' defaults coerce: ``int("12")``, ``str(5)``, a string iterated into a
tuple of characters. A config file wants the opposite, so every primitive
hook here checks the TOML type and raises `InvalidValue` instead. Structuring
runs with detailed validation and ``forbid_extra_keys``; `problems_from`
walks the resulting `ClassValidationError` tree into ``(key path, message)``
pairs that read as a person would write them.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import attrs
from cattrs import BaseValidationError
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.preconf.tomllib import make_converter
from weald.runtime._checks import (
    CHECK,
    InvalidValue,
    KeyPath,
    ValueProblem,
    ValueProblems,
    check_bool,
    check_nonnegative_seconds,
    check_positive_int,
    check_seconds,
    check_str_table,
    check_str_tuple,
    format_path,
    walk_problems,
)
from weald.runtime._secrets import REDACTED, is_secret_name, redact_secret_values
from weald.runtime.daemon._config_model import (
    TOML_KEY,
    AcpConfig,
    AgentConfig,
    AliasLimits,
    ClusterConfig,
    Config,
    ContextConfig,
    DaemonConfig,
    FaultsConfig,
    HistoryConfig,
    LimitsConfig,
    MCPAuthConfig,
    MCPConfig,
    MCPServerConfig,
    ModelsConfig,
    ProviderConfig,
    SpillConfig,
    StateConfig,
    StoreConfig,
    TelemetryConfig,
    ToolsConfig,
    check_full_model_spec,
    check_network,
    check_sandbox_mode,
)

__all__ = [
    "BUILTIN_TOOLS",
    "TOOLS_KEYS",
    "KeyPath",
    "converter",
    "format_path",
    "problems_from",
    "structure_config",
    "unstructure_config",
]

Hook = Callable[[Any, Any], Any]

#: One converter for every config class (TOML-flavoured: tuples unstructure to lists).
converter: Final = make_converter(forbid_extra_keys=True)

# ModelsConfig and ToolsConfig have hooks of their own (below).
_SECTIONS: Final = (
    Config,
    ProviderConfig,
    MCPConfig,
    MCPServerConfig,
    MCPAuthConfig,
    AgentConfig,
    AliasLimits,
    ContextConfig,
    HistoryConfig,
    LimitsConfig,
    StoreConfig,
    SpillConfig,
    DaemonConfig,
    ClusterConfig,
    FaultsConfig,
    StateConfig,
    TelemetryConfig,
    AcpConfig,
)

#: The keys ``[tools]`` itself takes; any other key is a ``[tools.NAME]`` options table.
TOOLS_KEYS: Final = frozenset(field.name for field in attrs.fields(ToolsConfig) if field.name != "options")

#: The built-in tools (what ``weald.tools`` registers; a test keeps the two equal).
#: Listed rather than imported: ``weald.tools`` imports this package.
BUILTIN_TOOLS: Final = frozenset(
    {
        "ask_user",
        "debug_state",
        "edit_file",
        "fetch",
        "glob",
        "grep",
        "memory_get",
        "memory_search",
        "memory_set",
        "read_file",
        "recall",
        "shell",
        "sub_agent",
        "tasks",
        "use_skill",
        "write_file",
    }
)

#: The options each ``[tools.NAME]`` table of a built-in tool takes; ``files``
#: is the file tools' shared table. Any other key there is reported (a typo
#: would otherwise leave the option unset); tables of other tools (custom
#: tools, MCP tools) pass through unchecked.
_BUILTIN_TOOL_OPTIONS: Final[Mapping[str, frozenset[str]]] = {
    **{name: frozenset({"timeout"}) for name in BUILTIN_TOOLS},
    "shell": frozenset(
        {"timeout", "env", "env_keep", "kill_grace", "sandbox", "network", "writable", "readable", "hidden"}
    ),
    "files": frozenset({"allow_hardlinks", "max_read_bytes"}),
}

#: Options of the built-in tools whose values are checked.
_TOOL_OPTION_CHECKS: Final[Mapping[tuple[str, str], Hook]] = {
    ("shell", "env_keep"): check_str_tuple,
    ("shell", "env"): check_str_table,
    ("shell", "kill_grace"): check_nonnegative_seconds,
    ("shell", "sandbox"): check_sandbox_mode,
    ("shell", "network"): check_network,
    ("shell", "writable"): check_str_tuple,
    ("shell", "readable"): check_str_tuple,
    ("shell", "hidden"): check_str_tuple,
    ("files", "allow_hardlinks"): check_bool,
    ("files", "max_read_bytes"): check_positive_int,
}

_PERMISSIONS: Final = ("allow", "ask", "deny")


def _one_of(choices: tuple[object, ...]) -> str:
    shown = [f'"{choice}"' if isinstance(choice, str) else repr(choice) for choice in choices]
    return ", ".join(shown[:-1]) + f" or {shown[-1]}" if len(shown) > 1 else shown[0]


def _table(value: object, what: str = "a table") -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise InvalidValue(what, value)
    return value


# --- Primitive hooks: the TOML type or an error, never a coercion ---------------------------------


def _structure_str(value: object, _type: object) -> str:
    if not isinstance(value, str):
        raise InvalidValue("a string", value)
    return value


def _structure_int(value: object, _type: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue("an integer", value)
    return value


def _structure_float(value: object, _type: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidValue("a number", value)
    return float(value)


def _structure_path(value: object, _type: object) -> Path:
    if isinstance(value, str) and value:
        return Path(value)
    if isinstance(value, os.PathLike):
        return Path(value)
    raise InvalidValue("a path (a non-empty string)", value)


converter.register_structure_hook(str, _structure_str)
converter.register_structure_hook(int, _structure_int)
converter.register_structure_hook(float, _structure_float)
converter.register_structure_hook(bool, check_bool)
converter.register_structure_hook(Path, _structure_path)
converter.register_unstructure_hook(Path, str)


def _is_optional(type_: Any) -> bool:
    return typing.get_origin(type_) in (typing.Union, types.UnionType) and type(None) in typing.get_args(type_)


def _optional_hook(type_: Any) -> Hook:
    others = [arg for arg in typing.get_args(type_) if arg is not type(None)]
    inner = others[0] if len(others) == 1 else typing.Union[tuple(others)]  # noqa: UP007 - built at run time
    inner_hook = converter.get_structure_hook(inner)

    def structure_optional(value: object, _type: object) -> object:
        return None if value is None else inner_hook(value, inner)

    return structure_optional


def _is_literal(type_: Any) -> bool:
    return typing.get_origin(type_) is Literal


def _literal_hook(type_: Any) -> Hook:
    choices = typing.get_args(type_)

    def structure_literal(value: object, _type: object) -> object:
        # `in` alone would let True through for a Literal[1]; compare types too.
        if any(type(value) is type(choice) and value == choice for choice in choices):
            return value
        raise InvalidValue(_one_of(choices), value)

    return structure_literal


def _is_str_mapping(type_: Any) -> bool:
    origin = typing.get_origin(type_)
    return origin in (Mapping, dict, typing.Mapping) and typing.get_args(type_)[:1] == (str,)


def _mapping_hook(type_: Any) -> Hook:
    value_type = typing.get_args(type_)[1]
    value_hook = converter.get_structure_hook(value_type)

    def structure_mapping(value: object, _type: object) -> dict[str, object]:
        table = _table(value)
        result: dict[str, object] = {}
        problems: list[tuple[KeyPath, BaseException]] = []
        for key, item in table.items():
            try:
                result[key] = value_hook(item, value_type)
            except (ValueProblem, BaseValidationError) as exc:
                problems.append(((key,), exc))
        if problems:
            raise ValueProblems(problems)
        return result

    return structure_mapping


converter.register_structure_hook_factory(_is_optional, _optional_hook)
converter.register_structure_hook_factory(_is_literal, _literal_hook)
converter.register_structure_hook_factory(_is_str_mapping, _mapping_hook)


# --- Hooks for fields whose shape is more than a type ---------------------------------------------


_ALIAS_TABLE: Final = 'a "provider:model" string, or a table with model (and context_window, output_reserve)'


def _structure_alias_tables(value: object) -> tuple[dict[str, str], dict[str, AliasLimits]]:
    """``[models.aliases]``: each alias a spec string, or a table with ``model`` and the model's window."""
    table = _table(value)
    aliases: dict[str, str] = {}
    limits: dict[str, AliasLimits] = {}
    problems: list[tuple[KeyPath, BaseException]] = []
    for name, item in table.items():
        if ":" in name or not name.strip():
            problems.append(((name,), ValueProblem('an alias name must be non-empty and cannot contain ":"')))
            continue
        if isinstance(item, Mapping):
            fields = dict(item)
            if "model" not in fields:
                problems.append(((name, "model"), ValueProblem('missing: the alias\'s "provider:model" spec')))
                continue
            spec = fields.pop("model")
            try:
                aliases[name] = check_full_model_spec(spec)
            except ValueProblem as exc:
                problems.append(((name, "model"), exc))
            try:
                window = converter.structure(fields, AliasLimits)
            except (ValueProblem, BaseValidationError) as exc:
                problems.append(((name,), exc))
                continue
            if window != AliasLimits():
                limits[name] = window
            continue
        if not isinstance(item, str):
            problems.append(((name,), InvalidValue(_ALIAS_TABLE, item)))
            continue
        try:
            aliases[name] = check_full_model_spec(item)
        except ValueProblem as exc:
            problems.append(((name,), exc))
    if problems:
        raise ValueProblems(problems)
    return aliases, limits


def _structure_providers(value: object, _type: object) -> dict[str, ProviderConfig]:
    table = _table(value)
    result: dict[str, ProviderConfig] = {}
    problems: list[tuple[KeyPath, BaseException]] = []
    for name, item in table.items():
        if ":" in name or not name.strip():
            problems.append(((name,), ValueProblem('a provider name must be non-empty and cannot contain ":"')))
            continue
        if name == "scripted":
            problems.append(((name,), ValueProblem("the name scripted is taken by the built-in script provider")))
            continue
        if not isinstance(item, Mapping):
            problems.append(((name,), InvalidValue("a table", item)))
            continue
        with_kind = dict(item)
        with_kind.setdefault("kind", name if name in ("openai", "anthropic") else "openai")
        try:
            result[name] = converter.structure(with_kind, ProviderConfig)
        except (ValueProblem, BaseValidationError) as exc:
            problems.append(((name,), exc))
    if problems:
        raise ValueProblems(problems)
    return result


def _check_permission(value: object) -> str:
    if isinstance(value, str) and value in _PERMISSIONS:
        return value
    raise InvalidValue(_one_of(_PERMISSIONS), value)


def _structure_permissions(value: object, _type: object) -> dict[str, object]:
    table = _table(value)
    result: dict[str, object] = {}
    problems: list[tuple[KeyPath, BaseException]] = []
    for tool_name, rule in table.items():
        if isinstance(rule, Mapping):
            patterns: dict[str, str] = {}
            for pattern, permission in rule.items():
                try:
                    patterns[pattern] = _check_permission(permission)
                except ValueProblem as exc:
                    problems.append(((tool_name, pattern), exc))
            result[tool_name] = patterns
        elif isinstance(rule, str):
            try:
                result[tool_name] = _check_permission(rule)
            except ValueProblem as exc:
                problems.append(((tool_name,), exc))
        else:
            expected = f"{_one_of(_PERMISSIONS)}, or a table of command patterns"
            problems.append(((tool_name,), InvalidValue(expected, rule)))
    if problems:
        raise ValueProblems(problems)
    return result


def _structure_timeouts(value: object, _type: object) -> dict[str, float]:
    table = _table(value)
    result: dict[str, float] = {}
    problems: list[tuple[KeyPath, BaseException]] = []
    for tool_name, seconds in table.items():
        try:
            result[tool_name] = check_seconds(seconds)
        except ValueProblem as exc:
            problems.append(((tool_name,), exc))
    if problems:
        raise ValueProblems(problems)
    return result


def _structure_servers(value: object, _type: object) -> dict[str, MCPServerConfig]:
    table = _table(value)
    result: dict[str, MCPServerConfig] = {}
    problems: list[tuple[KeyPath, BaseException]] = []
    for name, item in table.items():
        if not name.strip():
            problems.append(((name,), ValueProblem("a server name must be non-empty")))
            continue
        try:
            result[name] = converter.structure(item, MCPServerConfig)
        except (ValueProblem, BaseValidationError) as exc:
            problems.append(((name,), exc))
    if problems:
        raise ValueProblems(problems)
    return result


_FIELD_HOOKS: Final[Mapping[tuple[type, str], Hook]] = {
    (Config, "providers"): _structure_providers,
    (ToolsConfig, "permissions"): _structure_permissions,
    (ToolsConfig, "timeouts"): _structure_timeouts,
    (MCPConfig, "servers"): _structure_servers,
}


def _overrides(cls: type) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for field in attrs.fields(cls):
        hook = _FIELD_HOOKS.get((cls, field.name)) or field.metadata.get(CHECK)
        rename = field.metadata.get(TOML_KEY)
        if hook is not None or rename is not None:
            overrides[field.name] = override(struct_hook=hook, rename=rename)
    return overrides


def _section_hook(cls: type) -> Hook:
    structure_fields: Hook = make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True, **_overrides(cls))

    def structure_section(value: object, type_: object) -> object:
        return structure_fields(_table(value), type_)

    return structure_section


converter.register_structure_hook_factory(lambda type_: type_ in _SECTIONS, _section_hook)


# --- [tools]: its own keys, plus [tools.NAME] option tables ---------------------------------------

_structure_tools_keys = make_dict_structure_fn(
    ToolsConfig,
    converter,
    _cattrs_forbid_extra_keys=True,
    **_overrides(ToolsConfig),
    options=override(omit=True),
)


def _check_tool_option(tool_name: str, key: str, value: object) -> None:
    if is_secret_name(key):
        raise ValueProblem(_USE_THE_ENVIRONMENT)
    known = _BUILTIN_TOOL_OPTIONS.get(tool_name)
    if known is not None and key not in known:
        raise ValueProblem(_unknown_option_message(key, known))
    check = _TOOL_OPTION_CHECKS.get((tool_name, key))
    if check is not None:
        check(value, None)


_OPTIONS_TABLE: Final = (
    "unknown key; a tool's options go in its own table, [tools.NAME] (like [tools.shell]), not under [tools.options]"
)


def _check_shorthand_timeout(tool_name: str, seconds: object, timeouts: object) -> float:
    checked = check_seconds(seconds)
    if isinstance(timeouts, Mapping) and tool_name in timeouts:
        raise ValueProblem(f"also set as tools.timeouts.{format_path((tool_name,))}; set it in one place")
    return checked


def _structure_tools(value: object, _type: object) -> ToolsConfig:
    table = _table(value)
    problems: list[tuple[KeyPath, BaseException]] = []
    options: dict[str, dict[str, object]] = {}
    shorthand: dict[str, object] = {}
    for name, item in table.items():
        if name in TOOLS_KEYS:
            continue
        if name == "options":
            # ToolsConfig.options is the Python name; in the file each tool has its own table.
            problems.append(((name,), ValueProblem(_OPTIONS_TABLE)))
            continue
        if not isinstance(item, Mapping):
            problems.append(((name,), ValueProblem(_unknown_tools_key(name))))
            continue
        tool_options = dict(item)
        if "timeout" in tool_options and "timeout" in _BUILTIN_TOOL_OPTIONS.get(name, {"timeout"}):
            shorthand[name] = tool_options.pop("timeout")
        for key, option in tool_options.items():
            try:
                _check_tool_option(name, key, option)
            except ValueProblem as exc:
                problems.append(((name, key), exc))
        options[name] = tool_options
    timeouts = table.get("timeouts")
    shorthand_seconds: dict[str, float] = {}
    for name, seconds in shorthand.items():
        try:
            shorthand_seconds[name] = _check_shorthand_timeout(name, seconds, timeouts)
        except ValueProblem as exc:
            problems.append(((name, "timeout"), exc))
    try:
        tools = _structure_tools_keys({k: v for k, v in table.items() if k in TOOLS_KEYS}, ToolsConfig)
    except BaseValidationError as exc:
        problems.append(((), exc))
    if problems:
        raise ValueProblems(problems)
    return attrs.evolve(tools, timeouts={**tools.timeouts, **shorthand_seconds}, options=options)


converter.register_structure_hook(ToolsConfig, _structure_tools)

# --- [models]: aliases are strings or tables; the tables' windows go to ModelsConfig.limits -------

_structure_models_keys = make_dict_structure_fn(
    ModelsConfig,
    converter,
    _cattrs_forbid_extra_keys=True,
    **_overrides(ModelsConfig),
    aliases=override(omit=True),
    limits=override(omit=True),
)


def _structure_models(value: object, _type: object) -> ModelsConfig:
    table = _table(value)
    problems: list[tuple[KeyPath, BaseException]] = []
    aliases: dict[str, str] = {}
    limits: dict[str, AliasLimits] = {}
    if "aliases" in table:
        try:
            aliases, limits = _structure_alias_tables(table["aliases"])
        except ValueProblem as exc:
            problems.append((("aliases",), exc))
    try:
        models = _structure_models_keys({k: v for k, v in table.items() if k != "aliases"}, ModelsConfig)
    except BaseValidationError as exc:
        problems.append(((), exc))
    if problems:
        raise ValueProblems(problems)
    return attrs.evolve(models, aliases=aliases, limits=limits)


converter.register_structure_hook(ModelsConfig, _structure_models)

_unstructure_models_keys = make_dict_unstructure_fn(
    ModelsConfig, converter, aliases=override(omit=True), limits=override(omit=True)
)


def _unstructure_models(models: ModelsConfig) -> dict[str, object]:
    data: dict[str, object] = _unstructure_models_keys(models)
    aliases: dict[str, object] = {}
    for name, spec in models.aliases.items():
        limits = models.limits.get(name)
        if limits is None or limits == AliasLimits():
            aliases[name] = spec
        else:
            aliases[name] = {"model": spec, **converter.unstructure(limits)}
    data["aliases"] = aliases
    return data


converter.register_unstructure_hook(ModelsConfig, _unstructure_models)

_unstructure_tools_keys = make_dict_unstructure_fn(ToolsConfig, converter, options=override(omit=True))


def _unstructure_tools(tools: ToolsConfig) -> dict[str, object]:
    data: dict[str, object] = _unstructure_tools_keys(tools)
    for name, options in tools.options.items():
        data[name] = converter.unstructure(dict(options))
    return data


converter.register_unstructure_hook(ToolsConfig, _unstructure_tools)
converter.register_unstructure_hook(
    MCPConfig, make_dict_unstructure_fn(MCPConfig, converter, imports=override(rename="import"))
)


def structure_config(data: Mapping[str, object]) -> Config:
    """Structure plain data into a `Config`.

    Raises:
        ValueProblem: The top level is not a table.
        BaseValidationError: Anything below it is wrong; see `problems_from`.
    """
    return converter.structure(data, Config)


# --- Unstructuring --------------------------------------------------------------------------------

_SECRET_TABLES: Final = frozenset({"env", "headers", "extra_headers"})


def _clean(value: object, key: str | None = None, *, hide: bool = True) -> object:
    if isinstance(value, Mapping):
        cleaned: dict[str, object] = {}
        for name, item in value.items():
            if item is None:
                continue
            if hide and key in _SECRET_TABLES and is_secret_name(name) and isinstance(item, str):
                cleaned[name] = REDACTED
            else:
                cleaned[name] = _clean(item, name, hide=hide)
        return cleaned
    if isinstance(value, list | tuple):
        return [_clean(item, hide=hide) for item in value]
    if hide and isinstance(value, str):
        return redact_secret_values(value)  # a password in a URL, an sk-... key, wherever it was written
    return value


def unstructure_config(config: Config, *, redact: bool = True) -> dict[str, object]:
    """The config as plain TOML-compatible data, for ``weald config show``.

    Paths become strings, tuples lists, and keys whose value is None are left out (TOML has no
    null; None is every such key's default), so `config_from_dict` reads the result back to an
    equal config. Values of secret-looking names in ``env``, ``headers`` and ``extra_headers``
    tables are replaced by ``[redacted]``, and so are credentials known by their shape in any value (a URL's
    password, an ``sk-...`` key), unless ``redact`` is false (data kept in memory, never shown).
    """
    cleaned = _clean(converter.unstructure(config), hide=redact)
    assert isinstance(cleaned, dict)
    return cleaned


# --- Reporting ------------------------------------------------------------------------------------

_USE_THE_ENVIRONMENT: Final = (
    "secrets do not belong in weald.toml: put the value in an environment variable and have the tool read it there"
)


def _env_name_for(provider: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", provider).strip("_").upper() + "_API_KEY"


def _secret_message(path: KeyPath, key: str = "") -> str:
    if len(path) == 2 and path[0] == "providers" and isinstance(path[1], str):
        return (
            "API keys do not belong in weald.toml: put the key in an environment variable "
            f'and name that variable here with api_key_env = "{_env_name_for(path[1])}"'
        )
    if len(path) == 4 and path[:2] == ("mcp", "servers") and path[3] == "auth":
        field = "private_key_env" if "key" in key.lower() else "client_secret_env"
        return (
            "secrets do not belong in weald.toml: put it in an environment variable "
            f"and name that variable here with {field}"
        )
    return _USE_THE_ENVIRONMENT


def _unknown_tools_key(key: str) -> str:
    close = difflib.get_close_matches(key, sorted(TOOLS_KEYS), n=1)
    hint = f"did you mean {close[0]}?" if close else f"[tools] takes {', '.join(sorted(TOOLS_KEYS))}"
    return f"unknown key; {hint} (a [tools.NAME] table holds a tool's options)"


def _unknown_option_message(key: str, known: Iterable[str]) -> str:
    options = sorted(known)
    close = difflib.get_close_matches(key, options, n=1)
    listed = f"known options: {', '.join(options)}"
    return f"unknown option; did you mean {close[0]}? ({listed})" if close else f"unknown option; {listed}"


def _unknown_key_message(cls: type, path: KeyPath, key: str) -> str:
    if is_secret_name(key):
        return _secret_message(path, key)
    known = sorted(field.name for field in attrs.fields(cls))
    what = "section" if cls is Config else "key"
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"unknown {what}; did you mean {close[0]}?"
    return f"unknown {what}; expected one of: {', '.join(known)}"


def problems_from(exc: BaseException, path: KeyPath = ()) -> Iterator[tuple[KeyPath, str]]:
    """Every problem in a structuring error, as (key path, message), in the file's order."""
    return walk_problems(exc, path, unknown_key=_unknown_key_message)
