"""Find the top-level `rules/` and `templates/` folders, installed or in a source tree."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """`rules` or `templates`: inside the wheel (force-included) or beside the package in a checkout."""
    for candidate in (_PACKAGE / "_shipped" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"profkit installation is missing its {name}/ folder")
