"""A throwaway PostgreSQL cluster for tests and benchmarks: Debian's ``postgresql``, as a non-root user, in a temp dir.

`ensure_postgres` installs Debian's ``postgresql`` with apt-get when its
binaries are missing (as the sandbox tests install bubblewrap); `PgCluster`
runs ``initdb`` and ``pg_ctl`` as ``nobody`` (PostgreSQL refuses to run as
root) into a directory of its own, listening on a free loopback port and on
a Unix socket in that directory. Logins over TCP need the password; over
the socket they are trusted. Nothing is left behind: `remove` stops the
server and removes the directory, and a reaper process started with the
cluster does the same if the process that made it dies first (a test run
killed by a timeout, say).

A missing piece raises `PgUnavailable` naming it; the pytest fixtures turn
that into a failure, never a skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_APT_TIMEOUT = 900.0
_USER = "nobody"


# Run by the reaper: waits for the test process (argv[1]) to go, then stops the server and removes its directory.
_REAPER = """
import os, shutil, subprocess, sys, time
parent, pg_ctl, where = int(sys.argv[1]), sys.argv[2], sys.argv[3]
while True:
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
    time.sleep(0.5)
subprocess.run(["runuser", "-u", "nobody", "--", pg_ctl, "-D", where + "/data", "-m", "immediate", "-w", "stop"],
               capture_output=True, timeout=60, check=False)
for line in open("/proc/mounts").read().splitlines():  # a tablespace's tmpfs (small_tablespace)
    if line.split()[1].startswith(where + "/"):
        subprocess.run(["umount", "--lazy", line.split()[1]], capture_output=True, check=False)
shutil.rmtree(where, ignore_errors=True)
"""


class PgUnavailable(RuntimeError):
    """PostgreSQL cannot be installed or started here; the message names what is missing."""


def pg_bin() -> Path | None:
    """The directory of Debian's PostgreSQL server binaries (the newest version), or None."""
    root = Path("/usr/lib/postgresql")
    found = sorted((p for p in root.glob("*/bin") if (p / "initdb").exists()), key=lambda p: int(p.parent.name))
    return found[-1] if found else None


