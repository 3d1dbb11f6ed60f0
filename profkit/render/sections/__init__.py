"""The report's sections as every format shows them, in one order: each a module with `view(report, top)` (the
section's values, formatted once; None: the report has nothing for it) and `text(view)` (its terminal lines), and
two templates, `templates/sections/NAME.md.j2` and `NAME.html.j2`, which place the view's values (`v`).

Adding an analysis to the report is three edits: its function (analysis/), its field (`analysis.sections.Sections`
or the report), and its view here (the module, its two templates, its place in ORDER)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from profkit.render.sections import (
    api,
    categories,
    command,
    cpu_ops,
    efficiency,
    facts,
    findings,
    frontier,
    gaps,
    header,
    host,
    kernels,
    memops,
    nvtx,
    prescription,
    ranks,
    sched,
    skipped,
    steps,
    timeline,
)

ORDER: tuple[tuple[str, ModuleType], ...] = (
    ("header", header), ("prescription", prescription), ("frontier", frontier), ("findings", findings),
    ("command", command), ("efficiency", efficiency), ("ranks", ranks), ("steps", steps), ("host", host),
    ("sched", sched), ("skipped", skipped), ("categories", categories), ("kernels", kernels),
    ("timeline", timeline), ("gaps", gaps), ("memops", memops), ("api", api), ("nvtx", nvtx), ("cpu_ops", cpu_ops),
    ("facts", facts),
)
SECTIONS = dict(ORDER)


def views(report: dict[str, Any], top: int = 10) -> list[tuple[str, Any]]:
    """(name, view) of each section the report has, in ORDER."""
    return [(name, v) for name, module in ORDER if (v := module.view(report, top)) is not None]


def text_lines(report: dict[str, Any], top: int = 10) -> list[str]:
    """The terminal's report: each section's lines, a blank line between sections."""
    blocks = [SECTIONS[name].text(v) for name, v in views(report, top)]
    return [line for i, block in enumerate(b for b in blocks if b) for line in ([""] if i else []) + block]
