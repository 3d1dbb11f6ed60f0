"""The terminal's tables: one line a row, columns padded to their widest cell, every cell escaped for the terminal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from profkit.escape import terminal


def text_table(rows: list[dict[str, Any]], columns: dict[str, Callable[[dict[str, Any]], Any]], limit: int) -> str:
    """`rows` under `columns` ({title: cell of a row}), at most `limit` of them (how many more, said)."""
    if not rows:
        return "  (none)"
    limit = max(limit, 0)  # a negative count would slice from the end
    table = [{title: terminal(fmt(r)) for title, fmt in columns.items()} for r in rows[:limit]]  # one line a cell
    widths = {c: max([len(c), *(len(row[c]) for row in table)]) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(v.ljust(widths[c]) for c, v in row.items()).rstrip() for row in table]
    more = f"\n  ... {len(rows) - limit} more" if len(rows) > limit else ""
    return "\n".join("  " + line for line in lines) + more


def trace_view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    """A trace table's view: the report and how many rows a table shows; None without a trace (the sections of the
    trace's tables are shown wherever the report has one, an empty table as "(none)")."""
    return None if report.get("gpu") is None else {"report": report, "top": top}
