"""Inline SVG charts for the HTML report, drawn by matplotlib (Agg-free SVG backend, text kept as text).

Each function takes report sections and returns an `<svg>` string. matplotlib escapes every label
it writes into the SVG, so kernel names from the trace stay text.
"""

from __future__ import annotations

import io
import logging
from typing import Any

import matplotlib

matplotlib.use("svg")  # no display, no raster backend needed
# The SVG backend looks up the math fonts it embeds once per process and logs each family a slim install lacks;
# text stays text (svg.fonttype none) and falls back to DejaVu Sans, so the lines say nothing to the reader.
logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)

import matplotlib.pyplot as plt  # noqa: E402

from profkit.units import clip, clip_middle, ns, pct  # noqa: E402

plt.rcParams.update({
    "svg.fonttype": "none",  # text stays <text>: smaller files, selectable, searchable
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.hashsalt": "profkit",  # deterministic ids: the same report renders the same bytes
})
BUSY, IDLE, ACCENT = "#2b7bb9", "#e4572e", "#76b041"
PHASE_COLORS = ("#8e44ad", "#d4a017")


def _svg(fig: plt.Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype: the SVG is inlined in HTML


def timeline_chart(report: dict[str, Any]) -> str:
    """GPU busy fraction over the window, per device, with the listed gaps marked."""
    t = report["timeline"]
    width = t["bucket_ns"]
    fig, ax = plt.subplots(figsize=(9, 2.4))
    for device, series in t["busy_fraction"].items():
        xs = [(i + 0.5) * width / 1e6 for i in range(len(series))]
        ax.fill_between(xs, [100 * v for v in series], step="mid", alpha=0.35, color=BUSY)
        ax.step(xs, [100 * v for v in series], where="mid", color=BUSY, linewidth=1, label=f"GPU {device} busy")
    for g in report["gaps"][:20]:
        start = (g["start_ns"] - report["window"]["start_ns"]) / 1e6
        ax.axvspan(start, start + g["duration_ns"] / 1e6, color=IDLE, alpha=0.25, linewidth=0)
    ax.set_ylim(0, 105)
    ax.set_xlim(0, report["window"]["duration_ns"] / 1e6)
    ax.set_ylabel("busy %")
    ax.set_xlabel(f"ms into the window (buckets of {ns(width)}; red: longest gaps)")
    ax.legend(loc="lower right", frameon=False)
    return _svg(fig)


def _barh(labels: list[str], values: list[float], xlabel: str, color: str = BUSY,
          annotate: list[str] | None = None) -> str:
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(labels) + 0.8))
    ypos = list(range(len(labels)))[::-1]
    ax.barh(ypos, values, color=color)
    ax.set_yticks(ypos, labels, parse_math=False)  # trace text: a kernel named $x^$ is no TeX
    ax.set_xlabel(xlabel)
    for y, v, text in zip(ypos, values, annotate or [], strict=False):
        ax.text(v, y, " " + text, va="center", fontsize=8, parse_math=False)
    return _svg(fig)


def ranks_chart(report: dict[str, Any]) -> str:
    """Per GPU (rank): compute kernel time, communication kernel time, idle time; stacked bars."""
    ranks = report["ranks"]
    labels = [f"rank {r['rank']}" for r in ranks]
    comm = [r["communication"]["total_ns"] / 1e6 for r in ranks]
    compute = [(r["kernels"]["total_ns"] - r["communication"]["total_ns"]) / 1e6 for r in ranks]
    idle = [(r["gpu"]["idle_ns"] or 0) / 1e6 for r in ranks]
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(labels) + 1.0))
    ypos = list(range(len(labels)))[::-1]
    ax.barh(ypos, compute, color=BUSY, label="compute kernels")
    ax.barh(ypos, comm, left=compute, color=ACCENT, label="communication kernels")
    ax.barh(ypos, idle, left=[a + b for a, b in zip(compute, comm, strict=True)], color=IDLE, alpha=0.5,
            label="GPU idle")
    ax.set_yticks(ypos, labels, parse_math=False)  # trace text: a kernel named $x^$ is no TeX
    ax.set_xlabel("ms (kernel time per kind; concurrent kernels each count)")
    ax.legend(loc="lower right", frameon=False, fontsize=8)
    return _svg(fig)


def category_chart(report: dict[str, Any]) -> str:
    cats = report["categories"]
    return _barh([c["category"] for c in cats], [c["total_ns"] / 1e6 for c in cats], "kernel time (ms)",
                 annotate=[pct(c["share"]) for c in cats])  # no kernel time at all: no share


def top_kernels_chart(report: dict[str, Any], top: int = 12) -> str:
    ks = report["kernels"][:top]
    return _barh([clip_middle(k.get("label") or k["short_name"], 60) for k in ks], [k["total_ns"] / 1e6 for k in ks],
                 "total time (ms)",
                 annotate=[f"{k['count']}x, {ns(k['avg_ns'])} avg" for k in ks])


def memops_chart(report: dict[str, Any]) -> str:
    ops = report["memops"]
    return _barh([o["operation"] for o in ops], [o["total_ns"] / 1e6 for o in ops], "GPU time (ms)",
                 color=ACCENT, annotate=[_bandwidth(o) for o in ops])


def _bandwidth(op: dict[str, Any]) -> str:
    bw = op.get("bandwidth_gbps")
    return f"{op['count']} ops, {op['bytes'] / 1e6:.3g} MB" + (f", {bw:.1f} GB/s" if bw else "")