def ensure_postgres() -> Path:
    """The server binaries' directory, installing Debian's ``postgresql`` with apt-get if missing."""
    found = pg_bin()
    if found is not None:
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        msg = (
            "the PostgreSQL tests need Debian's postgresql package (initdb, pg_ctl), which is not installed, "
            "and this run cannot install it (apt-get needs root on a Debian-like system): apt-get install postgresql"
        )
        raise PgUnavailable(msg)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open("/tmp/weald-test-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel workers install once
        if pg_bin() is None:
            for args in ([apt, "update", "-q"], [apt, "install", "-y", "-q", "--no-install-recommends", "postgresql"]):
                done = subprocess.run(args, capture_output=True, text=True, timeout=_APT_TIMEOUT, env=env, check=False)
                if done.returncode != 0 and args[1] != "update":
                    msg = f"apt-get install postgresql failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
                    raise PgUnavailable(msg)
    found = pg_bin()
    if found is None:
        msg = "apt-get installed postgresql, but no initdb is under /usr/lib/postgresql/*/bin"
        raise PgUnavailable(msg)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """One throwaway cluster (see the module docstring).

    Attributes:
        dir: its directory (data, socket, log).
        port: its TCP port on 127.0.0.1.
        password: the superuser's (``weald``) password, for TCP logins.
    """

    def __init__(self, *, fsync: bool = True) -> None:
        self.bin = ensure_postgres()
        try:
            user = pwd.getpwnam(_USER)
        except KeyError as exc:
            msg = f"the PostgreSQL tests run the server as user {_USER!r}, which does not exist here"
            raise PgUnavailable(msg) from exc
        self._uid, self._gid = user.pw_uid, user.pw_gid
        self.dir = Path(tempfile.mkdtemp(prefix="weald-pg-"))
        os.chmod(self.dir, 0o755)
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = free_port()
        self.password = "pw-" + secrets.token_hex(8)
        self.fsync = fsync
        self._running = False
        self._reaper: subprocess.Popen[bytes] | None = None
        self._mounts: list[Path] = []
        os.chown(self.dir, self._uid, self._gid)

    # -- as the server's user ---------------------------------------------------------------

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args),
            user=self._uid,
            group=self._gid,
            extra_groups=[],
            cwd=self.dir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": str(self.dir)},
        )

    def init(self) -> PgCluster:
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        os.chown(pwfile, self._uid, self._gid)
        done = self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "weald",
            "--pwfile",
            str(pwfile),
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        )
        pwfile.unlink()
        if done.returncode != 0:
            msg = f"initdb failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
            raise PgUnavailable(msg)
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = '{self.dir}'\n"
                f"fsync = {'on' if self.fsync else 'off'}\nmax_connections = 200\nshared_buffers = 32MB\n"
                "log_min_messages = warning\n"
            )
        return self

    def start(self) -> PgCluster:
        done = self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            msg = f"pg_ctl start failed (exit {done.returncode}): {done.stderr.strip()}\n{log[-2000:]}"
            raise PgUnavailable(msg)
        self._running = True
        if self._reaper is None:
            self._reaper = subprocess.Popen(
                [sys.executable, "-c", _REAPER, str(os.getpid()), str(self.bin / "pg_ctl"), str(self.dir)],
                start_new_session=True,  # a signal to the test run's process group does not stop it
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        return self

    def stop(self, mode: str = "fast") -> None:
        if self._running:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
            self._running = False

    def restart(self) -> None:
        """Stop the server (fast: connections are cut) and start it again, same port and data."""
        self.stop("fast")
        self.start()

    def remove(self) -> None:
        self.stop("immediate")
        for where in self._mounts:
            subprocess.run(["umount", "--lazy", str(where)], capture_output=True, check=False)
        self._mounts.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.kill()
            reaper.wait(10)

    def standby(self) -> PgCluster:
        """A streaming-replication standby of this (running) cluster, started: it serves reads and refuses writes.

        Made as a real one is: ``pg_basebackup -R`` over the Unix socket
        (replication logins there are trusted), then its own port and socket.
        Remove it with `remove` before this one.
        """
        other = PgCluster(fsync=self.fsync)
        other.password = self.password  # the primary's roles, copied with its data
        done = other._run(
            str(self.bin / "pg_basebackup"),
            "-h",
            str(self.dir),
            "-p",
            str(self.port),
            "-U",
            "weald",
            "-D",
            str(other.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        )
        if done.returncode != 0:
            msg = f"pg_basebackup failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
            raise PgUnavailable(msg)
        with (other.data / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {other.port}\nunix_socket_directories = '{other.dir}'\n")
        return other.start()

    def small_tablespace(self, size: str) -> str:
        """A tablespace on a real tmpfs of ``size`` (mounted in this cluster's directory); returns its name.

        The test fills it to make the server's disk full. Mounting needs
        root; unmounted by `remove`.
        """
        name = "small_" + secrets.token_hex(4)
        where = self.dir / name
        where.mkdir()
        done = subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={size},mode=0700,uid={self._uid},gid={self._gid}",
                "tmpfs",
                str(where),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            msg = f"a tablespace on a tmpfs needs root (mount failed: {done.stderr.strip()})"
            raise PgUnavailable(msg)
        self._mounts.append(where)
        self.psql(f"CREATE TABLESPACE {name} LOCATION '{where}'")
        return name

    # -- databases ----------------------------------------------------------------------------------

    def psql(self, sql: str, database: str = "postgres") -> str:
        done = subprocess.run(
            ["psql", "-h", str(self.dir), "-p", str(self.port), "-U", "weald", "-d", database, "-XAtq", "-c", sql],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            msg = f"psql failed: {done.stderr.strip()}"
            raise RuntimeError(msg)
        return done.stdout

    def create_database(self, name: str | None = None, *, tablespace: str | None = None) -> str:
        """A fresh empty database (its tables in ``tablespace`` if given); returns its name."""
        name = name or "t_" + secrets.token_hex(6)
        self.psql(f'CREATE DATABASE "{name}"' + (f" TABLESPACE {tablespace}" if tablespace else ""))
        return name

    def url(self, database: str, *, tcp: bool = True, password: str | None = None) -> str:
        """A ``postgresql://`` URL to ``database``: over TCP with the password, or over the Unix socket."""
        if tcp:
            return f"postgresql://weald:{password or self.password}@127.0.0.1:{self.port}/{database}"
        return f"postgresql://weald@/{database}?host={self.dir}&port={self.port}"


@contextlib.contextmanager
def running_cluster(*, fsync: bool = True):  # type: ignore[no-untyped-def]
    """A started cluster, removed afterwards."""
    cluster = PgCluster(fsync=fsync)
    try:
        cluster.init().start()
        yield cluster
    finally:
        cluster.remove()


def wait_ready(cluster: PgCluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(RuntimeError):
            cluster.psql("SELECT 1")
            return
        time.sleep(0.1)
    msg = "the PostgreSQL server did not answer"
    raise PgUnavailable(msg)


class CutProxy:
    """A TCP proxy on loopback in front of the server, whose link can be cut and restored: a network partition.

    `cut` closes every connection through it and refuses new ones (they are
    accepted and closed at once); `restore` lets them through again.
    """

    def __init__(self, port: int) -> None:
        import threading

        self._target = port
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="pg-cut-proxy", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import threading

        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._cut:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self._target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._cut = True
        with self._lock:
            conns, self._open = self._open, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def restore(self) -> None:
        self._cut = False

    def close(self) -> None:
        self._stop.set()
        self.cut()
        self._listener.close()
        self._thread.join(5)
