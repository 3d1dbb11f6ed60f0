"""The terminal summary of `profkit report` (default format): the report's sections in their order
(`render.sections`). Every value from a trace, log, rule file or path goes through profkit.escape.terminal: one
value, one line, no escape sequence."""

from __future__ import annotations

from typing import Any

from profkit.escape import document
from profkit.render.sections import text_lines


def render_text(report: dict[str, Any], top: int = 10) -> str:
    return document("\n".join(text_lines(report, top)) + "\n")
