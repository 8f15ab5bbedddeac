"""sanitize_tool_name and the per-server registration of tool names."""

from __future__ import annotations

import random
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from weald.runtime.mcp import sanitize_tool_name
from weald.runtime.mcp._names import register_tool_names

VALID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def test_plain_names_are_joined_with_the_prefix():
    assert sanitize_tool_name("github", "create_issue") == "mcp__github__create_issue"
    assert sanitize_tool_name("every-thing", "get-sum") == "mcp__every-thing__get-sum"


def test_disallowed_characters_become_underscores():
    assert sanitize_tool_name("my server", "files.read/all") == "mcp__my_server__files_read_all"
    assert sanitize_tool_name("ü", "") == "mcp__" + "_" + "__" + "_"


def test_a_long_name_is_cut_to_64_characters_with_a_stable_hash_suffix():
    long_tool = "x" * 100
    name = sanitize_tool_name("srv", long_tool)
    assert len(name) == 64
    assert VALID.match(name)
    assert name == sanitize_tool_name("srv", long_tool)
    assert name != sanitize_tool_name("srv", long_tool + "y")


def test_a_taken_name_gets_a_hash_suffix_and_avoids_every_taken_name():
    plain = sanitize_tool_name("s", "a.b")
    first = sanitize_tool_name("s", "a.b", taken={plain})
    assert first != plain
    assert first.startswith("mcp__s__a_b_")
    second = sanitize_tool_name("s", "a.b", taken={plain, first})
    assert second not in {plain, first}


def test_an_unchanged_name_wins_over_a_sanitised_one_whatever_the_order():
    for tools in (["a_b", "a.b"], ["a.b", "a_b"]):
        names = register_tool_names("s", tools)
        assert names["a_b"] == "mcp__s__a_b"
        assert names["a.b"].startswith("mcp__s__a_b_")


@settings(database=None, max_examples=200)
@given(
    st.text(min_size=1, max_size=40),
    st.lists(st.text(max_size=80), unique=True, max_size=12),
)
def test_registered_names_are_valid_distinct_and_independent_of_order(server, tools):
    names = register_tool_names(server, tools)
    assert set(names) == set(tools)
    assert all(VALID.match(name) for name in names.values())
    assert len(set(names.values())) == len(names)
    shuffled = list(tools)
    random.Random(0).shuffle(shuffled)
    assert register_tool_names(server, shuffled) == names
