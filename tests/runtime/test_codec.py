"""Typed decoding across threads (runtime/_codec.py): the msgspec plan race that crashed a daemon at start."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from weald.runtime import msgspec_convert, msgspec_decoder

RACE = Path(__file__).with_name("codec_race.py")
ROOT = Path(__file__).resolve().parents[2]


def _race(mode: str, rounds: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RACE), mode, str(rounds)], capture_output=True, text=True, timeout=240, check=False
    )


def test_types_decoded_for_the_first_time_by_four_threads_at_once_never_crash_the_process() -> None:
    done = _race("weald", 200)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert "survived 200 rounds" in done.stdout


def test_plain_msgspec_crashes_in_the_same_race_so_the_test_above_can_fail() -> None:
    # The control: if msgspec ever builds its plans safely, this fails and
    # runtime/_codec.py's lock can go (say so upstream too).
    done = _race("plain", 2000)
    assert done.returncode in (-signal.SIGSEGV, 1), (
        f"plain msgspec survived the race (exit {done.returncode}): has msgspec fixed it?\n{done.stdout[-500:]}"
    )
    if done.returncode == -signal.SIGSEGV:
        assert "Fatal Python error: Segmentation fault" in done.stderr


def test_a_decoder_is_made_once_per_type_and_decodes_and_converts() -> None:
    class Point(msgspec.Struct):
        x: int
        y: int = 0

    decoder = msgspec_decoder(Point)
    assert msgspec_decoder(Point) is decoder
    assert decoder.decode(b'{"x": 1}') == Point(1, 0)
    assert msgspec_convert({"x": 2, "y": 3}, Point) == Point(2, 3)
    with pytest.raises(msgspec.ValidationError, match=r"Expected `int`, got `str` - at `\$.x`"):
        msgspec_convert({"x": "no"}, Point)


_TYPED_CALLS = {
    ("msgspec", "convert"),
    ("json", "Decoder"),
    ("msgpack", "Decoder"),
}


def _typed_msgspec_calls(tree: ast.AST) -> list[int]:
    """Lines that build a msgspec decoding plan directly (typed decode, convert, a Decoder of a type)."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        pair = (owner_name, node.func.attr)
        typed_decode = pair in {("json", "decode"), ("msgpack", "decode")} and any(
            k.arg == "type" for k in node.keywords
        )
        if pair in _TYPED_CALLS or typed_decode:
            lines.append(node.lineno)
    return lines


def test_no_module_of_weald_builds_a_msgspec_plan_except_through_the_codec() -> None:
    offenders = []
    for package in ("runtime", "tools", "supervisors"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "_codec.py":
                continue
            for line in _typed_msgspec_calls(ast.parse(path.read_text(encoding="utf-8"))):
                offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert offenders == [], f"typed msgspec decoding outside weald.runtime._codec (racy across threads): {offenders}"
