"""`profkit diff --format html`: one self-contained page (inline CSS and SVG, no script, no network)."""

from __future__ import annotations

from typing import Any

import jinja2

from profkit import escape, units
from profkit.render import html
from profkit.render.diff_text import change_text

ARROWS = {"better": "▲", "worse": "▼", "within noise": "≈", "same": "=", "changed": "↔"}


def render_diff_html(doc: dict[str, Any]) -> str:
    from profkit.render import charts  # matplotlib: only when drawing

    svgs = {}
    if doc.get("gpu"):
        svgs["categories"] = charts.delta_chart(doc["gpu"]["categories"], "category", "kernel time by category")
        if doc["gpu"]["kernels"]["rows"]:
            svgs["kernels"] = charts.delta_chart(doc["gpu"]["kernels"]["rows"], "name", "kernel time")
    svgs = {k: jinja2.filters.Markup(v) for k, v in svgs.items()}  # matplotlib escaped the labels
    env = html.environment()
    env.filters.update(metric=units.metric_value, change=change_text, flag=units.flag_value)
    return escape.document(env.get_template("diff.html.j2").render(d=doc, charts=svgs, arrows=ARROWS))
