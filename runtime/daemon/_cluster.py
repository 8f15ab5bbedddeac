"""What nodes and fronts of a cluster share: the secret, the handshake, TLS, addresses, and the cluster's status.

A cluster is daemons (*nodes*) on one PostgreSQL store, each serving fronts
on TCP (``[cluster] listen``), and fronts (``weald serve --front``) that
clients talk to. Who runs a session is its placement row; who may write it,
the fence every commit checks (``_store_postgres``).

The handshake: before a single request, a node and the front that connects
prove to each other that they hold the cluster's secret, without sending
it. On connect the node sends ``{"weald": "cluster", "version": 1,
"node_id", "epoch", "nonce"}``; the front answers ``{"nonce", "mac"}`` with
``mac = HMAC-SHA256(secret, "client" | node nonce | front nonce)``; the node
answers ``{"ok": true, "mac"}`` with the same over ``"server"`` (or
``{"ok": false, "error"}`` and closes). Each side checks the other's MAC
in constant time; then the connection carries JSON-RPC, one message a line,
as the daemon's Unix socket does. Nonces are fresh per connection, so a
recorded handshake cannot be replayed. With ``tls_cert`` and ``tls_key`` a
node serves TLS, and a front with ``tls_ca`` checks the node's certificate;
the handshake runs inside it either way.

`cluster_status` is ``weald cluster status``: the ``nodes`` and
``placement`` tables read in one transaction, nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import ssl
from pathlib import Path
from typing import Any, Final

import msgspec
import trio
from weald.runtime import WealdError, mask_url, register_secret

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "PROTOCOL_VERSION",
    "ClusterError",
    "HandshakeError",
    "PrefixedStream",
    "advertised_address",
    "check_node_config",
    "client_handshake",
    "cluster_secret",
    "cluster_status",
    "new_secret",
    "read_line",
    "server_handshake",
    "split_host_port",
    "tls_client_context",
    "tls_server_context",
]

PROTOCOL_VERSION: Final = 1
HANDSHAKE_TIMEOUT: Final = 10.0
"""Seconds a connection has to complete the handshake before it is closed."""
_MAX_HANDSHAKE_LINE: Final = 4096


class ClusterError(WealdError):
    """The cluster cannot be set up as configured; the message says what to change."""


class HandshakeError(ClusterError):
    """The other side of a cluster connection does not hold the secret, or does not speak weald's cluster protocol."""


def new_secret() -> str:
    """A fresh random secret for ``[cluster] secret`` (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def cluster_secret(cluster: Any) -> bytes:
    """The cluster's secret from ``[cluster] secret`` or ``secret_file``, registered so it is never printed.

    Raises:
        ClusterError: neither is set, the file cannot be read, or the secret is too short.
    """
    text = cluster.secret
    if text is None and cluster.secret_file is not None:
        path = Path(cluster.secret_file).expanduser()
        try:
            text = path.read_text(encoding="utf-8").splitlines()[0].strip() if path.stat().st_size else ""
        except (OSError, UnicodeDecodeError, IndexError) as exc:
            msg = f"cannot read the cluster's secret from {path} ([cluster] secret_file): {exc}"
            raise ClusterError(msg) from exc
        if len(text) < 16:
            msg = f"the cluster's secret in {path} ([cluster] secret_file) is shorter than 16 characters"
            raise ClusterError(msg)
    if not text:
        msg = (
            "a cluster needs a shared secret: set [cluster] secret (or secret_file) in the configuration "
            "of every node and front; weald cluster secret prints a new one"
        )
        raise ClusterError(msg)
    register_secret(str(text))
    return str(text).encode("utf-8")


def split_host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host, port)."""
    host, _, port = address.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def advertised_address(cluster: Any, bound: tuple[str, int]) -> str:
    """The address fronts are told to connect to: ``advertise``, else the bound one (the host name for 0.0.0.0)."""
    if cluster.advertise:
        return str(cluster.advertise)
    host, port = bound[0], bound[1]
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - compared with, not bound: every address is no address to tell
        host = socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def tls_server_context(cluster: Any) -> ssl.SSLContext | None:
    """A node's TLS context when ``tls_cert`` and ``tls_key`` are set, else None.

    Raises:
        ClusterError: only one of them is set, or they cannot be loaded.
    """
    if cluster.tls_cert is None and cluster.tls_key is None:
        return None
    if cluster.tls_cert is None or cluster.tls_key is None:
        msg = "[cluster] tls_cert and tls_key go together: set both (a node's certificate and its key), or neither"
        raise ClusterError(msg)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cluster.tls_cert), str(cluster.tls_key))
    except (OSError, ssl.SSLError) as exc:
        msg = f"cannot load the node's TLS certificate {cluster.tls_cert} and key ([cluster] tls_cert, tls_key): {exc}"
        raise ClusterError(msg) from exc
    return context


