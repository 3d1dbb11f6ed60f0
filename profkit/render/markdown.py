"""`--format md`: a Markdown summary that pastes into a GitHub or Jira ticket."""

from __future__ import annotations

import re
from typing import Any

import jinja2

from profkit import escape, units
from profkit.render import cmdline
from profkit.render.sections import views
from profkit.render.sections.findings import PRECISION_NOTE
from profkit.render.sections.nvtx import NVTX_WINDOW
from profkit.render.sections.steps import WINDOW as STEPS_WINDOW
from profkit.resources import shipped_dir


class CodeBlock(str):
    """Lines of a fenced code block (commands a person pastes): printed as is, no Markdown escaping, so a command
    stays exact; each line made terminal-safe (no control, format or bidi character) and a fence at its start
    defused (only a line that opens with ``` can close the block)."""

    def __new__(cls, text: object) -> CodeBlock:
        return super().__new__(cls, "\n".join(_code_line(line) for line in str(text).split("\n")))


def _code_line(text: str) -> str:
    line = escape.terminal(text)
    body = line.lstrip(" ")
    if body.startswith("```") and len(line) - len(body) <= 3:
        run = len(body) - len(body.lstrip("`"))
        line = line[: len(line) - len(body)] + "'" * run + body[run:]
    return line


def code_line(value: object) -> CodeBlock:
    """One value as one line of a code block: a newline in it is a space (it never adds a line)."""
    return CodeBlock(escape.terminal(value))


def code_span(value: object) -> CodeBlock:
    """One value as inline code (a flag as written, outside a code block): terminal-safe, fenced by more backticks
    than it holds, its pipes escaped (a table's cell ends at one even inside code). Markdown does not read HTML or
    emphasis inside it."""
    text = escape.terminal(value).replace("|", "\\|")
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return InlineCode(f"{fence}{pad}{text}{pad}{fence}")


class InlineCode(CodeBlock):
    """Inline code, made safe by `code_span` (its fence is its own: not a code block's line to defuse)."""

    def __new__(cls, text: str) -> InlineCode:
        return str.__new__(cls, text)


def md_escape(value: Any) -> Any:
    """Every value a template prints is escaped: kernel names and NVTX text come from the trace."""
    if isinstance(value, CodeBlock):
        return str(value)
    if isinstance(value, str):
        return escape.markdown(value)
    return value


def environment(keep_trailing_newline: bool = False) -> jinja2.Environment:
    """Markdown's templates, every printed value escaped. `keep_trailing_newline`: a template's last newline is kept
    (the report's section templates, whose output follows one another)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(shipped_dir("templates"))),
        finalize=md_escape,
        autoescape=False,  # Markdown, not HTML: escaping is done by `finalize` above
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=keep_trailing_newline,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(ns=units.ns, pct=units.pct, size=units.size, clip=units.clip, safe_code=CodeBlock,
                       clip_middle=units.clip_middle,
                       code_line=code_line, code_span=code_span, change_from=units.change_from,
                       change_to=units.change_to,
                       check_name=cmdline.check_name,
                       gap_class=units.gap_class, number=units.number, zip=lambda a, b: list(zip(a, b, strict=True)))
    env.globals.update(precision_note=PRECISION_NOTE, nvtx_window=NVTX_WINDOW, steps_window=STEPS_WINDOW)
    return env


def render_markdown(report: dict[str, Any], top: int = 10) -> str:
    """The report's sections in their order (`render.sections`), each its template `sections/NAME.md.j2`."""
    return escape.document(environment(keep_trailing_newline=True).get_template("report.md.j2").render(
        r=report, top=top, views=views(report, top)))
