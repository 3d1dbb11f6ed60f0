"""The package's shape, held: the model's and the report's functions fit on a screen (80 lines), and every report
section has its view, its text, and its two templates, in the one declared order (adding an analysis is its
function, its field and its view: docs/design.md)."""

from __future__ import annotations

import ast
from pathlib import Path

from profkit.render.sections import ORDER

REPO = Path(__file__).resolve().parent.parent
LIMIT = 80


def test_no_function_in_model_or_report_is_over_80_lines() -> None:
    long = []
    for folder in ("model", "report"):
        for path in sorted((REPO / "profkit" / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > LIMIT:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long


def test_every_section_has_its_view_text_and_templates() -> None:
    names = [name for name, _ in ORDER]
    assert len(set(names)) == len(names)
    for name, module in ORDER:
        assert callable(module.view) and callable(module.text), name
        for fmt in ("md", "html"):
            assert (REPO / "templates" / "sections" / f"{name}.{fmt}.j2").is_file(), (name, fmt)
    on_disk = {p.name.split(".")[0] for p in (REPO / "templates" / "sections").glob("*.j2")}
    assert on_disk == set(names)  # no template of a section that is not in the order
