"""The agent layer: agents, their sessions, their tool runners and their context.

It sits above the actor core (`weald.runtime`), the supervisors and the tools,
and below the daemon (`weald.runtime.daemon`). Each module is imported
explicitly, so a program that needs only one part does not load the rest:

- `weald.runtime.agents.agent`: the Agent actor, the model <-> tools loop as a
  state machine, and its stored records.
- `weald.runtime.agents.session`: one agent's session supervisor
  (``rest_for_one``: tool runner, sub-agents, agent) and its configuration.
- `weald.runtime.agents.tool_runner`: the ToolRunner and the short-lived
  ToolExecution child of each tool call; permission decisions.
- `weald.runtime.agents.context`: what of the history the model sees, token
  estimates, pruning and compaction marks.
"""

from __future__ import annotations

__all__: list[str] = []
