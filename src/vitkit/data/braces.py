"""Shard patterns (`wds:PATTERN`): bash-style brace expansion, {a..b} zero-padded ranges and {x,y}
alternatives, nestable."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
MAX_SHARDS = 1_000_000  # names a brace range may expand to


def expand_braces(pattern: str) -> list[str]:
    """Bash-style brace expansion: "a-{00..02}.tar" -> a-00.tar a-01.tar a-02.tar; "{x,y}" -> x, y."""
    start = pattern.find("{")
    if start < 0:
        return [pattern]
    depth = 0
    for end in range(start, len(pattern)):
        depth += {"{": 1, "}": -1}.get(pattern[end], 0)
        if depth == 0:
            break
    else:
        raise ValueError(f"unbalanced braces in shard pattern {pattern!r}")
    body, rest = pattern[start + 1 : end], pattern[end + 1 :]
    ranged = _RANGE.match(body)
    if ranged:
        first, last = int(ranged[1]), int(ranged[2])
        width = len(ranged[1]) if ranged[1].lstrip("-").startswith("0") else 0
        step = 1 if last >= first else -1
        if abs(last - first) >= MAX_SHARDS:
            raise ValueError(f"shard pattern {pattern!r}: the range {{{body}}} names more than {MAX_SHARDS:,} shards")
        options = [f"{n:0{width}d}" for n in range(first, last + step, step)]
    else:
        options = _top_level_split(body)
    return [
        head + tail
        for option in options
        for head in expand_braces(pattern[:start] + option)
        for tail in expand_braces(rest)
    ]


def _top_level_split(body: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in body:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]
