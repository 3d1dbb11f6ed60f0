"""CPU operators of a torch trace (the HTML report's detail; the terminal leaves them out)."""

from __future__ import annotations

from typing import Any


def view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    return {"report": report, "top": top} if report.get("gpu") is not None and report.get("cpu_ops") else None


def text(_v: dict[str, Any]) -> list[str]:
    return []
