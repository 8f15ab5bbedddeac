"""The fast argument check only ever accepts what jsonschema accepts; jsonschema decides the rest."""

from __future__ import annotations

import math
from typing import Any

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st
from weald.tools import ToolContext, default_registry, tool, validate_arguments
from weald.tools._contract import _compile_check, _fast_check

NAMES = st.sampled_from(["a", "b", "c", "path", "n"])
TYPES = st.sampled_from(["string", "integer", "number", "boolean", "object", "array", "null"])
FLOATS = st.one_of(st.floats(-5, 5), st.sampled_from([math.nan, math.inf, -math.inf, 1.0, 0.0, -0.0]))
NUMBERS = st.one_of(st.integers(-5, 5), FLOATS)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), FLOATS, st.text(max_size=3))


def schemas(depth: int = 2) -> st.SearchStrategy[dict[str, Any]]:
    sub = st.deferred(lambda: schemas(depth - 1)) if depth > 0 else st.just({"type": "string"})
    return st.fixed_dictionaries(
        {},
        optional={
            "type": st.one_of(TYPES, st.lists(TYPES, min_size=1, max_size=3, unique=True)),
            "minimum": NUMBERS.filter(lambda v: not (isinstance(v, float) and math.isnan(v))),
            "maximum": NUMBERS.filter(lambda v: not (isinstance(v, float) and math.isnan(v))),
            "exclusiveMinimum": st.integers(-5, 5),
            "exclusiveMaximum": st.floats(-5, 5),
            "minLength": st.integers(0, 3),
            "maxLength": st.integers(0, 3),
            "minItems": st.integers(0, 3),
            "maxItems": st.integers(0, 3),
            "enum": st.lists(SCALARS, min_size=1, max_size=4),
            "items": sub,
            "required": st.lists(NAMES, max_size=3, unique=True),
            "dependentRequired": st.dictionaries(NAMES, st.lists(NAMES, max_size=2, unique=True), max_size=2),
            "properties": st.dictionaries(NAMES, st.one_of(sub, st.just(True)), max_size=3),
            "additionalProperties": st.booleans(),
            "description": st.text(max_size=5),
            "default": SCALARS,
        },
    )


def instances(depth: int = 2) -> st.SearchStrategy[Any]:
    if depth == 0:
        return SCALARS
    inner = instances(depth - 1)
    return st.one_of(
        SCALARS,
        st.lists(inner, max_size=3),
        st.dictionaries(NAMES, inner, max_size=4),
        st.tuples(inner),  # not JSON: must never be judged valid by the fast check alone
    )


@settings(max_examples=800, deadline=None)
@given(schemas(), instances())
def test_the_fast_check_accepts_only_what_jsonschema_accepts(schema: dict[str, Any], instance: Any) -> None:
    check = _compile_check(schema)
    if check is not None and check(instance):
        assert jsonschema.Draft202012Validator(schema).is_valid(instance), (schema, instance)


def test_the_fast_check_covers_the_built_in_tool_schemas() -> None:
    for t in default_registry.select():
        assert _fast_check(t._validator) is not None, t.name


def test_schemas_outside_the_subset_get_no_fast_check() -> None:
    for schema in (
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        {"anyOf": [{"type": "string"}]},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "integer", "multipleOf": 2},
        {"type": "string", "format": "date"},
        {"type": "custom"},
    ):
        assert _compile_check(schema) is None, schema


def test_what_the_fast_check_is_unsure_of_still_validates_through_jsonschema() -> None:
    @tool(
        name="typed_args",
        description="x",
        parameters={
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 1}, "flag": {"enum": [1, "x"]}},
            "required": ["n"],
            "additionalProperties": False,
        },
        registry=default_registry.copy(),
    )
    def typed_args(ctx: ToolContext, n: int, flag: Any = None) -> str:
        return str(n)

    assert validate_arguments(typed_args, {"n": 2.0}) is None  # jsonschema: 2.0 is an integer
    assert validate_arguments(typed_args, {"n": 2, "flag": 1.0}) is None  # jsonschema: 1.0 equals 1
    assert validate_arguments(typed_args, {"n": True}) is not None  # a boolean is not an integer
    assert validate_arguments(typed_args, {"n": 2, "flag": True}) is not None  # True is not 1 here
    assert "unknown argument" in (validate_arguments(typed_args, {"n": 2, "extra": 1}) or "")
    assert "required" in (validate_arguments(typed_args, {}) or "")
