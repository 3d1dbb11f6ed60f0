"""`profkit diff` (`profkit.diff/1` and `/2`): the terminal view (default), Markdown for a ticket (every value
escaped) and one self-contained HTML page (inline CSS and SVG, no script, no network); and the verdict line all
three print, written here from the document's own rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from profkit.escape import document, terminal
from profkit.units import VERDICT_WORDS, clip_middle, gap_class, is_share, metric_value, ns, pct, sourced_value

ARROW = VERDICT_WORDS
QUIET_MARKS = {"within noise": "≈", "same": "="}


def arrow(row: dict[str, Any]) -> str:
    """Which way the number moved (▲ up, ▼ down), whatever that means for the run: the verdict says better or
    worse (a TTFT that fell 44 % reads ▼ -44.3 %, better)."""
    if row["verdict"] in QUIET_MARKS:
        return QUIET_MARKS[row["verdict"]]
    before, after = row.get("before"), row.get("after")
    if before is None or after is None or before == after:
        return "↔"
    return "▲" if after > before else "▼"

# The metrics the verdict line names, in its order.
VERDICT_METRICS = ("request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                   "vllm.preemptions", "gpu.utilization")


def flag_side(row: dict[str, Any], side: str) -> str:
    """A differing flag's value on one side of a diff, worded as a report's change is (`auto (vLLM 0.26 default)`)."""
    return sourced_value(row.get(side), row.get(f"{side}_source"))


def verdict_sentence(doc: dict[str, Any]) -> str:
    """One line a ticket can quote: what moved beyond noise, what was resolved, which flags, and caveats; from
    the diff's metrics, flags, findings, noise and comparability (a recorded profkit.diff/1 reads the same)."""
    by = {r["name"]: r for r in doc["metrics"]}
    moved, quiet = [], []
    for name in VERDICT_METRICS:
        r = by.get(name)
        if r is None:
            continue
        if r["verdict"] in ("better", "worse", "changed"):
            pct = r["change_pct"]
            change = change_text(r) if is_share(name) else \
                f"{pct:+.0f} %" if pct is not None else f"{r['before']:g} -> {r['after']:g}"
            moved.append(f"{name} {change} ({ARROW[r['verdict']]})")
        elif r["verdict"] == "within noise":
            quiet.append(name)
    findings, flags, noise, comp = doc["findings"], doc["flags"], doc["noise"], doc["comparability"]
    # comparability first: a reader who stops after ten words must not miss that the sides differ
    parts = ["NOT COMPARABLE: " + "; ".join(comp["differs"])] if comp["differs"] else []
    parts.append("AFTER: " + ("; ".join(moved) if moved else "no change beyond noise"))
    if quiet:
        parts.append("within noise: " + ", ".join(quiet))
    if findings["resolved"]:
        parts.append("resolved: " + ", ".join(findings["resolved"]))
    if findings["new"]:
        parts.append("new: " + ", ".join(findings["new"]))
    if flags:
        parts.append("flags: " + ", ".join(f"{f['flag']} {flag_side(f, 'before')} -> {flag_side(f, 'after')}"
                                           for f in flags))
    n = noise["replicates"]
    parts.append(f"noise: {noise['measured_pct']:.1f} % on {noise['measured_metric']} measured over {n[0]}+{n[1]} "
                 "runs" if noise["measured_pct"] is not None else f"noise: {noise['assumed_pct']:g} % assumed "
                                                                   "(single runs)")
    if not comp["differs"] and comp["unknown"]:
        parts.append("comparability unknown for " + ", ".join(comp["unknown"]))
    return "; ".join(parts)


def change_text(row: dict[str, Any]) -> str:
    """A metric's change: a share moves in points (0.1% -> 1.8% is +1.7 pts, not +1137.5%), anything else in %."""
    if is_share(row["name"]) and row.get("before") is not None and row.get("after") is not None:
        return f"{(row['after'] - row['before']) * 100:+.1f} pts"
    if row["change_pct"] is None:
        return "-" if row["change"] == 0 else "from 0"
    return f"{row['change_pct']:+.1f}%"


def runs_read(side: dict[str, Any]) -> str:
    """How many runs a side read and, for a folder of capture folders, which (any folder that is one counts as a
    replicate: named, so a stray one shows)."""
    runs = f"{side['runs']} runs" if side["runs"] > 1 else "1 run"
    spec = Path(side["spec"])
    names = [Path(s).name for s in side.get("sources") or [] if Path(s).parent == spec]
    if not names:
        return runs
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return f"{runs}: {shown}"


def _side(label: str, side: dict[str, Any]) -> str:
    win = side["window"]
    window = f"window {ns(win['duration_ns'])} ({terminal(win['how'])})" if win else "no trace (evidence only)"
    return f"  {label}: {terminal(side['spec'])} - {terminal(runs_read(side))}, {window}, " \
           f"GPU {terminal(side['gpu'] or '?')}"


