"""The run history's listing (`profkit history`, `profkit.history/1`): an aligned text table or a Markdown table
(JSON is the document itself, render/json.py). Labels and paths come from users and traces: every cell goes
through profkit.escape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from profkit import escape
from profkit.units import pct

# (header, column, how it is shown)
SHOWN: list[tuple[str, str, str]] = [
    ("id", "id", "int"), ("label", "label", "str"), ("saved_at", "saved_at", "str"), ("kind", "kind", "str"),
    ("gpu", "gpu", "str"), ("req/s", "request_throughput", "2f"), ("mean TTFT ms", "mean_ttft_ms", "1f"),
    ("p99 TTFT ms", "p99_ttft_ms", "1f"), ("preemptions", "vllm_preemptions", "0f"),
    ("GPU util", "gpu_utilization", "pct"), ("graph share", "kernels_graph_share", "pct"),
]


def _cell(row: dict[str, Any], column: str, how: str) -> str:
    value = row.get(column)
    if value is None or value == "":
        return "-"
    if how == "pct":
        return pct(float(value))
    if how.endswith("f"):
        return f"{float(value):,.{how[0]}f}"
    return str(value)


def _table(doc: dict[str, Any], esc: Callable[[object], str]) -> list[list[str]]:
    return [[esc(_cell(r, col, how)) for _, col, how in SHOWN] for r in doc["runs"]]


def render_history_text(doc: dict[str, Any]) -> str:
    if not doc["runs"]:
        return "no runs\n"
    headers = [h for h, _, _ in SHOWN]
    table = _table(doc, escape.terminal)
    widths = [max(len(h), *(len(cells[i]) for cells in table)) for i, h in enumerate(headers)]
    right = [how != "str" for _, _, how in SHOWN]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True))

    return "\n".join(line(cells) for cells in [headers, *table]) + "\n"


def render_history_markdown(doc: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(h for h, _, _ in SHOWN) + " |",
             "|" + "|".join("---:" if how not in ("str",) else "---" for _, _, how in SHOWN) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in _table(doc, escape.markdown)]
    return "\n".join(lines) + "\n"
