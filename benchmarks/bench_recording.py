"""What recording and replaying a session costs per model call, beside the scripted model alone.

A session of ``STEPS`` model calls, each answered with one tool call whose
result (``OUTPUT_BYTES`` of text) joins the history, as an agent's does: every
request carries the whole history so far. Three contenders run the same
session, each timed per model call (the stream from request to ``Completed``):

- ``scripted``: the scripted provider alone (no digests, no file);
- ``recording``: a `Recorder` around it: the request's digests (new messages
  only), then the whole recording rewritten atomically (temporary file,
  fsync, rename) in a worker thread before the answer is passed on;
- ``replay``: ``scripted:FILE`` of that recording, checking each request's
  digests against the recorded ones.

Printed: the median per call and the last call's time (the recording grows,
so its write grows), and the ratios to ``scripted``; the recording's size.

Run: ``python benchmarks/bench_recording.py [--quick]``
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path

import trio
from weald.runtime.llm import Completed, Message, ModelRequest, Provider, Recorder, ScriptedProvider, ToolSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import Row, banner, median, quick_main, summary

OUTPUT_BYTES = 4096
TOOLS = [ToolSpec(f"tool_{i}", f"Tool number {i}.", {"type": "object", "properties": {}}) for i in range(15)]


def script(steps: int) -> dict[str, object]:
    calls = [{"text": "Next.", "tool_calls": [{"name": "tool_1", "arguments": {"n": i}}]} for i in range(steps - 1)]
    return {"turns": [*calls, {"text": "Done."}]}


async def session(provider: Provider, steps: int) -> list[float]:
    """Run the session; returns each model call's time in milliseconds."""
    history = [Message(role="user", content="go")]
    times = []
    for step in range(steps):
        request = ModelRequest(model="", system="You are a benchmark.", messages=list(history), tools=TOOLS)
        started = time.perf_counter()
        async with contextlib.aclosing(provider.stream(request)) as events:
            async for event in events:
                if isinstance(event, Completed):
                    done = event
        times.append((time.perf_counter() - started) * 1000)
        history.append(done.message)
        for call in done.message.tool_calls:
            output = f"step {step}: " + "x" * OUTPUT_BYTES
            history.append(Message(role="tool", content=output, tool_call_id=call.id, name=call.name))
    return times


def run(quick: bool = False) -> list[Row]:
    steps = 50 if quick else 200
    banner(f"bench_recording: a {steps}-call session, {OUTPUT_BYTES:,}-byte tool results")
    with tempfile.TemporaryDirectory(prefix="weald-bench-rec-") as tmp:
        path = Path(tmp) / "session.json"
        plain = trio.run(session, ScriptedProvider.from_dict(script(steps)), steps)
        recorded = trio.run(session, Recorder(path).wrap(ScriptedProvider.from_dict(script(steps))), steps)
        replayed = trio.run(session, ScriptedProvider.from_file(path), steps)
        size = path.stat().st_size
    base = median(plain)
    rows = [Row("recording", "scripted, per call (median)", base, "ms")]
    for name, times in (("recording", recorded), ("replay (checked)", replayed)):
        typical = median(times)
        rows.append(Row("recording", f"{name}, per call (median)", typical, "ms", note=f"{typical / base:.1f}x"))
        rows.append(Row("recording", f"{name}, last call", times[-1], "ms", note=f"{times[-1] / plain[-1]:.1f}x"))
    rows.append(Row("recording", "recording size", size / 1024, "KB", note=f"{size / steps:,.0f} bytes per call"))
    return summary(rows)


if __name__ == "__main__":
    quick_main(run, __doc__)
