"""The terminal view of `profkit diff` (default format)."""

from __future__ import annotations

from typing import Any

from profkit.escape import document, terminal
from profkit.units import clip, flag_value, metric_value, ns, pct

ARROW = {"better": "better", "worse": "WORSE", "within noise": "within noise", "same": "same", "changed": "changed"}


def change_text(row: dict[str, Any]) -> str:
    if row["change_pct"] is None:
        return "-" if row["change"] == 0 else "from 0"
    return f"{row['change_pct']:+.1f}%"


def _side(label: str, side: dict[str, Any]) -> str:
    win = side["window"]
    window = f"window {ns(win['duration_ns'])} ({win['how']})" if win else "no trace (evidence only)"
    runs = f"{side['runs']} runs" if side["runs"] > 1 else "1 run"
    return f"  {label}: {terminal(side['spec'])} - {runs}, {window}, GPU {terminal(side['gpu'] or '?')}"


def render_diff_text(doc: dict[str, Any], top: int = 10) -> str:
    out = ["profkit diff", _side("before", doc["before"]), _side("after ", doc["after"]), "",
           terminal(doc["verdict"]), ""]
    comp = doc["comparability"]
    if comp["differs"]:
        out += ["Not comparable: " + terminal("; ".join(comp["differs"])), ""]
    out.append(f"vLLM outcome and headline facts (noise: {doc['noise']['how']})")
    width = max([len(r["name"]) for r in doc["metrics"]] + [6])
    out.append(f"  {'metric':{width}}  {'before':>12}  {'after':>12}  {'change':>9}  {'noise':>7}  verdict")
    for r in doc["metrics"]:
        noise = f"{r['threshold_pct']:.1f}%" + ("" if r["noise"] == "measured" else "*")
        out.append(f"  {r['name']:{width}}  {metric_value(r['name'], r['before']):>12}  "
                   f"{metric_value(r['name'], r['after']):>12}  {change_text(r):>9}  {noise:>7}  {ARROW[r['verdict']]}")
    if any(r["noise"] == "assumed" for r in doc["metrics"]):
        out.append("  * assumed, not measured (one run per side)")
    out.append("")
    if doc["flags"]:
        out.append("Flags that differ")
        for f in doc["flags"]:
            out.append(f"  {terminal(f['flag'])}: {terminal(flag_value(f['before']))} -> "
                       f"{terminal(flag_value(f['after']))}")
        out.append("")
    fd = doc["findings"]
    out.append("Findings")
    for label, key in (("resolved", "resolved"), ("new", "new"), ("persisting", "persisting")):
        out.append(f"  {label}: {', '.join(fd[key]) if fd[key] else '-'}")
    for p in fd["details"]["persisting"]:
        ev = ", ".join(f"{e['fact']} {metric_value(e['fact'], e['before'])} -> {metric_value(e['fact'], e['after'])}"
                       for e in p["evidence"] if isinstance(e["before"], (int, float)))
        if ev:
            out.append(f"    {p['rule']}: {ev}")
    out.append("")
    gpu = doc.get("gpu")
    if gpu:
        w = gpu["windows"]
        out.append(f"GPU (windows {ns(w['before_ns'])} vs {ns(w['after_ns'])}: {w['compared']})")
        out.append(f"  utilization {pct(gpu['utilization']['before'])} -> {pct(gpu['utilization']['after'])}")
        for g in gpu["idle_by_gap_class"]:
            out.append(f"  idle in gaps {g['class'].replace('_', ' '):10} {pct(g['before_share'])} -> "
                       f"{pct(g['after_share'])} of the window")
        out.append("  time by category (share of window)")
        for c in gpu["categories"][:top]:
            out.append(f"    {c['category']:24} {pct(c['before_window_share'])} -> {pct(c['after_window_share'])}")
        k = gpu["kernels"]
        out.append(f"  kernels: {k['matched']} matched by name, {len(k['new'])} new, {len(k['vanished'])} vanished;"
                   " largest changes (share of window):")
        for r in k["rows"][:top]:
            out.append(f"    {pct(r['before_window_share']):>6} -> {pct(r['after_window_share']):>6}  {r['status']:8} "
                       f"{terminal(clip(r['name'], 80))}")
    return document("\n".join(out) + "\n")
