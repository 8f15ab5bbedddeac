"""`leading_id`: the id of a message too large to read whole, found in its first bytes (runtime/daemon/_front.py)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st
from weald.runtime.daemon._front import ID_SCAN_BYTES, leading_id

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
ids = st.text(max_size=20) | st.integers(min_value=-(2**53), max_value=2**53)


@given(
    before=st.dictionaries(st.text(max_size=8).filter(lambda k: k != "id"), json_values, max_size=4),
    after=st.dictionaries(st.text(max_size=8).filter(lambda k: k != "id"), json_values, max_size=4),
    request_id=ids,
    cut=st.integers(min_value=0),
)
def test_the_id_is_found_wherever_it_stands_and_a_cut_text_never_gives_another(
    before: dict[str, Any], after: dict[str, Any], request_id: str | int, cut: int
) -> None:
    message = {**before, "id": request_id, **after}
    text = msgspec.json.encode(message)
    assert leading_id(text) == request_id
    # Cut anywhere (the way a line over the limit is cut): the id, or nothing, never a wrong one.
    assert leading_id(text[: cut % (len(text) + 1)]) in (request_id, None)


def test_ids_that_are_not_a_string_or_an_integer_and_texts_that_are_not_objects_give_none() -> None:
    for text in [b'{"id": true}', b'{"id": 1.5}', b'{"id": null}', b'{"id": [1]}', b'[{"id": 1}]', b"", b"id: 1"]:
        assert leading_id(text) is None, text


def test_an_id_after_a_huge_member_is_not_looked_for_past_the_scan() -> None:
    text = b'{"jsonrpc": "2.0", "params": {"blob": "' + b"x" * ID_SCAN_BYTES + b'"}, "id": 7}'
    assert leading_id(text) == 7
    assert leading_id(text[:ID_SCAN_BYTES]) is None
