"""Sniff what a path is and open it with the right reader."""

from __future__ import annotations

import os
from pathlib import Path

from profkit.errors import ProfkitError, TraceError
from profkit.inputs import require_file
from profkit.traces.kineto import open_kineto
from profkit.traces.nsys import SQLITE_MAGIC, open_nsys
from profkit.traces.schema import Trace

GZIP_MAGIC = b"\x1f\x8b"
SNIFF_BYTES = 4096


def looks_like_json_text(head: bytes) -> bool:
    """True when `head` (a file's first bytes) could open a JSON document: `{` or `[` after whitespace, and text.

    Checking that the bytes are UTF-8 text keeps binary junk that happens to start with `[` out of the JSON
    reader, where it would fail with a lexer message instead of "not a trace".
    """
    stripped = head.lstrip(b" \t\r\n")
    if stripped[:1] not in (b"{", b"["):
        return False
    try:
        text = stripped.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(stripped) - 3:  # only a multi-byte character cut at the end of `head` is allowed
            return False
        text = stripped[:exc.start].decode("utf-8")
    # JSON allows no raw control characters outside whitespace.
    return not any(ord(ch) < 0x20 and ch not in "\t\r\n" for ch in text)


def open_trace(path: str | os.PathLike, defer: bool = False) -> Trace:
    """Open an nsys SQLite export or a torch.profiler trace as a normalized `Trace`. `defer`: an export's large
    kernel and CUDA API tables are checked by their one read (traces/scan.py), not at open."""
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file or directory")
    if p.is_dir():  # a capture folder's traces are found by profkit.evidence.folder.CaptureFolder.traces()
        raise TraceError(f"{p}: a folder, not a trace file")
    try:
        require_file(p, "trace")
    except ProfkitError as exc:
        raise TraceError(str(exc)) from None
    if not os.access(p, os.R_OK):
        raise TraceError(f"{p}: permission denied")
    with p.open("rb") as f:
        head = f.read(SNIFF_BYTES)
    if not head:
        raise TraceError(f"{p}: empty file, not a trace")
    if head.startswith(SQLITE_MAGIC):
        return open_nsys(p, defer=defer)
    if head.startswith(GZIP_MAGIC) or looks_like_json_text(head):
        return open_kineto(p)
    if p.suffix == ".nsys-rep" or head.startswith(b"\x00\x00"):
        raise TraceError(f"{p}: an .nsys-rep report; export it first: nsys export --type sqlite {p}")
    raise TraceError(f"{p}: not a trace (expected an nsys SQLite export or a torch.profiler JSON)")
