"""``agent.stop`` racing hibernation: every stop succeeds and leaves the id free."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

from daemon_harness import serving
from weald.runtime.daemon.client import RPCCallError

THREADS = 4
ROUNDS = 60


def test_stops_racing_hibernation_all_succeed_and_free_their_ids(tmp_path: Path) -> None:
    with serving(tmp_path, extra_config="[limits]\nhibernate_after = 0.05\n") as daemon:
        model = daemon.script("hi", [{"text": "hi"}])
        failures: list[str] = []
        stops: list[Any] = []

        def worker(index: int) -> None:
            rng = random.Random(index)
            agent_id = f"c{index}"
            with daemon.client() as client:
                for round_ in range(ROUNDS):
                    try:
                        params = {"working_dir": str(daemon.project), "agent_id": agent_id, "model": model}
                        client.call("agent.start", params, timeout=60)
                        client.call("agent.prompt", {"agent_id": agent_id, "text": "hello"}, timeout=60)
                        # Around the moment the idle session goes to sleep (0.05 s), or wakes.
                        threading.Event().wait(rng.uniform(0.0, 0.1))
                        stops.append(client.call("agent.stop", {"agent_id": agent_id}, timeout=60))
                    except RPCCallError as exc:
                        failures.append(f"{agent_id} round {round_}: {exc.code} {exc.message}")
                        return

        threads = [threading.Thread(target=worker, args=(index,)) for index in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert failures == []
        assert len(stops) == THREADS * ROUNDS
        assert all(stop == {"stopped": True} for stop in stops)
        with daemon.client() as client:
            listed = {row["agent_id"]: row["state"] for row in client.call("agent.list", timeout=60)}
        assert listed == {f"c{index}": "stopped" for index in range(THREADS)}
