"""`--format md`: a Markdown summary that pastes into a GitHub or Jira ticket."""

from __future__ import annotations

from typing import Any

import jinja2

from profkit import escape, units
from profkit.render.efficiency import PRECISION_NOTE, efficiency_view
from profkit.render.ranks import rank_table
from profkit.resources import shipped_dir


class CodeBlock(str):
    """Text for a fenced code block: printed as is (no Markdown escaping), backtick fences defused."""

    def __new__(cls, text: str) -> CodeBlock:
        return super().__new__(cls, str(text).replace("`", "'"))


def md_escape(value: Any) -> Any:
    """Every value a template prints is escaped: kernel names and NVTX text come from the trace."""
    if isinstance(value, CodeBlock):
        return str(value)
    if isinstance(value, str):
        return escape.markdown(value)
    return value


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(shipped_dir("templates"))),
        finalize=md_escape,
        autoescape=False,  # Markdown, not HTML: escaping is done by `finalize` above
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(ns=units.ns, pct=units.pct, size=units.size, clip=units.clip, safe_code=CodeBlock,
                       change_from=units.change_from, change_to=units.change_to,
                       zip=lambda a, b: list(zip(a, b, strict=True)))
    return env


def render_markdown(report: dict[str, Any], top: int = 10) -> str:
    return escape.document(environment().get_template("report.md.j2").render(
        r=report, top=top, ranks=rank_table(report), eff=efficiency_view(report), precision_note=PRECISION_NOTE))
