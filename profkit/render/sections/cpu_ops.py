"""CPU operators of a torch trace (aten ops and the like, host time): the top ones in text and Markdown, all of them
in HTML, as the CUDA API table is shown."""

from __future__ import annotations

from typing import Any

from profkit.render.sections.table import text_table
from profkit.units import ns


def view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    return {"report": report, "top": top} if report.get("gpu") is not None and report.get("cpu_ops") else None


def text(v: dict[str, Any]) -> list[str]:
    return ["CPU operators (torch)",
            text_table(v["report"]["cpu_ops"], {
                "operator": lambda r: r["name"], "count": lambda r: r["count"], "total": lambda r: ns(r["total_ns"]),
                "avg": lambda r: ns(r["avg_ns"]),
            }, v["top"])]
