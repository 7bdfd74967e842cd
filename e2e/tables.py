"""kubectl's table output (`kubectl get ...` without -o json) read back by column, the way a person reads it.

Used by the e2e scenarios that check what users see (printer columns, `get events --sort-by`). kubectl left-aligns
each cell under its header and separates columns by at least three spaces, so a header name may hold one space
(`LAST SEEN`) and a cell may hold single spaces (`4.6s / 40ms`): columns are cut at the headers' start offsets.
"""

from __future__ import annotations

import re

_HEADER = re.compile(r"\S+(?: \S+)*")   # a header name: words joined by single spaces


def table(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """(header names, one {name: cell} per row) of a kubectl table."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return [], []
    found = list(_HEADER.finditer(lines[0]))
    names = [m.group(0) for m in found]
    starts = [m.start() for m in found] + [None]
    rows = []
    for line in lines[1:]:
        rows.append({name: line[starts[i]:starts[i + 1]].strip() for i, name in enumerate(names)})
    return names, rows
