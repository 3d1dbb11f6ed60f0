"""NVTX ranges, like `nsys stats --report nvtx_sum` (`domain:name`, PushPop/StartEnd)."""

from __future__ import annotations

from typing import Any

from profkit.analysis.stats import histogram, summarize
from profkit.analysis.window import Window
from profkit.traces.schema import Trace


def nvtx_summary(trace: Trace, window: Window) -> list[dict[str, Any]]:
    stats = summarize(
        histogram(trace, f"SELECT name, style, end - start AS dur FROM nvtx WHERE {window.where()}",
                  ["name", "style"], window.params),
        ["name", "style"],
    )
    return sorted(stats, key=lambda r: -r["total"])
