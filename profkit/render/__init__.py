"""Rendering: `render(doc, fmt, top)`, the one entry for every document profkit prints, keyed on its schema.

Which function renders which (document kind, format) is listed once, here. Modules are imported when a
document is rendered, not before: the HTML renderers pull in matplotlib, which a text or JSON output never
needs. Like `profkit.units` and `profkit.escape`, rendering imports no stage (cli, tune, compare, report,
capture, diagnose, analysis, evidence, traces): it reads documents only.
"""

from __future__ import annotations

from typing import Any

from profkit.errors import ProfkitError

SCHEMAS = {"profkit.report/1": "report", "profkit.diff/1": "diff", "profkit.diff/2": "diff",
           "profkit.tune/1": "tune", "profkit.history/1": "history", "profkit.prediction/1": "prediction",
           "profkit.sweep-diff/1": "sweep-diff"}

# (kind, format) -> (module, function, takes `top`); a kind's formats in the order its errors list them.
RENDERERS: dict[tuple[str, str], tuple[str, str, bool]] = {
    ("report", "text"): ("profkit.render.text", "render_text", True),
    ("report", "json"): ("profkit.render.json", "render_json", False),
    ("report", "md"): ("profkit.render.markdown", "render_markdown", True),
    ("report", "html"): ("profkit.render.html", "render_html", True),
    ("diff", "text"): ("profkit.render.diff", "render_diff_text", True),
    ("diff", "json"): ("profkit.render.json", "render_json", False),
    ("diff", "md"): ("profkit.render.diff", "render_diff_markdown", True),
    ("diff", "html"): ("profkit.render.diff", "render_diff_html", False),
    ("tune", "text"): ("profkit.render.tune", "render_tune_text", False),
    ("tune", "md"): ("profkit.render.tune", "render_tune_markdown", False),
    ("tune", "html"): ("profkit.render.tune", "render_tune_html", False),
    ("history", "text"): ("profkit.render.history", "render_history_text", False),
    ("history", "json"): ("profkit.render.json", "render_json", False),
    ("history", "md"): ("profkit.render.history", "render_history_markdown", False),
    ("prediction", "text"): ("profkit.render.prediction", "render_prediction_text", False),
    ("prediction", "json"): ("profkit.render.json", "render_json", False),
    ("prediction", "md"): ("profkit.render.prediction", "render_prediction_markdown", False),
    ("prediction", "html"): ("profkit.render.prediction", "render_prediction_html", False),
    ("sweep-diff", "text"): ("profkit.render.sweep", "sweep_diff_text", False),
    ("sweep-diff", "json"): ("profkit.render.json", "render_json", False),
    ("sweep-diff", "md"): ("profkit.render.sweep", "sweep_diff_markdown", False),
}


def formats(kind: str) -> list[str]:
    return [f for k, f in RENDERERS if k == kind]


# A file's extension says its format; any other extension (or none) is read as text.
FORMAT_OF_SUFFIX = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".json": "json", ".txt": "text"}


def output_format(fmt: str | None, path: str | None) -> str:
    """The format to write: `fmt` as given, else the one `path`'s extension says (text without a path or a known
    extension). An explicit format that disagrees with a known extension is refused (ProfkitError)."""
    suffix = ("." + path.rsplit(".", 1)[1].lower()) if path and "." in path.rsplit("/", 1)[-1] else ""
    implied = FORMAT_OF_SUFFIX.get(suffix)
    if fmt is None:
        return implied or "text"
    if implied is not None and implied != fmt:
        raise ProfkitError(f"--format {fmt} disagrees with {path}'s extension ({suffix} is {implied}): "
                           f"drop --format, or name the file for {fmt}")
    return fmt


def render(doc: Any, fmt: str, top: int = 10) -> str:
    """The document as text, json, md or html (those its kind has); `top`: rows per table where it applies.
    A document may be a dict, a msgspec Struct, or a report (what its `document()` gives)."""
    import importlib

    if hasattr(doc, "document"):  # a report keeps its sections apart; its document holds them at the top
        doc = doc.document()
    if not isinstance(doc, dict):
        import msgspec

        doc = msgspec.to_builtins(doc)
    schema = doc.get("schema")
    kind = SCHEMAS.get(schema) if isinstance(schema, str) else None
    if kind is None:
        raise ProfkitError(f"cannot render a document of schema {schema!r} (renders {', '.join(SCHEMAS)})")
    if (kind, fmt) not in RENDERERS:
        known = formats(kind)
        raise ProfkitError(f"unknown {kind} format {fmt!r} ({', '.join(known[:-1])} or {known[-1]})")
    module, name, takes_top = RENDERERS[(kind, fmt)]
    fn = getattr(importlib.import_module(module), name)
    return fn(doc, top=top) if takes_top else fn(doc)