def tls_client_context(cluster: Any) -> ssl.SSLContext | None:
    """A front's TLS context when ``tls_ca`` is set (nodes' certificates checked against it), else None.

    Raises:
        ClusterError: the certificates cannot be loaded.
    """
    if cluster.tls_ca is None:
        return None
    try:
        return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(cluster.tls_ca))
    except (OSError, ssl.SSLError) as exc:
        msg = f"cannot load the certificates {cluster.tls_ca} ([cluster] tls_ca): {exc}"
        raise ClusterError(msg) from exc


def check_node_config(config: Any) -> None:
    """What a node serving fronts needs (``[cluster] listen``): a shared store, the secret, usable TLS files.

    Raises:
        ClusterError: what is missing or wrong.
    """
    if not config.cluster.listen:
        return
    if not config.store.url:
        msg = (
            f"--listen {config.cluster.listen}: a node serves fronts only on a shared store; "
            "give it --store postgresql://... (or [store] url)"
        )
        raise ClusterError(msg)
    cluster_secret(config.cluster)
    tls_server_context(config.cluster)


# -- the handshake --------------------------------------------------------------------------------


def _mac(secret: bytes, role: str, first: str, second: str) -> str:
    message = f"weald-cluster-{PROTOCOL_VERSION} {role} {first} {second}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


async def read_line(stream: trio.abc.ReceiveStream, buffer: bytearray, limit: int = _MAX_HANDSHAKE_LINE) -> bytes:
    """One line from ``stream`` (without its newline); what follows it stays in ``buffer``.

    Raises:
        HandshakeError: the stream ended, or the line is longer than ``limit``.
    """
    while True:
        end = buffer.find(b"\n")
        if end >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            return line
        if len(buffer) > limit:
            msg = "the other side sent a line too long for a handshake: not a weald cluster peer"
            raise HandshakeError(msg)
        data = await stream.receive_some(65536)
        if not data:
            msg = "the connection closed during the handshake"
            raise HandshakeError(msg)
        buffer += data


def _decode(line: bytes) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        msg = "the other side does not speak weald's cluster protocol (its first line is not JSON)"
        raise HandshakeError(msg) from exc
    if not isinstance(value, dict):
        msg = "the other side does not speak weald's cluster protocol"
        raise HandshakeError(msg)
    return value


async def server_handshake(stream: trio.abc.Stream, buffer: bytearray, secret: bytes, node_id: str, epoch: int) -> None:
    """A node's side of the handshake (see the module docstring); the front proved it holds the secret.

    Raises:
        HandshakeError: it did not (the front was told why, and should be closed).
    """
    nonce = secrets.token_hex(16)
    hello = {"weald": "cluster", "version": PROTOCOL_VERSION, "node_id": node_id, "epoch": epoch, "nonce": nonce}
    await stream.send_all(msgspec.json.encode(hello) + b"\n")
    answer = _decode(await read_line(stream, buffer))
    theirs, mac = answer.get("nonce"), answer.get("mac")
    if not isinstance(theirs, str) or not isinstance(mac, str) or not 16 <= len(theirs) <= 128:
        await stream.send_all(b'{"ok": false, "error": "expected {\\"nonce\\", \\"mac\\"}"}\n')
        msg = "the front's answer to the handshake is not {nonce, mac}"
        raise HandshakeError(msg)
    if not hmac.compare_digest(mac, _mac(secret, "client", nonce, theirs)):
        await stream.send_all(b'{"ok": false, "error": "wrong secret: this node holds another [cluster] secret"}\n')
        msg = "a front failed the handshake: it holds another [cluster] secret"
        raise HandshakeError(msg)
    ok = {"ok": True, "mac": _mac(secret, "server", theirs, nonce)}
    await stream.send_all(msgspec.json.encode(ok) + b"\n")


