"""Every fact the rules read, with its value (the HTML report's detail; `profkit rules facts` says what each is)."""

from __future__ import annotations

from typing import Any


def view(report: dict[str, Any], top: int) -> dict[str, Any]:
    return report.get("facts") or {}


def text(_v: dict[str, Any]) -> list[str]:
    return []
