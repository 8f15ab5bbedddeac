"""Hypothesis strategies for chaos: agent workloads, fault schedules, and faulted supervision trees.

Trees come from the supervisor tests' `sup_strategies.trees`. Everything
shrinks towards the simplest case: fewer sessions, prompts, rounds and
faults; the first entries of the call and fault menus (the plainest ones);
``nth = 1`` and ``count = 1``.
"""

from __future__ import annotations

import msgspec
from hypothesis import strategies as st
from rel_chaos import Call, ChaosPlan, PromptPlan, SessionPlan, call_menu, fault_menu
from sup_strategies import trees
from weald.runtime.faults import ActorFault, FaultSpec

__all__ = ["chaos_plans", "fault_schedules", "tree_faults", "trees"]

seeds = st.integers(0, 2**32 - 1)


@st.composite
def prompt_plans(draw: st.DrawFn, session_id: str, index: int) -> PromptPlan:
    """A prompt answered after 0-2 rounds of 1-3 tool calls each."""
    rounds: list[tuple[Call, ...]] = []
    for r in range(draw(st.integers(0, 2))):
        width = draw(st.integers(1, 3))
        rounds.append(tuple(draw(st.sampled_from(call_menu(session_id, index, r, n))) for n in range(width)))
    return PromptPlan(f"prompt {index} of {session_id}", tuple(rounds), f"answer {index} of {session_id}")


@st.composite
def session_plans(draw: st.DrawFn, session_id: str, max_prompts: int) -> SessionPlan:
    """A session with 1-``max_prompts`` prompts."""
    count = draw(st.integers(1, max_prompts))
    return SessionPlan(session_id, tuple(draw(prompt_plans(session_id, i)) for i in range(count)))


@st.composite
def fault_schedules(draw: st.DrawFn, index: int) -> FaultSpec:
    """One fault from the menu with a schedule: every ``nth`` or with probability ``p``, at most ``count`` times.

    Crashes may fire up to 8 times, more than a session supervisor's
    intensity (5), so that giving up and restarting a session is exercised.
    """
    import attrs

    base = draw(st.sampled_from(fault_menu()))
    crash = base.kind == "crash"
    schedule: dict[str, object] = {"id": f"f{index}", "count": draw(st.integers(1, 8 if crash else 3))}
    if draw(st.booleans()):
        schedule["p"] = draw(st.sampled_from([1.0, 0.5, 0.25]))
    else:
        schedule["nth"] = draw(st.integers(1, 3))
    return attrs.evolve(base, **schedule)


@st.composite
def chaos_plans(draw: st.DrawFn, max_sessions: int = 3, max_prompts: int = 3, max_faults: int = 4) -> ChaosPlan:
    """A whole chaos run: sessions with their scripts, a fault schedule and the injector's seed."""
    sessions = tuple(draw(session_plans(f"s{i}", max_prompts)) for i in range(draw(st.integers(1, max_sessions))))
    faults = tuple(draw(fault_schedules(i)) for i in range(draw(st.integers(0, max_faults))))
    return ChaosPlan(draw(seeds), sessions, faults)


@st.composite
def tree_faults(draw: st.DrawFn) -> tuple[ActorFault, ...]:
    """1-3 faults on the workers' pings: crashes (mostly), delays and drops, on every worker or some."""
    faults = []
    for i in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["crash", "crash", "drop", "delay"]))
        path = draw(st.sampled_from(["*", "*/c0", "*/c1*", "*/c[02]"]))
        extra: dict[str, object] = {"seconds": 0.01} if kind == "delay" else {}
        if draw(st.booleans()):
            extra["p"] = draw(st.sampled_from([1.0, 0.5, 0.25]))
        else:
            extra["nth"] = draw(st.integers(1, 3))
        count = draw(st.one_of(st.none(), st.integers(1, 6)))
        faults.append(ActorFault(id=f"t{i}", kind=kind, path=path, message="Ping", count=count, **extra))  # type: ignore[arg-type]
    return tuple(faults)


pings = st.lists(st.integers(0, 10_000), min_size=1, max_size=12)
"""Which running worker each ping goes to (an index into the model's running workers)."""


# -- fuzzing the JSON-RPC server ------------------------------------------------------------------------------

json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
"""Any JSON value, nested a few levels: what a wrong field, id or params may hold."""

_VALID_BY_TYPE = {
    str: st.text(max_size=12) | st.sampled_from(["fz", "/", "/no/such/dir", "*", ""]),
    int: st.integers(-5, 10**6),
    float: st.floats(-1, 5, allow_nan=False),
}


def _plausible(annotation: object) -> st.SearchStrategy[object]:
    """A value of roughly the right type for a params field (so that other fields' errors are reached)."""
    import typing

    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return st.sampled_from(typing.get_args(annotation))
    if origin in (list, dict) or annotation is dict:
        args = typing.get_args(annotation)
        item = _plausible(args[-1]) if args else json_values
        if origin is list:
            return st.lists(item, max_size=3)
        return st.dictionaries(st.text(max_size=8), item, max_size=3)
    if origin is not None:  # a union such as str | None
        return st.one_of([_plausible(a) for a in typing.get_args(annotation)])
    if annotation is type(None):
        return st.none()
    return _VALID_BY_TYPE.get(annotation, json_values)  # type: ignore[arg-type]


