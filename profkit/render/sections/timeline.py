"""The GPU's idle time by gap length over the window (and, in HTML, utilization over time)."""

from __future__ import annotations

from typing import Any

from profkit.render.sections.table import text_table, trace_view
from profkit.units import gap_class, ns, pct

view = trace_view


def text(v: dict[str, Any]) -> list[str]:
    report = v["report"]
    gpu = report["gpu"]
    return ["GPU idle by gap size",
            text_table([{"class": k, **c} for k, c in report["gap_classes"].items()], {
                "gap size": lambda r: gap_class(r["class"]), "gaps": lambda r: r["count"],
                # idle summed over the GPUs: a share of their time (window x GPUs), as the gaps.*_idle_share facts
                "idle": lambda r: ns(r["idle_ns"]),
                "of window": lambda r: pct(r["idle_ns"] / max(1, gpu["busy_ns"] + gpu["idle_ns"])),
            }, 10)]