def api_chart(report: dict[str, Any], top: int = 10) -> str:
    api = report["api"][:top]
    return _barh([a["name"] for a in api], [a["total_ns"] / 1e6 for a in api], "host time in call (ms)",
                 color="#9b59b6", annotate=[f"{a['count']} calls" for a in api])


def delta_chart(rows: list[dict[str, Any]], key: str, title: str, limit: int = 12) -> str:
    """Before/after bars of the rows that moved most (share of each side's window), for the diff page."""
    rows = rows[:limit][::-1]
    labels = [clip(str(r[key]), 60) for r in rows]
    before = [100 * (r["before_window_share"] or 0) for r in rows]
    after = [100 * (r["after_window_share"] or 0) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 0.9))
    ys = range(len(rows))
    ax.barh([y + 0.2 for y in ys], before, height=0.38, color="#9aa5b8", label="before")
    ax.barh([y - 0.2 for y in ys], after, height=0.38, color=BUSY, label="after")
    ax.set_yticks(list(ys), labels, parse_math=False)
    ax.set_xlabel(f"{title}: % of each side's window")
    ax.legend(loc="lower right", frameon=False)
    return _svg(fig)


def trajectory_chart(doc: dict[str, Any]) -> str:
    """The objective of every step of a tune run; kept steps (and the baseline) in colour, reverted grey."""
    steps = [s for s in doc["steps"] if s["objective"] is not None]
    fig, ax = plt.subplots(figsize=(9, 2.8))
    best_line: list[Any] = []
    best = None
    for s in steps:
        kept = s["decision"] in ("keep", "baseline")
        if kept:
            best = s["objective"]
        best_line.append(best)
        for r in s["runs"]:
            if r["objective"] is not None:
                ax.plot(s["step"], r["objective"], "o", color=ACCENT if kept else "#9aa5b8", markersize=4)
        ax.bar(s["step"], s["objective"], width=0.6, color=ACCENT if kept else "#d5dae3", alpha=0.6)
    ax.step([s["step"] for s in steps], best_line, where="post", color=BUSY, linewidth=1.5, label="best so far")
    ax.set_xticks([s["step"] for s in steps], [f"{s['step']}\n{s['kind']}" for s in steps])
    ax.set_ylabel(clip(doc["objective"]["name"], 30))
    ax.legend(loc="lower right", frameon=False)
    return _svg(fig)


def steps_chart(report: dict[str, Any]) -> str:
    """Each engine step's cycle time and the GPU busy time inside it (prefill-bearing steps marked)."""
    series = report["steps"]["series"]
    xs = list(range(len(series)))
    fig, ax = plt.subplots(figsize=(9, 2.6))
    ax.bar(xs, [s["cycle_ns"] / 1e6 for s in series], width=1.0, color="#d5dae3", label="step cycle")
    ax.bar(xs, [s["gpu_busy_ns"] / 1e6 for s in series], width=1.0,
           color=[ACCENT if s["prefill"] else BUSY for s in series], label="GPU busy (green: prefill steps)")
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.set_xlabel("engine step (in order)")
    ax.legend(loc="upper right", frameon=False)
    return _svg(fig)


def roofline_chart(chart: dict[str, Any]) -> str:
    """The GPU's roofline (attainable TFLOP/s = min(compute peak, bandwidth x FLOP/byte), bf16 and fp8 roofs)
    with the run's achieved point from each estimate, log-log."""
    bw = chart["bandwidth_tbs"]
    xs_points = [p["intensity"] for p in chart["points"]]
    top = max(r["tflops"] for r in chart["roofs"])
    lo = min([1.0, *(x / 4 for x in xs_points)])
    hi = max([4 * top / bw, *(4 * x for x in xs_points)])
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for roof, style in zip(chart["roofs"], ("-", "--"), strict=False):
        ridge = roof["tflops"] / bw
        ax.plot([lo, ridge, hi], [bw * lo, roof["tflops"], roof["tflops"]], style, color=BUSY, linewidth=1.2,
                label=f"{roof['label']} roof ({roof['tflops']:,.0f} TFLOP/s, {bw:g} TB/s)")
    # the run's estimates as dots, each phase of the engine steps as a square
    runs, phases = iter((IDLE, ACCENT)), iter(PHASE_COLORS)
    for point in chart["points"]:
        marker, color = ("s", next(phases, BUSY)) if point.get("phase") else ("o", next(runs, BUSY))
        ax.plot([point["intensity"]], [point["tflops"]], marker, color=color, markersize=7,
                label=f"{point['label']}: {point['tflops']:,.0f} TFLOP/s at {point['intensity']:,.0f} FLOP/B")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("TFLOP/s")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=7)  # beside: off the roofs
    return _svg(fig)


def frontier_chart(curves: dict[str, list[dict[str, Any]]]) -> str:
    """p99 TPOT and p99 TTFT against the request rate served, as run and prescribed (the predicted frontier)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
    for side, color, label in (("before", IDLE, "as run"), ("after", BUSY, "prescribed")):
        points = [p for p in curves[side] if p["rate"] is not None]
        xs = [p["served"] for p in points]
        for ax, key in zip(axes, ("tpot_p99", "ttft_p99"), strict=True):
            ax.plot(xs, [p[key] for p in points], marker="o", color=color, label=label, linewidth=1.2)
    for ax, title in zip(axes, ("p99 TPOT (ms)", "p99 TTFT (ms)"), strict=True):
        ax.set_xlabel("requests/s served")
        ax.set_ylabel(title)
    axes[0].legend(loc="upper left", frameon=False)
    fig.tight_layout()
    return _svg(fig)
