"""NVTX ranges, like `nsys stats --report nvtx_sum` (`domain:name`, PushPop/StartEnd)."""

from __future__ import annotations

import pandas as pd

from profkit.analysis.stats import histogram, summarize
from profkit.analysis.window import Window
from profkit.traces.model import Trace


def nvtx_summary(trace: Trace, window: Window) -> pd.DataFrame:
    stats = summarize(
        histogram(trace, f"SELECT name, style, end - start AS dur FROM nvtx WHERE {window.where()}",
                  ["name", "style"], window.params),
        ["name", "style"],
    )
    return stats.sort_values("total", ascending=False).reset_index(drop=True)
