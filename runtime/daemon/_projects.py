"""Each project's configuration, as the daemon's sessions use it: read when it changes, never per turn.

A session runs under its own project's configuration::

    built-in defaults < the user file < the project's weald.toml < agent.start's parameters

`Projects` keeps, for every directory sessions were started from (a working
directory, or the ``project`` that ``agent.start`` named), which files
configure it (`find_project_files`: the user file, then the nearest
``weald.toml`` / ``.weald/`` at or above the directory) and the
configuration they make (`ProjectConfig`). Sessions whose directories are
configured by the same files share one `ProjectConfig`.

Nothing is read on the loop thread. `Projects.acquire` reads a directory's
files in a worker thread when a session starts; afterwards a session finds
its project's configuration with two dictionary lookups (`Projects.current`).
`Projects.refresh` looks again (a worker thread): the files found upward
(a ``weald.toml`` created nearer counts), each file's identity (device,
inode, size, modification and change times) and, when forced (``weald
reload``), each file's digest; only what changed is read and parsed again. A
file whose new text has errors is refused as a whole: its sessions keep the
configuration they had, and the problems are kept (`ProjectConfig.refused`)
for ``weald reload`` and ``debug_state`` to show. A changed configuration
gets a new ``generation``; each session's agent compares it at the start of
its next turn and takes the new one then.

Threads: every method not ending in ``_blocking`` runs on the loop thread,
which alone changes the tables; the ``_blocking`` ones run in worker threads
on copies handed to them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

import attrs
import trio
from weald.runtime import ActorSystem, Future
from weald.runtime.daemon._config_load import (
    LoadedConfig,
    ProjectFiles,
    Source,
    config_from_sources,
    find_project_files,
    load_files,
    project_files_with,
    project_root_blocking,
    user_file,
)
from weald.runtime.daemon._config_model import Config, ConfigError, ConfigFile
from weald.runtime.daemon._trust import TrustBook, UntrustedConfigError

__all__ = ["ProjectChange", "ProjectConfig", "Projects"]

_generations = itertools.count(1)  # never reused in a process: an agent compares them across projects

#: A file's identity as `os.stat` sees it: (device, inode, size, mtime_ns, ctime_ns); None: missing.
_Identity = tuple[int, int, int, int, int] | None


@attrs.frozen(eq=False)
class ProjectConfig:
    """The configuration of the sessions whose directories the same files configure.

    Attributes:
        key: The files' paths, lowest precedence first (names it).
        root: The project directory (holding ``weald.toml`` or ``.weald/``); None: none was found.
        files: The files read, with their digests, lowest precedence first.
        config: The configuration they make (the daemon-wide sections are the daemon's own business).
        generation: Changes whenever ``config`` does.
        refused: The problems of the files' newest text, which could not be
            used (the configuration above stays); empty when the files are fine.
        ignored: Project markers passed over (not yours, or writable by anyone).
    """

    key: tuple[str, ...]
    root: str | None
    files: tuple[ConfigFile, ...]
    config: Config
    generation: int
    refused: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        """As plain data, for ``agent.list``, ``debug_state`` and ``config.reload``."""
        return {
            "project": self.root,
            "files": [attrs.asdict(file) for file in self.files],
            "generation": self.generation,
            "refused": list(self.refused),
            "ignored": list(self.ignored),
        }


@attrs.frozen
class ProjectChange:
    """What a refresh did to one project's configuration.

    Attributes:
        project: The project directory (or, with none, the directory looked from).
        status: ``changed`` (the new configuration applies from its sessions'
            next turns), ``refused`` (the new text has errors; the old one
            stays) or ``unchanged``.
        files: The files now in use.
        problems: For ``refused``, every problem, each naming its file and key.
        directories: The session directories it configures.
        generation: The generation of the configuration in use.
        news: Whether this refresh found it so (a new generation, or new
            problems): what a watcher reports, once.
    """

    project: str
    status: Literal["changed", "refused", "unchanged"]
    files: tuple[ConfigFile, ...]
    problems: tuple[str, ...] = ()
    directories: tuple[str, ...] = ()
    generation: int = 0
    news: bool = False

    def describe(self) -> dict[str, Any]:
        """As plain data, for ``config.reload`` and the ``config.*`` events."""
        return {
            "project": self.project,
            "status": self.status,
            "files": [attrs.asdict(file) for file in self.files],
            "problems": list(self.problems),
            "directories": list(self.directories),
            "generation": self.generation,
        }


@attrs.frozen
class _Look:
    """What a worker thread found for one directory (`Projects.look_blocking`)."""

    directory: str
    files: ProjectFiles
    identity: tuple[_Identity, ...]  # the files', then their [mcp] import files'
    loaded: LoadedConfig | None = None  # None: not read (unchanged), or refused
    error: ConfigError | None = None  # why it was refused
    unchanged: ProjectConfig | None = None  # not read: this one is still right
    distrust: UntrustedConfigError | None = None  # a nested project file not trusted: no session starts with it

    @property
    def problems(self) -> tuple[str, ...]:
        return () if self.error is None else tuple(str(problem) for problem in self.error.problems)


class _Directory:
    """A directory sessions were started from: which files configure it, and how many sessions use it."""

    __slots__ = ("files", "identity", "key", "seen", "users")

    def __init__(self, files: ProjectFiles, key: tuple[str, ...], identity: tuple[_Identity, ...]) -> None:
        self.users = 0
        self.set(files, key, identity)

    def set(self, files: ProjectFiles, key: tuple[str, ...], identity: tuple[_Identity, ...]) -> None:
        self.files = files
        self.key = key
        self.identity = identity
        # What the watcher compares each second, as strings made once here.
        root = None if files.root is None else str(files.root)
        user = None if files.user is None else str(files.user)
        self.seen = _Seen(files, identity, root, user, files.project is not None)


class _Seen(NamedTuple):
    """A directory as last looked at, for the watcher's cheap comparison."""

    files: ProjectFiles
    identity: tuple[_Identity, ...]
    root: str | None
    user: str | None
    has_project: bool


def _key(files: ProjectFiles) -> tuple[str, ...]:
    return tuple(str(path) for path in files.paths)


def _identity(path: Path) -> _Identity:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class Projects:
    """The configurations of the daemon's projects (see the module docstring).

    Args:
        base: The lowest file layer as data, used instead of reading the
            user file (a daemon built from a `Config` rather than from files:
            that config is every session's base). None: the user file is read.
        home: The user's home directory.
        environ: The environment the files are found with (``WEALD_CONFIG``, ``WEALD_HOME``).
        on_loaded: Called (in a worker thread) with each configuration read,
            before it is used: registers its secrets.
        trust: The trust records of nested project files and the sessions'
            directories (`weald.runtime.daemon._trust`); None: a new, empty one.
    """

    def __init__(
        self,
        *,
        base: Source | None = None,
        home: Path | None = None,
        environ: Mapping[str, str] | None = None,
        on_loaded: Callable[[Config], None] | None = None,
        trust: TrustBook | None = None,
    ) -> None:
        self.trust = TrustBook() if trust is None else trust
        self._base = base
        self._home = Path.home() if home is None else home
        self._environ = dict(os.environ if environ is None else environ)
        self._on_loaded = on_loaded
        self._directories: dict[str, _Directory] = {}
        self._configs: dict[tuple[str, ...], ProjectConfig] = {}
        self._looking: dict[str, Future[_Look]] = {}
        # The generation of each configuration as the last `refresh(force=True)` (a reload) reported it.
        self._reported: dict[tuple[str, ...], int] = {}

    @property
    def home(self) -> Path:
        """The user's home directory, where the project search stops."""
        return self._home

    def user_file_blocking(self) -> str | None:
        """The user file's path, when it exists (one stat)."""
        found = user_file(home=self._home, environ=self._environ)
        return None if found.path is None else str(found.path)

    # -- on the loop thread ------------------------------------------------------------------------

    def current(self, directory: str) -> ProjectConfig:
        """The configuration of a directory sessions were started from (`acquire`d): no I/O.

        Raises:
            KeyError: the directory was never acquired (or was released by all).
        """
        return self._configs[self._directories[directory].key]

    def known(self, directory: str) -> bool:
        """Whether sessions of ``directory`` have a configuration here."""
        return directory in self._directories

    async def acquire(self, directory: str, *, use: bool = True) -> ProjectConfig:
        """The configuration of ``directory``, read (in a worker thread) unless known and unchanged.

        With ``use``, one more session uses it (`release_nowait` when it
        stops); the directory then stays known, and its configuration is
        found without I/O by `current`.

        Raises:
            UntrustedConfigError: its project file is nested and not trusted
                (or changed since it was): nothing is installed.
            ConfigError: its files have errors and no earlier version of them is in use.
        """
        look = await self._look(directory)
        if look.distrust is not None:
            raise look.distrust
        config = self._install(look)
        if use:
            self._directories[directory].users += 1
        return config

    def hold_nowait(self, directory: str) -> None:
        """One more session uses ``directory``, acquired already (with ``use=False``)."""
        self._directories[directory].users += 1

    def release_nowait(self, directory: str) -> None:
        """One session of ``directory`` stopped; once none uses it, it is forgotten."""
        known = self._directories.get(directory)
        if known is None:
            return
        known.users -= 1
        if known.users <= 0:
            self._forget(directory)

    def _forget(self, directory: str) -> None:
        known = self._directories.pop(directory)
        if not any(other.key == known.key for other in self._directories.values()):
            self._configs.pop(known.key, None)

    async def refresh(self, *, force: bool = False, report: bool = True) -> list[ProjectChange]:
        """Look at every known directory's files again; apply what changed (see the module docstring).

        Args:
            force: read every file again and compare digests (``weald
                reload``), not only the files whose identity changed.
            report: describe every configuration in use; false (the
                watcher, each second): only those with news.

        Returns:
            One change per project configuration (with news, unless ``report``), in no set order.
        """
        known = {directory: entry.seen for directory, entry in self._directories.items()}
        if not known:
            return []
        configs = dict(self._configs)
        looks = await trio.to_thread.run_sync(self._look_all_blocking, known, configs, force)
        changes: dict[tuple[str, ...], ProjectChange] = {}
        for directory in [d for d, entry in self._directories.items() if entry.users <= 0]:
            self._forget(directory)  # acquired for sessions that did not start (a failed restore)
        for look in looks:
            entry = self._directories.get(look.directory)
            if entry is None:
                continue  # released meanwhile
            if look.unchanged is not None and not report and entry.key == look.unchanged.key:
                continue  # the common case, each second: nothing to do
            before = self.current(look.directory)
            try:
                after = self._install(look)
            except ConfigError:  # now configured by other files, which have errors: keep what it had
                after = self._configs[before.key] = attrs.evolve(before, refused=look.problems)
            # A reload reports what changed since the last reload (the watcher may have applied it already).
            since = self._reported.get(after.key, before.generation) if force else before.generation
            status: Literal["changed", "refused", "unchanged"] = (
                "refused" if after.refused else "changed" if after.generation != since else "unchanged"
            )
            news = after.generation != before.generation or (bool(after.refused) and after.refused != before.refused)
            if not (report or news):
                continue
            previous = changes.get(after.key)
            directories = (*(previous.directories if previous else ()), look.directory)
            if previous is not None and previous.status != "unchanged":
                status, news = previous.status, previous.news or news
            project = after.root or look.directory
            changes[after.key] = ProjectChange(
                project, status, after.files, after.refused, directories, after.generation, news
            )
        if force:
            for key in changes:
                self._reported[key] = self._configs[key].generation
        for key in [key for key in self._reported if key not in self._configs]:
            del self._reported[key]
        return list(changes.values())

    def _install(self, look: _Look) -> ProjectConfig:
        """Make what a worker thread found the directory's configuration (on the loop).

        Raises:
            ConfigError: the files have errors and no earlier version of them is in use.
        """
        key = _key(look.files)
        existing = self._configs.get(key)
        if look.loaded is not None:
            # The files' digests are weald.toml's: an `[mcp] import` file's change shows in the configuration.
            if existing is None or existing.files != look.loaded.files or existing.config != look.loaded.config:
                existing = ProjectConfig(
                    key=key,
                    root=None if look.files.root is None else str(look.files.root),
                    files=look.loaded.files,
                    config=look.loaded.config,
                    generation=next(_generations),
                    ignored=look.files.ignored,
                )
                self._reported.setdefault(key, existing.generation)
            elif existing.refused:
                existing = attrs.evolve(existing, refused=())
        elif look.error is not None:
            if existing is None:
                raise look.error
            existing = attrs.evolve(existing, refused=look.problems)
        elif existing is None:  # unchanged, and forgotten meanwhile (its last session stopped)
            assert look.unchanged is not None
            existing = look.unchanged
        self._configs[key] = existing
        known = self._directories.get(look.directory)
        if known is None:
            self._directories[look.directory] = _Directory(look.files, key, look.identity)
        elif look.unchanged is None or known.key != key:
            known.set(look.files, key, look.identity)
        return existing

    async def _look(self, directory: str) -> _Look:
        """`look_blocking` in a worker thread, once for concurrent requests of one directory."""
        pending = self._looking.get(directory)
        if pending is None:
            pending = self._looking[directory] = Future()
            known = self._directories.get(directory)
            previous = None if known is None else known.seen
            configs = dict(self._configs)

            async def look() -> None:
                try:
                    pending.set(await trio.to_thread.run_sync(self.look_blocking, directory, previous, configs, False))
                except BaseException:
                    pending.set_exception()
                finally:
                    self._looking.pop(directory, None)

            ActorSystem.current().loop.spawn_nowait(look)
        found: _Look = await pending
        return found

    # -- in worker threads -------------------------------------------------------------------------

    def look_blocking(
        self,
        directory: str,
        previous: _Seen | None,
        configs: Mapping[tuple[str, ...], ProjectConfig],
        force: bool,
        files: ProjectFiles | None = None,
    ) -> _Look:
        """Find ``directory``'s files and read them if they changed since ``previous`` (or with ``force``)."""
        if files is None:
            files = find_project_files(Path(directory), home=self._home, environ=self._environ)
        key = _key(files)
        identity = tuple(_identity(path) for path in files.paths)
        known = configs.get(key)
        # A refused configuration's digests are of the text in use, not of the files now: those are read again.
        if known is not None and not force and not known.refused and previous is not None and previous.files == files:
            imports = tuple(_identity(path) for path in known.config.mcp.imports)
            if previous.identity == (*identity, *imports):
                distrust = self._distrust_blocking(files, known.files)
                return _Look(directory, files, previous.identity, unchanged=known, distrust=distrust)
        try:
            loaded = self._load_blocking(files)
        except ConfigError as exc:
            distrust = self._distrust_blocking(files, ())
            return _Look(directory, files, identity, error=distrust or exc, distrust=distrust)
        distrust = self._distrust_blocking(files, loaded.files)
        if distrust is not None:  # refused as a whole, as a file with errors is
            return _Look(directory, files, identity, error=distrust, distrust=distrust)
        imports = tuple(_identity(path) for path in loaded.config.mcp.imports)
        # Same digests as the configuration in use: `_install` keeps it, and its generation.
        return _Look(directory, files, (*identity, *imports), loaded=loaded)

    def _look_all_blocking(
        self,
        known: Mapping[str, _Seen],
        configs: Mapping[tuple[str, ...], ProjectConfig],
        force: bool,
    ) -> list[_Look]:
        """`look_blocking` for every directory: the user file looked up once, files shared by directories read once.

        The watcher's pass runs this each second over every directory, so
        the common case (nothing changed) is made of strings and stats only:
        the project found upward and the files' identities compared with
        what was seen before, no `ProjectFiles` made.
        """
        user = user_file(home=self._home, environ=self._environ)
        user_part = () if user.path is None else (user.stat,)
        user_path = None if user.path is None else str(user.path)
        home = str(self._home)
        looks: list[_Look] = []
        read: dict[tuple[tuple[str, ...], tuple[_Identity, ...]], _Look] = {}
        for directory, previous in known.items():
            if not force:
                root, ignored, info = project_root_blocking(directory, home)
                on = root is not None and info is not None and (info.st_dev, info.st_ino) != user.identity
                project_part: tuple[_Identity, ...] = ()
                if on:
                    assert info is not None
                    project_part = ((info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns),)
                files = previous.files
                same = (
                    previous.user == user_path
                    and previous.root == root
                    and previous.has_project == on
                    and files.ignored == ignored
                )
                known_config = configs.get(_key(files)) if same else None
                if known_config is not None:
                    identity = (*user_part, *project_part)
                    imports = known_config.config.mcp.imports
                    if imports:
                        identity = (*identity, *(_identity(path) for path in imports))
                    if previous.identity == identity:
                        looks.append(_Look(directory, files, previous.identity, unchanged=known_config))
                        continue
            files = project_files_with(Path(directory), self._home, user)
            identity = tuple(_identity(path) for path in files.paths)
            shared = read.get((_key(files), identity))
            if shared is not None and shared.unchanged is None and shared.files.root == files.root:
                # the same files, read already for another directory of the same project
                looks.append(attrs.evolve(shared, directory=directory, files=files))
                continue
            look = self.look_blocking(directory, previous, configs, force, files)
            read[(_key(files), identity)] = look
            looks.append(look)
        return looks

    def _distrust_blocking(self, files: ProjectFiles, read: tuple[ConfigFile, ...]) -> UntrustedConfigError | None:
        """Why the project file of ``files`` may not be applied (nested and not trusted); None: it may."""
        if files.root is None:
            return None
        digest = next((file.digest for file in read if file.layer == "project"), None)
        return self.trust.check_blocking(files, digest, str(self._home))

    def _load_blocking(self, files: ProjectFiles) -> LoadedConfig:
        if self._base is None:
            loaded = load_files(files, home=self._home, environ=self._environ)
        else:
            project = attrs.evolve(files, user=None, explicit=False)
            on_disk = load_files(project, home=self._home, environ=self._environ)
            config = config_from_sources([self._base, *on_disk.sources], home=self._home, environ=self._environ)
            loaded = attrs.evolve(on_disk, config=config, sources=(self._base, *on_disk.sources))
        if self._on_loaded is not None:
            self._on_loaded(loaded.config)
        return loaded
