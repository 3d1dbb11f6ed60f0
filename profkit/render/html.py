"""`--format html`: one self-contained file (inline CSS and SVG, no script, no network) for a ticket."""

from __future__ import annotations

from typing import Any

import jinja2

from profkit import escape, units
from profkit.render import charts, cmdline
from profkit.render.efficiency import PRECISION_NOTE, efficiency_view
from profkit.render.prescription import prescription_view
from profkit.render.ranks import rank_table
from profkit.render.text import NVTX_WINDOW, STEPS_WINDOW, host_notes, live_lines, preemptions_window
from profkit.resources import shipped_dir


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return "-" if v is None else str(v)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(shipped_dir("templates"))),
        autoescape=True,  # kernel names, NVTX text and file paths come from the trace: always escaped
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(ns=units.ns, pct=units.pct, size=units.size, clip=units.clip, value=_value,
                       clip_middle=units.clip_middle,
                       change_from=units.change_from, change_to=units.change_to, check_name=cmdline.check_name,
                       gap_class=units.gap_class,
                       number=units.number)
    return env


def render_html(report: dict[str, Any]) -> str:
    # Charts are made here, not in the template: a template never computes anything.
    pairs = cmdline.command_pairs(report)
    eff = efficiency_view(report)
    roofline = jinja2.filters.Markup(charts.roofline_chart(eff["chart"])) if eff and eff["chart"] else ""
    if report.get("gpu") is None:  # evidence only: no trace, no charts but the roofline
        return _page(report, {"roofline": roofline}, pairs, eff)
    svgs = {
        "timeline": charts.timeline_chart(report),
        "categories": charts.category_chart(report) if report["categories"] else "",
        "kernels": charts.top_kernels_chart(report) if report["kernels"] else "",
        "memops": charts.memops_chart(report) if report["memops"] else "",
        "api": charts.api_chart(report) if report["api"] else "",
        "steps": charts.steps_chart(report) if report.get("steps") else "",
        "ranks": charts.ranks_chart(report) if report.get("ranks") else "",
    }
    svgs = {k: jinja2.filters.Markup(v) for k, v in svgs.items()}  # matplotlib escaped the labels
    return _page(report, {**svgs, "roofline": roofline}, pairs, eff)


def _page(report: dict[str, Any], svgs: dict[str, Any], pairs: list[dict[str, Any]],
          eff: dict[str, Any] | None) -> str:
    page = environment().get_template("report.html.j2").render(r=report, charts=svgs, commands=pairs,
                                                                  ranks=rank_table(report), eff=eff,
                                                                  precision_note=PRECISION_NOTE,
                                                                  pv=prescription_view(report),
                                                                  live=live_lines(report),
                                                                  preempt_where=preemptions_window(report),
                                                                  nvtx_window=NVTX_WINDOW, steps_window=STEPS_WINDOW,
                                                                  host_notes=host_notes(report.get("host") or {}))
    return escape.document(page)  # trace strings may carry control characters; no HTML needs them
