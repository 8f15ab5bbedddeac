"""Each package's public surface is explicit, sorted and complete (as httpx checks its own)."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = [
    "weald.runtime",
    "weald.runtime.agents.agent",
    "weald.runtime.agents.context",
    "weald.runtime.agents.session",
    "weald.runtime.agents.tool_runner",
    "weald.runtime.llm",
    "weald.runtime.mcp",
    "weald.runtime.faults",
    "weald.runtime.daemon",
    "weald.runtime.daemon.config",
    "weald.runtime.testing",
    "weald.runtime.pytest_plugin",
    "weald.supervisors",
    "weald.tools",
]


def _isort_key(member: str) -> tuple[int, str]:
    """ruff's __all__ order (RUF022): CONSTANTS, then Classes, then everything else."""
    if member.isupper():
        return (0, member)
    if member[:1].isupper():
        return (1, member)
    return (2, member)


def _owned(module_name: str, defined_in: str) -> bool:
    """Defined by the module itself: inside it, or in its private siblings (``_faults_spec`` for ``faults``)."""
    if defined_in == module_name or defined_in.startswith(module_name + "."):
        return True
    parent, _, leaf = module_name.rpartition(".")
    sibling_parent, _, sibling = defined_in.rpartition(".")
    return sibling_parent == parent and sibling.startswith(f"_{leaf}")


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_lists_only_real_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported == sorted(exported, key=_isort_key), f"{name}.__all__ is not sorted"
    assert len(exported) == len(set(exported)), f"{name}.__all__ has duplicates"
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what it does not define: {missing}"


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_name_is_exported(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        n
        for n, value in vars(module).items()
        if not n.startswith("_")
        and not n.startswith("pytest_")  # a plugin's hooks are pytest's contract, found by name, not its API
        and _owned(name, getattr(value, "__module__", "") or "")
        and not isinstance(value, type(importlib))
    }
    assert public <= set(module.__all__), (
        f"{name} defines public names it does not export: {public - set(module.__all__)}"
    )


def test_the_core_exports_what_the_supervisors_build_on() -> None:
    import weald.runtime

    for name in ["Actor", "ThreadActor", "Ref", "Down", "Exit", "ActorSystem", "Future", "StartError", "WealdError"]:
        assert name in weald.runtime.__all__


def test_the_supervisor_contract_is_exported() -> None:
    import weald.supervisors

    assert {"ChildSpec", "ChildInfo", "Supervisor", "DynamicSupervisor", "Backoff"} <= set(weald.supervisors.__all__)
