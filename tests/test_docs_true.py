"""Words that stay true to the code: every module path (`analysis/scans.py`) and dotted name (`profkit.model.predict`)
the docs, the README and profkit's own docstrings and comments name must exist; a page that lists the normalized
trace's columns is generated from traces/schema.py (scripts/make_docs.py --check). A move that leaves a name behind
fails here, as `CaptureFolder in capture/` and a trace column list stayed wrong for weeks before."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = "analysis|capture|compare|diagnose|evidence|model|render|report|traces|tune|vllm|schemas"
PATH = re.compile(rf"(?<![\w./-])(?:profkit/)?((?:{PACKAGES})/[a-z_/]+\.(?:py|json))\b")
DOTTED = re.compile(r"(?<![\w.])(profkit(?:\.[a-z_][a-z0-9_]*)+)")
# vLLM's own source, cited where a default is read off it: not profkit's
NOT_OURS = {"vllm/config/vllm.py"}
SOURCES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "profkit").rglob("*.py"))]


def _mentions(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    return sorted({(m.group(1), str(p.relative_to(REPO))) for p in SOURCES for m in pattern.finditer(p.read_text())})


def test_every_module_path_named_exists() -> None:
    missing = [f"{where} names {path}" for path, where in _mentions(PATH)
               if path not in NOT_OURS and not (REPO / "profkit" / path).exists()]
    assert not missing, missing


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_dotted_name_resolves() -> None:
    # `profkit.report/1`: a document, not a module
    schema_names = re.compile(r"profkit\.(report|diff|tune|history|prediction|host|sweep)")
    missing = [f"{where} names {dotted}" for dotted, where in _mentions(DOTTED)
               if not schema_names.fullmatch(dotted) and not _resolves(dotted)]
    assert not missing, missing


def test_generated_pages_are_current() -> None:
    """docs/commands.md, rules.md, contracts.md, benchmarks.md, index.md and the relations of design.md."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "make_docs.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
