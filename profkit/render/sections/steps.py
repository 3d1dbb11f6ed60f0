"""vLLM's engine steps: their count, how busy the GPU was inside them and how long it waited for the host at their
starts, per kind of step (decode-only, with prompt tokens)."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal
from profkit.units import ns, pct

# Which steps the view counts, said where it is shown (the NVTX table counts ranges where they start: nvtx.WINDOW).
WINDOW = "each step that overlaps the window"


def view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    return report.get("steps") or None


def text(v: dict[str, Any]) -> list[str]:
    out = [f"Engine steps: {v['count']:,} ({terminal(v['source'])}; {WINDOW})",
           f"  GPU busy {pct(v['gpu_share'])} of step time; the GPU waited for the host at step starts "
           f"{pct(v['wait_share'])} of it (median wait {ns(v['wait_p50_ns'])})"]
    for label in ("decode", "prefill"):
        s = v[label]
        if s["count"]:
            out.append(f"  {label:8} {s['count']:>6,} steps  cycle p50 {ns(s['cycle_p50_ns'])}, p90 "
                       f"{ns(s['cycle_p90_ns'])}; GPU busy p50 {ns(s['gpu_busy_p50_ns'])} ({pct(s['gpu_share'])})")
    return out + [f"  left out: {n:,} {terminal(why)}" for why, n in (v.get("dropped") or {}).items()]