async def client_handshake(stream: trio.abc.Stream, buffer: bytearray, secret: bytes) -> dict[str, Any]:
    """A front's side of the handshake; returns the node's hello (``node_id``, ``epoch``).

    Raises:
        HandshakeError: the node refused the front's proof, failed its own, or is no weald node.
    """
    hello = _decode(await read_line(stream, buffer))
    nonce = hello.get("nonce")
    if hello.get("weald") != "cluster" or not isinstance(nonce, str):
        msg = "the address is not a weald node's cluster port (its first line is no cluster hello)"
        raise HandshakeError(msg)
    if hello.get("version") != PROTOCOL_VERSION:
        msg = f"the node speaks cluster protocol {hello.get('version')!r}; this front speaks {PROTOCOL_VERSION}"
        raise HandshakeError(msg)
    mine = secrets.token_hex(16)
    await stream.send_all(msgspec.json.encode({"nonce": mine, "mac": _mac(secret, "client", nonce, mine)}) + b"\n")
    answer = _decode(await read_line(stream, buffer))
    if answer.get("ok") is not True:
        msg = f"the node refused this front: {answer.get('error') or 'no reason given'}"
        raise HandshakeError(msg)
    mac = answer.get("mac")
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(secret, "server", mine, nonce)):
        msg = "the node failed the handshake: it does not hold this cluster's secret"
        raise HandshakeError(msg)
    return hello


class PrefixedStream(trio.abc.ReceiveStream):
    """A receive stream that gives what the handshake read past its last line first, then the stream's own."""

    def __init__(self, stream: trio.abc.ReceiveStream, prefix: bytearray) -> None:
        self._stream = stream
        self._prefix = bytes(prefix)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            await trio.lowlevel.checkpoint()
            return data
        return bytes(await self._stream.receive_some(max_bytes))

    async def aclose(self) -> None:
        await self._stream.aclose()


# -- status -----------------------------------------------------------------------------------------

ORPHANS_LISTED: Final = 100
"""The orphaned sessions `cluster_status` names; it counts them all."""


def cluster_status(backend: Any) -> dict[str, Any]:
    """``weald cluster status``: the nodes and placement tables, read in one transaction (a blocking call).

    Everything comes from the database at one moment (``as_of``, its clock):
    each node's row (id, epoch, lease, when it started, what it last said of
    itself at a renewal: address, labels, awake and asleep sessions, CPU, last
    commit), the sessions placed on it, and the orphaned sessions (no owner,
    or an owner whose lease has run out).

    Raises:
        StoreError: the database could not be read.
    """
    snapshot = backend.cluster_snapshot(ORPHANS_LISTED)
    as_of: float = snapshot["as_of"]
    nodes = []
    for row in snapshot["nodes"]:
        info = row["info"] if isinstance(row["info"], dict) else {}
        lease_until = row["lease_until"]
        nodes.append(
            {
                "node_id": row["node_id"],
                "epoch": row["epoch"],
                "live": lease_until > as_of,
                "lease_until": lease_until,
                "lease_left": round(max(0.0, lease_until - as_of), 3),
                "started": row["started"],
                "address": info.get("address"),
                "labels": info.get("labels") or {},
                "draining": bool(info.get("draining")),
                "host": info.get("host"),
                "pid": info.get("pid"),
                "sessions": row["placed"],
                "awake": info.get("awake"),
                "asleep": info.get("asleep"),
                "cpu": info.get("cpu"),
                "last_commit": info.get("last_commit"),
            }
        )
    return {
        "as_of": as_of,
        "store": mask_url(backend.url) if getattr(backend, "url", None) else backend.location,
        "nodes": nodes,
        "sessions": snapshot["placed"],
        "orphaned": {"count": snapshot["orphaned"], "sessions": snapshot["orphans"]},
    }
