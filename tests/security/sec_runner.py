"""The real tool runner, driven as an agent drives it: `RunTools` in, `ToolResults` out.

`RunnerHarness` spawns a `ToolRunner` (with the built-in tools, every
permission allowed so that only the sandbox can refuse, unless a test gives
its own permissions) and a stand-in agent
that collects the results; `call` runs one tool call through it and returns
the `ToolResult` the model would read.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from weald.runtime import ActorSystem
from weald.runtime.agents.tool_runner import RunnerConfig, RunTools, ToolCallRequest, ToolResults, ToolRunner
from weald.runtime.testing import ResultCollector, wait_until
from weald.tools import ToolConfig, ToolResult, default_registry

SECRET = "top secret: the launch codes\n"
"""The content of ``outside/secret.txt``: finding it in any output is a leak."""

ALLOW_ALL = {"write_file": "allow", "edit_file": "allow", "shell": "allow"}


class RunnerHarness:
    """A ToolRunner for ``project`` and an agent stand-in, in ``system``."""

    _batches = itertools.count(1)

    def __init__(
        self,
        system: ActorSystem,
        project: Path,
        *,
        options: dict[str, Any] | None = None,
        permissions: dict[str, Any] | None = None,
        permission_timeout: float = 300.0,
        protected: tuple[str, ...] = (),
    ) -> None:
        config = RunnerConfig(
            permissions=ALLOW_ALL if permissions is None else permissions,
            permission_timeout=permission_timeout,
            tool_config=ToolConfig(options=options or {}, protected_paths=protected),
            timeouts={"shell": 20.0, "grep": 20.0, "glob": 20.0},
        )
        self.runner = system.spawn(
            ToolRunner,
            args=("sec", project),
            kwargs={"registry": default_registry, "config": config, "output_dir": project.parent / "outputs"},
            name="runner",
        )
        self.agent = system.spawn(ResultCollector, name="agent")

    def call(self, tool: str, **arguments: Any) -> ToolResult:
        """Run one call through the runner; the result the model would read."""
        batch = f"b{next(self._batches)}"
        request = ToolCallRequest(f"{batch}-c0", tool, arguments)
        self.runner.tell(RunTools(batch, (request,), None, self.agent, agent_id="sec", agent_path="/agent"))
        results: ToolResults = wait_until(
            lambda: self.agent.proxy().result(batch).get(timeout=5), timeout=30, message=f"the result of {tool}"
        )
        return results.outcomes[0].result
