"""Hypothesis strategies for supervision trees and fault schedules."""

from __future__ import annotations

from hypothesis import strategies as st
from sup_model import SupNode, WorkerNode

restart_types = st.sampled_from(["permanent", "transient", "temporary"])
strategy_names = st.sampled_from(["one_for_one", "one_for_all", "rest_for_one"])


@st.composite
def trees(draw: st.DrawFn, depth: int = 2, node_id: str = "top", *, lazy: bool = True) -> SupNode:
    """A supervisor with 1-4 children, some of them supervisors (to ``depth`` levels).

    Each worker is loop-hosted or a thread actor, at random, and, with
    ``lazy``, started with its supervisor or by its first message, at random.
    """
    count = draw(st.integers(1, 4))
    children: list[WorkerNode | SupNode] = []
    for i in range(count):
        cid = f"c{i}"
        if depth > 0 and draw(st.booleans()):
            children.append(draw(trees(depth=depth - 1, node_id=cid, lazy=lazy)))
        else:
            children.append(
                WorkerNode(cid, draw(restart_types), threaded=draw(st.booleans()), lazy=lazy and draw(st.booleans()))
            )
    return SupNode(
        id=node_id,
        restart=draw(restart_types) if node_id != "top" else "permanent",
        strategy=draw(strategy_names),
        max_restarts=draw(st.integers(0, 3)),
        children=tuple(children),
    )


operations = st.lists(
    st.tuples(st.sampled_from(["crash", "crash", "stop", "hibernate", "wake"]), st.integers(0, 10_000)),
    min_size=1,
    max_size=8,
)
"""Crash or stop a running worker; hibernate a running child; send a message to a sleeping one."""
