"""`profkit diff --format md`: the comparison for a GitHub or Jira ticket (every value escaped)."""

from __future__ import annotations

from typing import Any

from profkit import escape, units
from profkit.render import markdown
from profkit.render.diff_text import change_text


def render_diff_markdown(doc: dict[str, Any], top: int = 10) -> str:
    env = markdown.environment()
    env.filters.update(metric=units.metric_value, change=change_text, flag=units.flag_value)
    return escape.document(env.get_template("diff.md.j2").render(d=doc, top=top))
