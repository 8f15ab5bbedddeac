"""Chaos: random trees, random agent workloads and random fault schedules; the invariants hold after each run.

See `rel_chaos` (agents) and `rel_trees` (trees) for the invariants. A
failing example shrinks to the smallest plan that still breaks one, and its
report lists the faults, what each prompt got, and the broken invariant.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from rel_chaos import INVARIANTS, ChaosPlan, PromptPlan, SessionPlan, escalating_plan, run_chaos
from rel_strategies import chaos_plans, pings, seeds, tree_faults, trees
from rel_trees import run_tree_chaos
from sup_model import SupNode
from weald.runtime.faults import ActorFault

_CHAOS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


@settings(_CHAOS, max_examples=60)
@given(tree=trees(lazy=False), faults=tree_faults(), seed=seeds, picks=pings)
def test_seeded_crashes_restart_random_trees_exactly_as_otp_would_and_replay_the_same(
    tree: SupNode, faults: tuple[ActorFault, ...], seed: int, picks: list[int]
) -> None:
    report = run_tree_chaos(tree, faults, seed, picks)
    assert not report.failures, "\n".join(f"{c.name}: {c.detail}" for c in report.failures)


# A session supervisor that gives up (more than 5 restarts), is restarted by /sessions, and carries
# on: always run, whatever hypothesis draws.
ESCALATING = escalating_plan()


@settings(_CHAOS, max_examples=30)
@example(plan=ESCALATING)
@given(plan=chaos_plans())
def test_scripted_agents_under_seeded_faults_keep_every_invariant(plan: ChaosPlan) -> None:
    report = run_chaos(plan)
    assert {c.name for c in report.checks} == set(INVARIANTS)
    assert not report.failures, report.summary()
    if plan is ESCALATING:
        assert report.escalations == 1, report.summary()


def test_a_crash_between_the_end_of_a_turn_and_its_acknowledgement_still_answers_the_prompt(
    tmp_path: Path,
) -> None:
    plan = ChaosPlan(
        seed=1,
        sessions=(SessionPlan("s0", (PromptPlan("hello", (), "hi"),)),),
        faults=(
            # The store's acknowledgement comes after _ModelDone, and the crash lands in between.
            ActorFault(id="slow-ack", kind="delay", path="/sessions/s0/agent", message="_Flushed", seconds=0.3),
            ActorFault(id="crash", kind="crash", path="/sessions/s0/agent", message="_ModelDone", count=1),
        ),
    )
    report = run_chaos(plan, tmp_path, answer_bound=5.0)  # the answer never comes: no need to wait 30 s
    answered = next(c for c in report.checks if c.name == "answered")
    assert answered.held, answered.detail
