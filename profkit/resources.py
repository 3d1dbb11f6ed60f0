"""Find the top-level `rules/` and `templates/` folders, installed or in a source tree; the process
context every profkit process pool uses."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import BaseContext
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """`rules` or `templates`: inside the wheel (force-included) or beside the package in a checkout."""
    for candidate in (_PACKAGE / "_shipped" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"profkit installation is missing its {name}/ folder")


def schema_path(kind: str) -> Path:
    """The shipped JSON Schema of a document kind (`profkit/schemas/KIND.schema.json`, part of the package)."""
    return _PACKAGE / "schemas" / f"{kind}.schema.json"


def process_context() -> BaseContext:
    """forkserver (else spawn), never fork, for every pool profkit starts. A forked worker inherits the
    parent's forkserver handle (started by an earlier Kineto decode) and fails on it with ECHILD when
    it decodes a torch trace itself (`profkit diff` of two torch traces after a report in one process);
    and the parent may already run threads (the gunzip prefetch)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
