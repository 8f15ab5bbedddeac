"""Finding, reading, merging and checking ``weald.toml`` files.

Which files: the user file (``~/.weald/weald.toml``; ``$WEALD_HOME/weald.toml``
when ``WEALD_HOME`` is set; the file ``$WEALD_CONFIG`` names when that is set),
then the project file: ``weald.toml`` in the project directory, the nearest
directory at or above the start (a session's working directory, the CLI's
current one) that holds ``weald.toml`` or ``.weald/`` (`find_project_root`).

The pipeline, for one or more sources (user first, then project):

1. parse each file with `tomllib` (a syntax error names the file, line and column);
2. structure each source on its own, so a wrong type or unknown key is
   reported against the file that holds it;
3. normalize each source: relative paths become relative to its file's
   directory, ``[tools.NAME] timeout`` moves to ``[tools.timeouts]``;
4. deep-merge the sources (tables merge key by key, anything else is
   replaced by the later source) and structure the result;
5. expand ``~`` and fill the socket's default from the environment;
6. check what only the merged whole can tell: model names that refer to
   providers and aliases, and each MCP server's transport.

Problems are collected across all steps that can run and raised together
as one `ConfigError`.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import stat
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs
from cattrs import BaseValidationError
from weald.runtime import (
    PLACEHOLDER_FILE_MODE,
    UnreadableFileError,
    check_regular_file,
    read_regular_file,
    replaced_link,
)
from weald.runtime._checks import (
    KeyPath,
    ValueProblem,
    format_path,
)
from weald.runtime.daemon._config_convert import (
    TOOLS_KEYS,
    problems_from,
    structure_config,
)
from weald.runtime.daemon._config_model import (
    Config,
    ConfigError,
    ConfigFile,
    ConfigProblem,
)
from weald.runtime.llm import MAX_SCRIPT_BYTES, PROVIDERS

__all__ = [
    "CONFIG_ENV",
    "CONFIG_FILE_NAME",
    "HOME_ENV",
    "PROJECT_DIR_NAME",
    "LoadedConfig",
    "ProjectFiles",
    "Source",
    "UserFile",
    "config_from_dict",
    "config_from_sources",
    "find_config_files",
    "find_project_files",
    "find_project_root",
    "load_config",
    "load_files",
    "parse_config",
    "project_files_with",
    "project_root_blocking",
    "source_from_data",
    "user_file",
    "value_origins",
    "weald_home",
]

#: The config file's name, in a project directory and in ``~/.weald``.
CONFIG_FILE_NAME = "weald.toml"
#: The directory of a project's weald files (skills), beside its ``weald.toml``.
PROJECT_DIR_NAME = ".weald"
#: The environment variable naming a config file to read instead of the user file.
CONFIG_ENV = "WEALD_CONFIG"
#: The environment variable naming the directory to use instead of ``~/.weald``.
HOME_ENV = "WEALD_HOME"


@attrs.frozen
class Source:
    """One parsed config file (or string, or dict).

    Attributes:
        label: Names it in error messages (the file's path, or ``<string>``).
        data: Its tables, as `tomllib` returns them.
        base_dir: The directory relative paths in it are relative to; None
            leaves them relative.
        digest: For a file, ``sha256:`` and the hex digest of its bytes.
    """

    label: str
    data: Mapping[str, object]
    base_dir: Path | None = None
    digest: str = ""


def source_from_data(data: Mapping[str, object], label: str, base_dir: Path | None = None) -> Source:
    """A `Source` from already-parsed data."""
    return Source(label=label, data=data, base_dir=base_dir)


def config_from_dict(data: Mapping[str, object], *, source: str = "<dict>") -> Config:
    """Check and structure plain data shaped like ``weald.toml`` (what `config_to_dict` gives back).

    Args:
        data: The file's tables as dicts (what `tomllib` returns).
        source: Names the data in error messages.

    Raises:
        ConfigError: Every problem found, each with its key path.
    """
    return config_from_sources([source_from_data(data, source)])


# --- Reading --------------------------------------------------------------------------------------

#: The largest config file read (a FIFO, a device or a huge file is refused, never waited on).
MAX_CONFIG_BYTES = 4 * 1024 * 1024

#: The deepest nesting of tables and arrays a config may have (weald's own keys nest 6 deep at most).
MAX_DEPTH = 32

_AT_END = " (at end of document)"
_TOML_POSITION = re.compile(r"^(?P<message>.*?) \(at line (?P<line>\d+), column (?P<column>\d+)\)$", re.DOTALL)


def _parse_toml(text: str, label: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except RecursionError:
        # tomllib recurses into inline arrays and tables: thousands deep, Python's stack ends first.
        message = f"invalid TOML: arrays or inline tables nest too deeply (weald reads at most {MAX_DEPTH} levels)"
        raise ConfigError([ConfigProblem(label, "", message)]) from None
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        if match := _TOML_POSITION.match(message):
            line, column, message = int(match["line"]), int(match["column"]), match["message"]
        elif message.endswith(_AT_END):
            # tomllib names no position for an unfinished document: its end is the place.
            lines = text.split("\n")
            line, column, message = len(lines), len(lines[-1]) + 1, message.removesuffix(_AT_END)
        else:
            raise ConfigError([ConfigProblem(label, "", f"invalid TOML: {message}")]) from exc
        raise ConfigError([ConfigProblem(label, "", f"invalid TOML: {message}", line=line, column=column)]) from exc


def _read_file(path: Path, *, required: bool) -> Source | None:
    label = str(path)
    try:
        raw = read_regular_file(path, max_bytes=MAX_CONFIG_BYTES, what="the config file")
    except UnreadableFileError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            if not required:
                return None
            missing = f"{CONFIG_ENV} names this file, which does not exist"
            raise ConfigError([ConfigProblem(label, "", missing)]) from exc
        raise ConfigError([ConfigProblem(label, "", str(exc).replace(f"the config file {label} ", "", 1))]) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigProblem(label, "", f"not UTF-8 text (byte {exc.start})")]) from exc
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    return Source(label=label, data=_parse_toml(text, label), base_dir=path.parent, digest=digest)


def _expand_home(path: Path, home: Path) -> Path:
    parts = path.parts
    if parts and parts[0] == "~":
        return home.joinpath(*parts[1:])
    if parts and parts[0].startswith("~"):
        return path.expanduser()  # ~user
    return path


def weald_home(*, home: Path | None = None, environ: Mapping[str, str] = os.environ) -> Path:
    """Weald's own directory: ``$WEALD_HOME`` when set (and not empty), else ``~/.weald``.

    It holds the user file (``weald.toml``), the user's skills (``skills/``)
    and, unless ``[daemon] state_dir`` says otherwise, the daemon's state.
    """
    home_dir = Path.home() if home is None else home
    explicit = environ.get(HOME_ENV, "")
    if explicit:
        return _expand_home(Path(explicit), home_dir).absolute()
    return home_dir / ".weald"


def _trusted(info: os.stat_result) -> bool:
    """Whether a project marker may configure weald: yours (or root's), and not writable by everyone."""
    return info.st_uid in (os.geteuid(), 0) and not info.st_mode & stat.S_IWOTH


def find_project_root(start: Path, *, home: Path | None = None) -> tuple[Path | None, tuple[str, ...]]:
    """The project directory of ``start``: the nearest directory at or above it holding ``weald.toml`` or ``.weald/``.

    The walk stops below the home directory (``~/.weald`` is the user's, not a
    project's), below a directory anyone may write to (``/tmp``: whoever
    wrote ``/tmp/weald.toml`` must not configure every project under it), and
    below ``/``. A marker that is not yours (or root's), or that anyone may
    write to, is passed over and named in the second value, as git refuses a
    repository another user owns; so is a ``weald.toml`` that is a placeholder
    of the shell's sandbox. Blocking (it stats each directory).

    Returns:
        The project directory (None: no project file or directory up to where
        the walk stops), and the markers passed over.
    """
    root, ignored, _ = _project_root(os.path.abspath(start), str(Path.home() if home is None else home))
    return (None if root is None else Path(root)), ignored


def _project_root(start: str, home: str) -> tuple[str | None, tuple[str, ...], os.stat_result | None]:
    """`find_project_root` on strings (the watcher runs it for every directory each second), with the file's stat.

    Returns:
        The project directory, the markers passed over, and the stat of its
        ``weald.toml`` when it is a usable file (None: no project file).
    """
    ignored: list[str] = []
    directory = start
    while True:
        parent = os.path.dirname(directory)
        if directory in (home, parent):
            return None, tuple(ignored), None
        try:
            if os.stat(directory).st_mode & stat.S_IWOTH:
                return None, tuple(ignored), None
        except OSError:
            return None, tuple(ignored), None
        found = False
        config_info: os.stat_result | None = None
        for name, kind in ((CONFIG_FILE_NAME, stat.S_ISREG), (PROJECT_DIR_NAME, stat.S_ISDIR)):
            marker = f"{directory}/{name}" if directory != "/" else f"/{name}"
            try:
                info = os.stat(marker)
            except OSError:
                continue
            if not kind(info.st_mode):
                continue
            if name == CONFIG_FILE_NAME and _is_placeholder_file(info):
                continue  # a placeholder the shell's sandbox holds while a command runs: no config
            if _trusted(info):
                found = True
                if name == CONFIG_FILE_NAME:
                    config_info = info
            else:
                ignored.append(marker)
        if found:
            return directory, tuple(ignored), config_info
        directory = parent


def project_root_blocking(start: str, home: str) -> tuple[str | None, tuple[str, ...], os.stat_result | None]:
    """`find_project_root` on strings, with the stat of the project's ``weald.toml`` (None: no usable one)."""
    return _project_root(start, home)


def _is_placeholder_file(info: os.stat_result) -> bool:
    """What `is_placeholder` says of a file, from a stat already made."""
    return stat.S_IMODE(info.st_mode) == PLACEHOLDER_FILE_MODE and info.st_size == 0


@attrs.frozen
class ProjectFiles:
    """Where the configuration of one directory comes from.

    Attributes:
        start: The directory the project was looked for from.
        root: The project directory (holding ``weald.toml`` or ``.weald/``);
            None when there is none.
        user: The user file: the file ``$WEALD_CONFIG`` names, else
            ``weald.toml`` in `weald_home`; None when it does not exist.
        project: ``weald.toml`` in ``root``, when it exists (and is not the user file).
        explicit: Whether ``user`` comes from ``$WEALD_CONFIG`` (then it must exist).
        ignored: Project markers passed over (see `find_project_root`).
    """

    start: Path
    root: Path | None
    user: Path | None
    project: Path | None
    explicit: bool = False
    ignored: tuple[str, ...] = ()

    @property
    def paths(self) -> tuple[Path, ...]:
        """The files to read, lowest precedence first."""
        return tuple(path for path in (self.user, self.project) if path is not None)


def find_project_files(
    start: Path | None,
    *,
    home: Path | None = None,
    environ: Mapping[str, str] = os.environ,
) -> ProjectFiles:
    """The files the configuration of ``start`` is read from (see `ProjectFiles`); blocking.

    Args:
        start: The directory (a session's working directory, the CLI's
            current one); None: no project, the user file only.
        home: The user's home directory; None means `Path.home`.
        environ: The environment, for ``WEALD_CONFIG`` and ``WEALD_HOME``.
    """
    home_dir = Path.home() if home is None else home
    return project_files_with(start, home_dir, user_file(home=home_dir, environ=environ))


@attrs.frozen
class UserFile:
    """The user file, as `find_project_files` looks for it: ``$WEALD_CONFIG``'s, else ``weald.toml`` in `weald_home`.

    Attributes:
        path: The file; None when it does not exist (and is not ``$WEALD_CONFIG``'s).
        explicit: Whether ``$WEALD_CONFIG`` names it (then it must exist).
        identity: Its device and inode, when it exists.
    """

    path: Path | None
    explicit: bool
    identity: tuple[int, int] | None = None
    stat: tuple[int, int, int, int, int] | None = None  # device, inode, size, mtime_ns, ctime_ns


def user_file(*, home: Path | None = None, environ: Mapping[str, str] = os.environ) -> UserFile:
    """Where the user file is (blocking: one stat)."""
    home_dir = Path.home() if home is None else home
    explicit = environ.get(CONFIG_ENV, "")
    path = (
        _expand_home(Path(explicit), home_dir).absolute()
        if explicit
        else weald_home(home=home_dir, environ=environ) / CONFIG_FILE_NAME
    )
    try:
        info = os.stat(path)
    except OSError:
        return UserFile(path=path if explicit else None, explicit=bool(explicit))
    return UserFile(
        path=path,
        explicit=bool(explicit),
        identity=(info.st_dev, info.st_ino),
        stat=(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns),
    )


def project_files_with(start: Path | None, home: Path, user: UserFile) -> ProjectFiles:
    """`find_project_files` with the user file looked up already (the watcher looks once per pass)."""
    if start is None:
        return ProjectFiles(start=home, root=None, user=user.path, project=None, explicit=user.explicit)
    begin = os.path.abspath(start)
    root, ignored, info = _project_root(begin, str(home))
    project = None
    if root is not None and info is not None and (info.st_dev, info.st_ino) != user.identity:
        project = Path(root) / CONFIG_FILE_NAME
    return ProjectFiles(
        start=Path(begin),
        root=None if root is None else Path(root),
        user=user.path,
        project=project,
        explicit=user.explicit,
        ignored=ignored,
    )


def find_config_files(
    project_dir: Path | None = None,
    *,
    home: Path | None = None,
    environ: Mapping[str, str] = os.environ,
) -> tuple[Path, ...]:
    """The config files `load_config` reads, lowest precedence first.

    The user file (the file ``$WEALD_CONFIG`` names, which must exist, else
    ``weald.toml`` in `weald_home` if it exists), then the project file of
    ``project_dir`` (see `find_project_root`), if there is one.

    Args:
        project_dir: Where to look for the project from; None reads no project file.
        home: The user's home directory; None means `Path.home`.
        environ: The environment, for ``WEALD_CONFIG`` and ``WEALD_HOME``.
    """
    return find_project_files(project_dir, home=home, environ=environ).paths


# --- Normalizing and merging ----------------------------------------------------------------------

# Keys holding paths: (section, key), or ("mcp", "servers", *, key).
_PATH_KEYS = (
    ("store", "path"),
    ("spill", "dir"),
    ("server", "socket"),
    ("faults", "file"),
    ("daemon", "state_dir"),
    ("cluster", "secret_file"),
    ("cluster", "tls_cert"),
    ("cluster", "tls_key"),
    ("cluster", "tls_ca"),
)


def _resolve_relative(value: object, base_dir: Path) -> object:
    if not isinstance(value, str) or not value or value.startswith("~") or Path(value).is_absolute():
        return value
    return str(base_dir / value)


def _normalized(source: Source) -> dict[str, object]:
    """A copy of the source's data with paths made absolute and tool timeouts in one place."""
    data = _copy_tables(source.data)
    if source.base_dir is not None:
        for section, key in _PATH_KEYS:
            table = data.get(section)
            if isinstance(table, dict) and key in table:
                table[key] = _resolve_relative(table[key], source.base_dir)
        mcp = data.get("mcp")
        if isinstance(mcp, dict) and isinstance(mcp.get("import"), list):
            mcp["import"] = [_resolve_relative(item, source.base_dir) for item in mcp["import"]]
        servers = mcp.get("servers") if isinstance(mcp, dict) else None
        if isinstance(servers, dict):
            for server in servers.values():
                if isinstance(server, dict) and "cwd" in server:
                    server["cwd"] = _resolve_relative(server["cwd"], source.base_dir)
    tools = data.get("tools")
    if isinstance(tools, dict):
        # [tools.NAME] timeout is [tools.timeouts] NAME; folded before merging
        # so either spelling in the project overrides either in home.
        for name, options in list(tools.items()):
            if name not in TOOLS_KEYS and isinstance(options, dict) and "timeout" in options:
                timeouts = tools.setdefault("timeouts", {})
                assert isinstance(timeouts, dict)
                timeouts[name] = options.pop("timeout")
    return data


def _too_deep(data: Mapping[str, object]) -> KeyPath | None:
    """The path to the first table or array nested deeper than `MAX_DEPTH`, or None (no recursion)."""
    stack: list[tuple[object, KeyPath]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_DEPTH:
            return path
        children = node.items() if isinstance(node, Mapping) else enumerate(node) if isinstance(node, list) else ()
        stack.extend((value, (*path, key)) for key, value in children if isinstance(value, Mapping | list))
    return None


def _depth_problems(sources: Iterable[Source]) -> list[ConfigProblem]:
    problems = []
    for source in sources:
        path = _too_deep(source.data)
        if path is not None:
            shown = format_path(path[:4]) + (".(...)" if len(path) > 4 else "")
            message = f"tables or arrays nest more than {MAX_DEPTH} levels deep, the most weald reads"
            problems.append(ConfigProblem(source.label, shown, message))
    return problems


def _copy_tables(data: Mapping[str, object]) -> dict[str, object]:
    return {key: _copy_tables(value) if isinstance(value, Mapping) else value for key, value in data.items()}


def _deep_merge(base: dict[str, object], over: Mapping[str, object]) -> dict[str, object]:
    """``over`` on top of ``base``: tables merge key by key, any other value replaces."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(below, dict) and isinstance(value, Mapping):
            merged[key] = _deep_merge(below, value)
        else:
            merged[key] = value
    return merged


def _has_path(data: Mapping[str, object], path: KeyPath) -> bool:
    node: object = data
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _origin(sources: Iterable[Source], path: KeyPath) -> str:
    """The sources that set ``path`` (joined with `` + ``), for a problem found after merging."""
    sources = list(sources)
    labels = [source.label for source in sources if _has_path(source.data, path)]
    return " + ".join(labels or [source.label for source in sources])


# --- Checking -------------------------------------------------------------------------------------


def _structure_problems(data: Mapping[str, object]) -> list[tuple[KeyPath, str]]:
    try:
        structure_config(data)
    except (ValueProblem, BaseValidationError) as exc:
        return list(problems_from(exc))
    return []


def _model_problems(config: Config) -> list[tuple[KeyPath, str]]:
    known = sorted(set(PROVIDERS) | set(config.providers))
    problems: list[tuple[KeyPath, str]] = []

    def check(path: KeyPath, spec: str) -> None:
        provider, _, model = spec.partition(":")
        provider = provider.strip()
        if provider not in known:
            problems.append(
                (path, f'unknown provider "{provider}"; use one of {", ".join(known)} or add [providers.{provider}]')
            )
        elif provider == "scripted":
            # Checked now, not when an agent first starts (and without opening it: a FIFO is named, not read).
            try:
                check_regular_file(model.strip(), max_bytes=MAX_SCRIPT_BYTES, what="the script")
            except UnreadableFileError as exc:
                problems.append((path, str(exc)))

    for name, spec in config.models.aliases.items():
        check(("models", "aliases", name), spec)
    default = config.models.default
    if default is not None:
        if ":" in default:
            check(("models", "default"), default)
        elif default not in config.models.aliases:
            problems.append(
                (("models", "default"), f'"{default}" is neither a provider:model spec nor a name in [models.aliases]')
            )
    return problems


def _mcp_problems(config: Config) -> list[tuple[KeyPath, str]]:
    problems: list[tuple[KeyPath, str]] = []
    if not config.mcp.servers:
        return problems
    from weald.runtime.mcp import MCPConfigError  # see MCPServerConfig.to_server_config

    for name, server in config.mcp.servers.items():
        try:
            server.to_server_config(name)
        except MCPConfigError as exc:
            # ServerConfig says "invalid MCP server config 'NAME': a; b"; the
            # path already names the server, so keep the list, one per line;
            # "auth.x ..." belongs under the server's auth table.
            _, _, details = str(exc).partition(": ")
            for detail in (details or str(exc)).split("; "):
                if detail.startswith("auth."):
                    problems.append((("mcp", "servers", name, "auth"), detail.removeprefix("auth.")))
                else:
                    problems.append((("mcp", "servers", name), detail))
    return problems


def _finalize(config: Config, merged: Mapping[str, object], home: Path, environ: Mapping[str, str]) -> Config:
    """``~`` expanded, and the state directory's defaults filled: the store, the socket.

    The state directory is ``[daemon] state_dir``, else ``$WEALD_HOME``, else
    ``~/.weald``. The store goes in it unless ``[store] path`` is set; the
    socket too unless ``[server] socket`` is set, except that with neither
    ``state_dir`` nor ``WEALD_HOME`` it goes in ``$XDG_RUNTIME_DIR`` when that is set.
    """

    def given(section: str, key: str) -> bool:
        table = merged.get(section)
        return isinstance(table, Mapping) and key in table

    configured = config.daemon.state_dir
    relocated = configured is not None or bool(environ.get(HOME_ENV, ""))
    state_dir = _expand_home(configured, home) if configured is not None else weald_home(home=home, environ=environ)
    store_path = _expand_home(config.store.path, home) if given("store", "path") else state_dir / "store.db"
    socket = _expand_home(config.server.socket, home)
    if not given("server", "socket"):
        runtime_dir = environ.get("XDG_RUNTIME_DIR", "")
        if not relocated and runtime_dir and Path(runtime_dir).is_absolute():
            socket = Path(runtime_dir) / "weald.sock"
        else:
            socket = state_dir / "weald.sock"
    servers = {
        name: attrs.evolve(server, cwd=None if server.cwd is None else _expand_home(server.cwd, home))
        for name, server in config.mcp.servers.items()
    }
    faults_file = config.faults.file
    spill_dir = config.spill.dir
    return attrs.evolve(
        config,
        store=attrs.evolve(config.store, path=store_path),
        spill=attrs.evolve(config.spill, dir=None if spill_dir is None else _expand_home(spill_dir, home)),
        server=attrs.evolve(config.server, socket=socket),
        faults=attrs.evolve(config.faults, file=None if faults_file is None else _expand_home(faults_file, home)),
        mcp=attrs.evolve(config.mcp, servers=servers),
        daemon=attrs.evolve(config.daemon, state_dir=state_dir),
    )


def _merged(sources: Iterable[Source]) -> dict[str, object]:
    merged: dict[str, object] = {}
    for source in sources:
        merged = _deep_merge(merged, _normalized(source))
    return merged


def _late_problems(config: Config) -> list[tuple[KeyPath, str]]:
    return _model_problems(config) + _mcp_problems(config)


def _without(data: Mapping[str, object], paths: Iterable[KeyPath]) -> dict[str, object]:
    """A copy of ``data`` with the key at each path removed (a path into an array removes the array)."""
    pruned = _copy_tables(data)
    for path in paths:
        keys = list(itertools.takewhile(lambda part: isinstance(part, str), path))
        node: object = pruned
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if keys and isinstance(node, dict):
            node.pop(keys[-1], None)
    return pruned


def _related(path: KeyPath, other: KeyPath) -> bool:
    shorter = min(len(path), len(other))
    return path[:shorter] == other[:shorter]


def _late_problems_despite(found: list[tuple[Source, KeyPath, str]], sources: list[Source]) -> list[ConfigProblem]:
    """The late checks on what is left once the bad keys are dropped, so one run reports those too.

    A late problem that may only be an echo of a bad key (at, above or below
    its path; or a model check while a provider or model key is bad) is left
    out: it would vanish or change once that key is fixed.
    """
    bad = [path for _, path, _ in found]
    pruned = [
        attrs.evolve(source, data=_without(source.data, [path for s, path, _ in found if s is source]))
        for source in sources
    ]
    try:
        config = structure_config(_merged(pruned))
    except (ValueProblem, BaseValidationError):
        return []  # still broken without them (a table that is not a table): report what we have
    models_shaky = any(path[:1] in (("models",), ("providers",)) for path in bad)
    return [
        ConfigProblem(_origin(sources, path), format_path(path), message)
        for path, message in _late_problems(config)
        if not any(_related(path, other) for other in bad) and not (models_shaky and path[:1] == ("models",))
    ]


def config_from_sources(
    sources: list[Source],
    *,
    home: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Check, merge and structure sources (lowest precedence first) into one `Config`.

    Raises:
        ConfigError: Every problem found.
    """
    # Everything below walks the tables recursively: refuse a depth Python's stack cannot take.
    too_deep = _depth_problems(sources)
    if too_deep:
        raise ConfigError(too_deep)
    found = [(source, path, message) for source in sources for path, message in _structure_problems(source.data)]
    if found:
        problems = [ConfigProblem(source.label, format_path(path), message) for source, path, message in found]
        raise ConfigError(problems + _late_problems_despite(found, sources))
    merged = _merged(sources)
    try:
        config = structure_config(merged)
    except (ValueProblem, BaseValidationError) as exc:
        # Each source was fine alone, so merging made these; name every file that set the key.
        raise ConfigError(
            [ConfigProblem(_origin(sources, path), format_path(path), message) for path, message in problems_from(exc)]
        ) from exc
    config = _finalize(
        config,
        merged,
        Path.home() if home is None else home,
        os.environ if environ is None else environ,
    )
    config, import_problems = _with_imports(config, Path.home() if home is None else home)
    late = _late_problems(config)
    if late or import_problems:
        raise ConfigError(
            import_problems
            + [ConfigProblem(_origin(sources, path), format_path(path), message) for path, message in late]
        )
    return config


def _with_imports(config: Config, home: Path) -> tuple[Config, list[ConfigProblem]]:
    """The config with the MCP servers of its ``[mcp] import`` files under its own, and their problems.

    A server weald.toml names itself wins over an imported one of that name;
    between imported files the first wins. What a file holds that cannot be
    translated is not a problem (``weald mcp list`` shows it); a file that
    cannot be read, or a server that translates to an invalid table, is.
    """
    if not config.mcp.imports:
        return config, []
    from weald.runtime.daemon._config_convert import converter
    from weald.runtime.daemon._config_model import MCPServerConfig
    from weald.runtime.daemon._mcp_import import read_foreign_config

    imported: dict[str, MCPServerConfig] = {}
    problems: list[ConfigProblem] = []
    paths = [_expand_home(path, home) for path in config.mcp.imports]
    for path in paths:
        replaced = replaced_link(path)
        if replaced is not None:  # an agent's command swapped a protected link for a file of its own
            problems.append(ConfigProblem(str(path), "", f"cannot import MCP servers (mcp.import): {replaced}"))
            continue
        try:
            found = read_foreign_config(path)
        except ValueError as exc:
            problems.append(ConfigProblem(str(path), "", f"cannot import MCP servers (mcp.import): {exc}"))
            continue
        for name, table in found.servers.items():
            if name in config.mcp.servers or name in imported:
                continue
            try:
                server = converter.structure(dict(table), MCPServerConfig)
            except (ValueProblem, BaseValidationError) as exc:
                problems.extend(
                    ConfigProblem(str(path), format_path(("mcp", "servers", name, *where)), message)
                    for where, message in problems_from(exc)
                )
                continue
            if server.cwd is not None and not server.cwd.is_absolute():
                server = attrs.evolve(server, cwd=path.parent / _expand_home(server.cwd, home))
            imported[name] = server
    servers = {**imported, **config.mcp.servers}
    return attrs.evolve(config, mcp=attrs.evolve(config.mcp, servers=servers, imports=tuple(paths))), problems


def parse_config(
    text: str,
    *,
    source: str = "<string>",
    base_dir: Path | None = None,
    home: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Parse and check the text of one ``weald.toml``.

    Args:
        text: The TOML text.
        source: Names the text in error messages.
        base_dir: What relative paths in it are relative to; None leaves
            them as written.
        home: What ``~`` in paths means; None means `Path.home`.
        environ: The environment, for the socket's default
            (``XDG_RUNTIME_DIR``); None means `os.environ`.

    Returns:
        The config; anything the text does not set has its default.

    Raises:
        ConfigError: Every problem in the text, each with its key path (or,
            for a TOML syntax error, its line and column).
    """
    data = _parse_toml(text, source)
    return config_from_sources([Source(label=source, data=data, base_dir=base_dir)], home=home, environ=environ)


@attrs.frozen
class LoadedConfig:
    """A configuration and the files it was read from.

    Attributes:
        config: The merged configuration.
        files: The files read, lowest precedence first, each with its digest.
        sources: Their parsed contents (for where each value came from).
    """

    config: Config
    files: tuple[ConfigFile, ...]
    sources: tuple[Source, ...] = ()


def load_files(
    files: ProjectFiles,
    *,
    home: Path | None = None,
    environ: Mapping[str, str] = os.environ,
) -> LoadedConfig:
    """Read, check and merge the files of `find_project_files` (blocking).

    Raises:
        ConfigError: Every problem in every file, each line naming the file
            and the key path (or the line and column of a TOML syntax error).
    """
    home_dir = Path.home() if home is None else home
    sources: list[Source] = []
    layers: list[ConfigFile] = []
    problems: list[ConfigProblem] = []
    for path, layer in ((files.user, "user"), (files.project, "project")):
        if path is None:
            continue
        replaced = replaced_link(path)
        if replaced is not None:  # an agent's command swapped a protected link for a file of its own
            problems.append(ConfigProblem(str(path), "", replaced))
            continue
        try:
            source = _read_file(path, required=files.explicit and layer == "user")
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        if source is not None:
            sources.append(source)
            layers.append(ConfigFile(path=str(path), digest=source.digest, layer=layer))  # type: ignore[arg-type]
    if problems:
        # Check the files that did parse too, so one run shows everything.
        for source in sources:
            problems.extend(
                ConfigProblem(source.label, format_path(path), message)
                for path, message in _structure_problems(source.data)
            )
        raise ConfigError(problems)
    config = config_from_sources(sources, home=home_dir, environ=environ)
    return LoadedConfig(config=config, files=tuple(layers), sources=tuple(sources))


def _leaves(value: Mapping[str, object], path: KeyPath = ()) -> list[KeyPath]:
    """The paths of the leaves of nested tables, in the order `weald config show` lists them."""
    leaves: list[KeyPath] = []
    for key, item in value.items():
        if isinstance(item, Mapping) and item:
            leaves.extend(_leaves(item, (*path, key)))
        else:
            leaves.append((*path, key))
    return leaves


def value_origins(loaded: LoadedConfig, plain: Mapping[str, object]) -> dict[str, str]:
    """Where each value of ``plain`` (the config unstructured) came from, by its dotted key (blocking).

    ``default``, or the layer and path of the file that set it last
    (``user: <path>``, ``project: <path>``), or ``import: <path>`` for an MCP
    server read from an ``[mcp] import`` file.
    """
    from weald.runtime.daemon._mcp_import import read_foreign_config

    layers = {file.path: file.layer for file in loaded.files}
    normalized = [(source, _normalized(source)) for source in loaded.sources]
    imported: dict[str, str] = {}
    for imported_file in loaded.config.mcp.imports:
        try:
            names = read_foreign_config(imported_file).servers
        except ValueError:
            continue
        for name in names:
            imported.setdefault(name, f"import: {imported_file}")
    origins: dict[str, str] = {}
    for path in _leaves(plain):
        origin = "default"
        for source, data in normalized:
            if _has_path(data, path):
                origin = f"{layers.get(source.label, 'file')}: {source.label}"
        if origin == "default" and path[:2] == ("mcp", "servers") and len(path) > 2:
            origin = imported.get(str(path[2]), origin)
        origins[".".join(str(part) for part in path)] = origin
    return origins


def load_config(
    project_dir: Path | None = None,
    *,
    home: Path | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Config:
    """Load the configuration: the user file, then the project's ``weald.toml`` over it.

    The user file is ``~/.weald/weald.toml`` (``$WEALD_HOME/weald.toml``, or
    the file ``$WEALD_CONFIG`` names, which must exist); the project file is
    ``weald.toml`` in the nearest directory at or above ``project_dir`` that
    holds ``weald.toml`` or ``.weald/`` (`find_project_root`). Project values
    override user values key by key: tables merge, any other value (arrays
    included) is replaced. Missing files are fine: with none, every value is
    its default.

    Args:
        project_dir: Where to look for the project from; None reads no project file.
        home: The user's home directory (``~``); None means `Path.home`.
        environ: The environment (``WEALD_CONFIG``, ``WEALD_HOME``, ``XDG_RUNTIME_DIR``).

    Returns:
        The merged config.

    Raises:
        ConfigError: Every problem in every file, each line naming the file
            and the key path (or the line and column of a TOML syntax error).
    """
    home_dir = Path.home() if home is None else home
    files = find_project_files(project_dir, home=home_dir, environ=environ)
    return load_files(files, home=home_dir, environ=environ).config
