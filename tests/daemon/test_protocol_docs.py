"""The JSON-RPC examples in docs/protocol.md and docs/faults.md, checked against the real server.

Every method the server dispatches has a request example; every request
example decodes with the server's own param structs (so a wrong example
fails here, not in a reader's client); and a live daemon accepts each one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from daemon_harness import DaemonProcess
from weald.runtime.daemon import server as server_module
from weald.runtime.daemon.client import RPCCallError

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "docs" / "protocol.md", ROOT / "docs" / "faults.md"]
SERVER_SOURCE = (ROOT / "runtime" / "daemon" / "server.py").read_text()
# The requests to editors (client.request) are sent by the daemon's editor bridges.
EDITORS_SOURCE = (ROOT / "runtime" / "daemon" / "_editors.py").read_text()

#: The replies that say the request itself was wrong, not what it asked for.
MALFORMED = {server_module.PARSE_ERROR, server_module.INVALID_REQUEST, server_module.METHOD_NOT_FOUND}


def dispatch_table() -> dict[str, type[msgspec.Struct]]:
    """Each method the server dispatches -> the msgspec struct its params are decoded into."""
    entries = re.findall(r'^\s+"([a-z_.]+)": \((\w+Params), self\._\w+\),$', SERVER_SOURCE, re.MULTILINE)
    table = {method: getattr(server_module, params) for method, params in entries}
    assert len(table) >= 20, "the server's method table was not found"
    return table


def json_blocks(doc: Path) -> Iterator[Any]:
    """Every ```json block of a doc, decoded; a block that is not JSON fails the test."""
    for block in re.findall(r"```json\n(.*?)```", doc.read_text(), re.DOTALL):
        try:
            yield msgspec.json.decode(block)
        except msgspec.DecodeError as exc:
            pytest.fail(f"a json block in {doc.name} is not JSON ({exc}):\n{block}")


def messages(doc: Path) -> Iterator[dict[str, Any]]:
    """The JSON-RPC messages among a doc's json blocks (a block may hold a batch of them)."""
    for value in json_blocks(doc):
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and item.get("jsonrpc") == "2.0":
                yield item


def requests(doc: Path) -> list[dict[str, Any]]:
    return [m for m in messages(doc) if "method" in m and "id" in m]


def test_every_method_the_server_dispatches_has_a_request_example_in_the_protocol_doc() -> None:
    documented = {request["method"] for request in requests(DOCS[0])}
    missing = sorted(set(dispatch_table()) - documented)
    assert missing == [], f'no {{"method": ...}} request example in docs/protocol.md for {missing}'


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_request_example_decodes_with_the_servers_own_params(doc: Path) -> None:
    table = dispatch_table()
    examples = requests(doc)
    assert examples
    for request in examples:
        method = request["method"]
        assert method in table, f"{doc.name} documents {method!r}, which the server does not have"
        try:
            msgspec.convert(request.get("params", {}), type=table[method])
        except msgspec.ValidationError as exc:
            pytest.fail(f"{doc.name}: the {method} example's params are wrong: {exc}")


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_notification_and_error_code_in_the_docs_is_one_the_server_sends(doc: Path) -> None:
    sent = set(re.findall(r'notify\("([a-z_.]+)"', SERVER_SOURCE))
    sent |= set(re.findall(r'"method": "([a-z_.]+)", "params"', EDITORS_SOURCE))
    assert {"event", "permission.request", "ask_user.question", "client.request"} <= sent
    for message in messages(doc):
        if "method" in message and "id" not in message:
            assert message["method"] in sent, f"{doc.name}: the server sends no {message['method']!r} notification"
        if "error" in message:
            assert message["error"]["code"] in server_module.ERRORS, f"{doc.name}: {message['error']}"


def test_a_live_daemon_accepts_every_request_example_in_the_docs(tmp_path: Path) -> None:
    examples = [request for doc in DOCS for request in requests(doc)]
    # daemon.stop goes last: it ends the daemon.
    examples.sort(key=lambda request: request["method"] == "daemon.stop")
    assert examples[-1]["method"] == "daemon.stop"
    daemon = DaemonProcess(tmp_path, extra_config="[faults]\nenabled = true\n")
    daemon.start()
    try:
        refused: list[str] = []
        with daemon.client() as client:
            for request in examples:
                method, params = request["method"], request.get("params", {})
                try:
                    client.call(method, params, timeout=30)
                except RPCCallError as exc:
                    # Not found (the docs' agent "demo" does not exist here) or failed is fine;
                    # a request the server cannot take as written is not.
                    if exc.code in MALFORMED | {server_module.INVALID_PARAMS}:
                        refused.append(f"{method} {params}: {exc.code} {exc.message}")
        assert refused == []
        assert daemon.proc is not None
        assert daemon.proc.wait(60) == 0, daemon.log.read_text()
        daemon.proc = None
    finally:
        daemon.close()
