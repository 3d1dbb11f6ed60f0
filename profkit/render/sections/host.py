"""The host side from capture's samples (host.json): each process's CPU over the benchmark (a Python process tops out
at one core), NVML's GPU utilization, and what was left out of the samples."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal
from profkit.render.sections.table import text_table
from profkit.units import clip, pct


def view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    host = report.get("host")
    if not host:
        return None
    notes = host_notes(host)
    if not (host.get("processes") or notes or host.get("gpu_util_mean") is not None):
        return None
    return {"host": host, "notes": notes}


def text(v: dict[str, Any]) -> list[str]:
    host = v["host"]
    out = [f"Host CPU while the benchmark ran (cores used; {host.get('cores') or '?'} cores; a Python process "
           "tops out at 1.0)"]
    rows = sorted(host["processes"], key=lambda p: -p["cpu_mean"])[:8]
    out.append(text_table(rows, {"role": lambda r: r["role"], "pid": lambda r: r["pid"],
                                 "mean": lambda r: f"{r['cpu_mean']:.2f}", "p90": lambda r: f"{r['cpu_p90']:.2f}",
                                 "at a full core": lambda r: pct(r["saturated_share"]),
                                 "process": lambda r: clip(terminal(r["name"]), 60)}, 8))
    if host.get("gpu_util_mean") is not None:
        out.append(f"  GPU utilization (NVML): {pct(host['gpu_util_mean'])}")
    return out + [f"  {terminal(line)}" for line in v["notes"]]


def host_notes(host: dict[str, Any]) -> list[str]:
    """What the host section left out of host.json and why, and a window it could not place (every format)."""
    out = [f"left out: {n:,} {why}" for why, n in (host.get("left_out") or {}).items()]
    return out + [host[k] for k in ("window_note", "coverage_note", "worker_note", "drain_note") if host.get(k)]