def render_diff_text(doc: dict[str, Any], top: int = 10) -> str:
    out = ["profkit diff", _side("before", doc["before"]), _side("after ", doc["after"]), "",
           terminal(verdict_sentence(doc)), ""]
    comp = doc["comparability"]
    if comp["differs"]:
        out += ["Not comparable: " + terminal("; ".join(comp["differs"])), ""]
    out.append(f"vLLM outcome and headline facts (noise: {terminal(doc['noise']['how'])})")
    width = max([len(terminal(r["name"])) for r in doc["metrics"]] + [6])
    out.append(f"  {'metric':{width}}  {'before':>12}  {'after':>12}  {'change':>9}  {'noise':>7}  verdict")
    for r in doc["metrics"]:
        noise = f"{r['threshold_pct']:.1f}%" + ("" if r["noise"] == "measured" else "*")
        out.append(f"  {terminal(r['name']):{width}}  {metric_value(r['name'], r['before']):>12}  "
                   f"{metric_value(r['name'], r['after']):>12}  {change_text(r):>9}  {noise:>7}  {ARROW[r['verdict']]}")
    if any(r["noise"] == "assumed" for r in doc["metrics"]):
        out.append("  * assumed, not measured (one run per side)")
    out.append("")
    if doc["flags"]:
        out.append("Flags that differ")
        for f in doc["flags"]:
            out.append(f"  {terminal(f['flag'])}: {terminal(flag_side(f, 'before'))} -> "
                       f"{terminal(flag_side(f, 'after'))}")
        out.append("")
    fd = doc["findings"]
    out.append("Findings")
    for label, key in (("resolved", "resolved"), ("new", "new"), ("persisting", "persisting")):
        out.append(f"  {label}: {terminal(', '.join(fd[key])) if fd[key] else '-'}")
    for p in fd["details"]["persisting"]:
        ev = ", ".join(f"{e['fact']} {metric_value(e['fact'], e['before'])} -> {metric_value(e['fact'], e['after'])}"
                       for e in p["evidence"] if isinstance(e["before"], (int, float)))
        if ev:
            out.append(f"    {terminal(p['rule'])}: {terminal(ev)}")
    out.append("")
    gpu = doc.get("gpu")
    if gpu:
        w = gpu["windows"]
        out.append(f"GPU (windows {ns(w['before_ns'])} vs {ns(w['after_ns'])}: {terminal(w['compared'])})")
        out.append(f"  utilization {pct(gpu['utilization']['before'])} -> {pct(gpu['utilization']['after'])}")
        for g in gpu["idle_by_gap_class"]:
            out.append(f"  idle in gaps {gap_class(g['class']):12} {pct(g['before_share'])} -> "
                       f"{pct(g['after_share'])} of the window")
        out.append("  time by category (share of window)")
        for c in gpu["categories"][:top]:
            out.append(f"    {terminal(c['category']):24} {pct(c['before_window_share'])} -> "
                       f"{pct(c['after_window_share'])}")
        k = gpu["kernels"]
        out.append(f"  kernels: {k['matched']} matched by name, {len(k['new'])} new, {len(k['vanished'])} vanished;"
                   " largest changes (share of window):")
        for r in k["rows"][:top]:
            out.append(f"    {pct(r['before_window_share']):>6} -> {pct(r['after_window_share']):>6}  {r['status']:8} "
                       f"{terminal(clip_middle(r.get('label') or r['name'], 80))}")
    return document("\n".join(out) + "\n")


def render_diff_markdown(doc: dict[str, Any], top: int = 10) -> str:
    from profkit.render import markdown

    env = markdown.environment()
    env.filters.update(metric=metric_value, change=change_text, flag_side=flag_side, gap_class=gap_class,
                       word=lambda v: ARROW.get(v, v), runs_read=runs_read)
    return document(env.get_template("diff.md.j2").render(d=doc, verdict=verdict_sentence(doc), top=top))


def render_diff_html(doc: dict[str, Any]) -> str:
    import jinja2

    from profkit.render import charts, html  # matplotlib: only when drawing

    svgs = {}
    if doc.get("gpu"):
        svgs["categories"] = charts.delta_chart(doc["gpu"]["categories"], "category", "kernel time by category")
        if doc["gpu"]["kernels"]["rows"]:
            svgs["kernels"] = charts.delta_chart(
                [{**r, "name": r.get("label") or r["name"]} for r in doc["gpu"]["kernels"]["rows"]], "name",
                "kernel time")
    svgs = {k: jinja2.filters.Markup(v) for k, v in svgs.items()}  # matplotlib escaped the labels
    env = html.environment()
    env.filters.update(metric=metric_value, change=change_text, flag_side=flag_side, gap_class=gap_class,
                       arrow=arrow, word=lambda v: ARROW.get(v, v), runs_read=runs_read)
    return document(env.get_template("diff.html.j2").render(d=doc, verdict=verdict_sentence(doc), charts=svgs))
