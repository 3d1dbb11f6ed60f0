"""Find the top-level `rules/` and `templates/` folders, installed or in a source tree; the process
context every profkit process pool uses."""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import sys
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from profkit.errors import ProfkitError

_PACKAGE = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """`rules` or `templates`: inside the wheel (force-included) or beside the package in a checkout."""
    for candidate in (_PACKAGE / "_shipped" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"profkit installation is missing its {name}/ folder")


SCHEMA_KINDS = ("report", "diff", "prediction", "tune", "history")


def document_schema(kind: str) -> dict[str, Any]:
    """The shipped JSON Schema of a document kind (`profkit/schemas/KIND.schema.json`, part of the package)."""
    if kind not in SCHEMA_KINDS:
        raise ProfkitError(f"no schema {kind!r} (one of {', '.join(SCHEMA_KINDS)})")
    return json.loads((_PACKAGE / "schemas" / f"{kind}.schema.json").read_text())


def process_context() -> BaseContext:
    """forkserver (else spawn), never fork, for every pool profkit starts. A forked worker inherits the
    parent's forkserver handle (started by an earlier Kineto decode) and fails on it with ECHILD when
    it decodes a torch trace itself (`profkit diff` of two torch traces after a report in one process);
    and the parent may already run threads (the gunzip prefetch)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


# glibc serves large blocks by mmap only above a threshold that grows with each such block freed (up to 32 MB), so a
# report reading millions of rows in chunks keeps every freed chunk in its heap: measured +75 MB at the peak of a
# 1M-kernel serve trace's report, and +80 MB for the throughput shape. A fixed threshold maps each large array on its
# own and gives it back when freed.
M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD = 64 << 10


def give_back_freed_memory() -> None:
    """Make this process return large freed blocks to the OS at once (glibc; elsewhere nothing is done)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # a libc without mallopt (musl): its own policy stands
        ctypes.CDLL(None).mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(MMAP_THRESHOLD))