@st.composite
def wrong_requests(draw: st.DrawFn, method: str) -> dict[str, object]:
    """A request for ``method`` that is well-formed JSON and wrong somewhere: a field, the params, the id..."""
    from rel_fuzz import UNSAFE, params_fields

    fields = params_fields(method)
    params: object = {f.name: draw(_plausible(f.type)) for f in fields if f.required or draw(st.booleans())}
    how = draw(st.sampled_from(["field", "unknown", "missing", "params", "none"]))
    assert isinstance(params, dict)
    if how == "field" and fields:
        params[draw(st.sampled_from([f.name for f in fields]))] = draw(json_values)
    elif how == "unknown" or method in UNSAFE:
        params[draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in {f.name for f in fields}))] = draw(
            json_values
        )
    elif how == "missing" and params:
        del params[draw(st.sampled_from(sorted(params)))]
    elif how == "params":
        params = draw(json_values.filter(lambda v: not isinstance(v, dict)))
    request: dict[str, object] = {"jsonrpc": draw(st.sampled_from(["2.0", "2.0", "2.0", "1.0", 2.0])), "method": method}
    if method in UNSAFE:
        request["jsonrpc"] = "2.0"  # its params are invalid: the error must come from them
    request["id"] = draw(st.integers(0, 2**53) | st.text(max_size=10) | json_values)
    if params != {} or draw(st.booleans()):
        request["params"] = params
    return request


def fuzz_methods() -> list[str]:
    """Every method in the server's table."""
    from rel_fuzz import method_table

    return sorted(method_table())


_INVALID_UTF8 = [b"\xff", b"\xfe\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80abc", b"\xe2\x82"]

raw_lines = st.one_of(
    st.binary(max_size=512).map(lambda b: b.replace(b"\n", b" ")),
    st.lists(st.sampled_from(_INVALID_UTF8) | st.binary(max_size=8), max_size=20).map(
        lambda xs: b"".join(xs).replace(b"\n", b"")
    ),
    st.text(max_size=200).map(lambda t: t.replace("\n", " ").encode("utf-8", "surrogatepass")),
    json_values.map(msgspec.json.encode),
    st.integers(1, 400).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 400).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.tuples(json_values, st.integers(0, 60)).map(
        lambda t: msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "params": t[0]})[: t[1]]
    ),
)
"""One line of garbage (no newline inside): random bytes, invalid UTF-8, stray JSON, nesting, cut-off requests."""


_FAULT_ID = st.text(alphabet="abcdefghij0123456789_.:@-", min_size=1, max_size=10)
_GLOB = st.sampled_from(["x*", "no_such_*", "[ab]*", "?"])
_VALID_FAULT_FIELDS: dict[str, st.SearchStrategy[object]] = {
    "id": _FAULT_ID,
    "nth": st.integers(1, 5),
    "p": st.floats(0.01, 1),
    "count": st.integers(1, 5),
    "after": st.integers(0, 5),
    "seconds": st.floats(0, 0.01),
    "status": st.integers(400, 599),
    "retry_after": st.floats(0, 1),
    "trigger": st.sampled_from(["call", "now"]),
    "error_text": st.text(max_size=10),
}
_WRONG_FAULT_VALUES = st.integers(-3, 0) | st.floats(-1, 2, allow_nan=False) | st.sampled_from(["", "later", "1"])


@st.composite
def fault_declarations(draw: st.DrawFn) -> dict[str, object]:
    """A ``fault.inject`` declaration, valid about half the time, that matches no live actor when valid.

    Targets, kinds and keys come from the declaration classes; each key is
    right (mostly) or wrong (a wrong type, a value out of range, any JSON).
    An actor fault's ``path`` is always wrong or a path no actor has, so a
    valid declaration harms nothing.
    """
    import attrs
    from weald.runtime.faults import KINDS, TARGETS, ActorFault, MCPFault, ProviderFault, ToolFault

    classes = {"actor": ActorFault, "tool": ToolFault, "mcp": MCPFault, "provider": ProviderFault}
    target = draw(st.sampled_from([*TARGETS, "junk"]) if draw(st.integers(0, 9)) == 0 else st.sampled_from(TARGETS))
    cls = classes.get(target, ActorFault)
    declaration: dict[str, object] = {}
    if draw(st.integers(0, 19)):
        declaration["target"] = target
    if draw(st.integers(0, 19)):
        kinds = KINDS.get(target, ())
        declaration["kind"] = draw(
            st.sampled_from([*kinds, "explode"])
            if draw(st.integers(0, 9)) == 0
            else st.sampled_from(kinds or ("explode",))
        )
    for field in attrs.fields(cls):
        if field.name in ("target", "kind") or draw(st.integers(0, 3)):
            continue
        valid = _VALID_FAULT_FIELDS.get(field.name, _GLOB)
        wrong = _WRONG_FAULT_VALUES | json_values
        declaration[field.name] = draw(valid if draw(st.integers(0, 5)) else wrong)
    if target == "actor" and isinstance(declaration.get("path", "*"), str):
        declaration["path"] = "/no/such/actor/*"
    if draw(st.integers(0, 19)) == 0:
        declaration[draw(st.text(min_size=1, max_size=6))] = draw(json_values)
    return declaration
