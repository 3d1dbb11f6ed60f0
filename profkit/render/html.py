"""`--format html`: one self-contained file (inline CSS and SVG, no script, no network) for a ticket."""

from __future__ import annotations

import math
from typing import Any

import jinja2

from profkit import escape, units
from profkit.render import charts, cmdline
from profkit.render.sections import views
from profkit.render.sections.findings import PRECISION_NOTE
from profkit.render.sections.nvtx import NVTX_WINDOW
from profkit.render.sections.steps import WINDOW as STEPS_WINDOW
from profkit.resources import shipped_dir


def _value(v: Any) -> str:
    """A fact's value: whole and large numbers thousands-separated like the counts beside them (not 2346 or
    1.024e+05), others to 4 significant figures."""
    if isinstance(v, float):
        if math.isfinite(v) and (abs(v) >= 1000 or v.is_integer()):
            return f"{v:,.0f}"
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
    env.globals.update(precision_note=PRECISION_NOTE, nvtx_window=NVTX_WINDOW, steps_window=STEPS_WINDOW)
    return env


def render_html(report: dict[str, Any], top: int = 10) -> str:
    """The report's sections in their order (`render.sections`), each its template `sections/NAME.html.j2`, with the
    charts drawn here (a template never computes anything)."""
    sections = views(report, top)
    eff = dict(sections).get("efficiency")
    front = dict(sections).get("frontier")
    svgs = {"roofline": charts.roofline_chart(eff["chart"]) if eff and eff["chart"] else "",
            "frontier": charts.frontier_chart(front["curves"]) if front else ""}
    if report.get("gpu") is not None:  # evidence only: no trace, no charts but the roofline
        svgs.update({
            "timeline": charts.timeline_chart(report),
            "categories": charts.category_chart(report) if report["categories"] else "",
            "kernels": charts.top_kernels_chart(report) if report["kernels"] else "",
            "memops": charts.memops_chart(report) if report["memops"] else "",
            "api": charts.api_chart(report) if report["api"] else "",
            "steps": charts.steps_chart(report) if report.get("steps") else "",
            "ranks": charts.ranks_chart(report) if report.get("ranks") else "",
        })
    markup = {k: jinja2.filters.Markup(v) for k, v in svgs.items()}  # matplotlib escaped the labels
    page = environment().get_template("report.html.j2").render(r=report, charts=markup, views=sections)
    return escape.document(page)  # trace strings may carry control characters; no HTML needs them
