"""A torch trace's JSON bytes as the parsers are given them, bounded before they spend memory on a hostile file.

A string longer than MAX_STRING is clipped as the bytes stream by, a gzip'd trace may not expand past a multiple
of its size, and nesting deeper than MAX_DEPTH is refused. The decoders (traces/kineto_decode.py) read every
byte of a trace through `open_guarded`.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

import numpy as np

from profkit.errors import TraceError

# A JSON value nested deeper than this is no trace's (Kineto writes 6 levels at most). The parsers spend memory
# on depth before they fail: ijson's events carry a path that grows with it, ~2.5 bytes x depth^2 held per
# buffer (4 GB at 40,000 levels), and Python objects that deep overflow the interpreter's stack when printed.
MAX_DEPTH = 100
# A JSON string longer than this is clipped as the bytes stream by, with a marker saying how long it was: one
# 400 MB kernel name took ijson past 5 minutes, and would be copied several times as a Python string. The
# longest demangled kernel names (CUTLASS templates) run to a few KB.
MAX_STRING = 64 << 10
# Decompressed bytes a gzip'd trace may expand to: this many times the file, or GZIP_FLOOR if more. Real
# traces compress 15-30x; gzip's limit is ~1000x, reached by a "bomb" of repeated bytes.
GZIP_RATIO = 200
GZIP_FLOOR = 1 << 30
# Bytes read at a time where the caller asks for everything.
BLOCK = 4 << 20
_ESCAPE = re.compile(rb"\\(?:u[0-9A-Fa-f]{4}|.)", re.DOTALL)
_HIGH_SURROGATE = re.compile(rb"\\u[dD][89abAB]")


class JsonGuard:
    """A trace's JSON bytes as the parsers are given them, bounded before they spend memory: a string longer
    than MAX_STRING is clipped, a gzip'd trace may not expand past `max_bytes`, and with `depth` nesting deeper
    than MAX_DEPTH is refused (for ijson; msgspec stops at Python's recursion limit by itself). Where strings
    are (quotes not escaped by an odd run of backslashes), and the depth outside them, is found with numpy a
    block at a time (~800 MB/s, ~300 MB/s with the depth); the rare long string is cut in Python.

    A string still open at the end of a block is held back (at most MAX_STRING bytes) and scanned again with
    the next one, so every block starts outside a string; a string being clipped is skipped to its end."""

    def __init__(self, f: IO[bytes], path: Path, max_bytes: int | None = None,
                 on_clip: Callable[[], None] | None = None, depth: bool = False) -> None:
        self.f, self.path, self.max_bytes, self.on_clip, self.track = f, path, max_bytes, on_clip, depth
        self.total = 0  # bytes read from `f` (decompressed)
        self.depth = 0
        self.held = b""  # an open string from its opening quote
        self.clipping = 0  # bytes of the string being clipped so far (0: none)
        self.run = 0  # backslashes ending what was skipped of it: an odd run escapes the next quote
        self.done = False

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # ijson asks whether the stream gives bytes
            return b""
        while not self.done:
            block = self.f.read(size if size > 0 else BLOCK)
            if not block:
                self.done = True
                held, self.held = self.held, b""
                return held  # an unterminated string: the parser says the JSON is truncated
            self.total += len(block)
            if self.max_bytes is not None and self.total > self.max_bytes:
                raise TraceError(f"{self.path}: gzip data expanding past {self.max_bytes >> 20} MiB, more than "
                                 f"{GZIP_RATIO} times the file: a decompression bomb, not a trace")
            out = self._feed(self.held + block if self.held else block)
            if out:
                return out
        return b""

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> JsonGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _feed(self, data: bytes) -> bytes:
        self.held = b""
        a = np.frombuffer(data, dtype=np.uint8)
        out: list[bytes | memoryview] = []
        view = memoryview(data)
        start = scan = 0
        if self.clipping:  # inside a clipped string: skip to its closing quote
            quotes = _real_quotes(a, self.run)
            if not len(quotes):
                self.clipping += len(data)
                self.run = _trailing_backslashes(data, self.run)
                return b""
            start = int(quotes[0])  # the closing quote, kept
            scan = start + 1
            out.append(b"...[clipped by profkit: %d bytes]" % (self.clipping + start))
            self.clipping = 0
        quotes = _real_quotes(a[scan:]) + scan  # from `scan` on, outside a string
        if self.track:
            self._track_depth(a[scan:], quotes - scan)
        opened = quotes[::2]
        closed = quotes[1::2]
        ends = len(data) if len(quotes) % 2 else None
        long = np.flatnonzero(closed - opened[:len(closed)] - 1 > MAX_STRING).tolist()
        for i in long:
            o, c = int(opened[i]), int(closed[i])
            out.append(view[start:o + 1])
            out.append(data[o + 1:o + 1 + _safe_cut(data, o + 1)])
            out.append(b"...[clipped by profkit: %d bytes]" % (c - o - 1))
            start = c
            self._clipped()
        if ends is not None:  # a string open at the end of the block
            o = int(opened[-1])
            if ends - o - 1 > MAX_STRING + 12:  # the cut point and the escape that may straddle it are here
                out.append(view[start:o + 1])
                out.append(data[o + 1:o + 1 + _safe_cut(data, o + 1)])
                self.clipping = ends - o - 1
                self.run = _trailing_backslashes(data[o + 1:])
                self._clipped()
                start = ends
            else:
                self.held = data[o:]
                ends = o
        if not out and ends is None:
            return data
        out.append(view[start:ends])
        return b"".join(out)

    def _track_depth(self, a: np.ndarray, quotes: np.ndarray) -> None:
        folded = a | 0x20  # "[" and "{" differ in that bit only, as "]" and "}" do
        opens = folded == 0x7B
        at = np.flatnonzero(opens | (folded == 0x7D))
        if not len(at):
            return
        at = at[np.searchsorted(quotes, at) % 2 == 0]  # an even number of quotes before: not in a string
        level = self.depth + np.cumsum(np.where(opens[at], 1, -1), dtype=np.int64)
        if len(level):
            if level.max() > MAX_DEPTH:
                raise TraceError(f"{self.path}: JSON nested too deeply: not a torch.profiler trace")
            self.depth = int(level[-1])

    def _clipped(self) -> None:
        if self.on_clip is not None:
            self.on_clip()


def _real_quotes(a: np.ndarray, run: int = 0) -> np.ndarray:
    """Positions of the quotes in `a` that are not escaped (preceded by an odd run of backslashes; `run`:
    backslashes just before `a`)."""
    quotes = np.flatnonzero(a == 34)
    slashes = np.flatnonzero(a == 92)
    if not len(quotes) or not len(slashes) and not run:
        return quotes
    before = np.zeros(len(quotes), dtype=np.int64)  # the run of backslashes ending just before each quote
    if len(slashes):
        first = np.ones(len(slashes), dtype=bool)
        first[1:] = np.diff(slashes) != 1
        run_start = slashes[first][np.cumsum(first) - 1]
        j = np.minimum(np.searchsorted(slashes, quotes - 1), len(slashes) - 1)
        hit = slashes[j] == quotes - 1
        before = np.where(hit, quotes - run_start[j], 0)
        before += np.where(hit & (run_start[j] == 0), run, 0)
    before += np.where(quotes == 0, run, 0)
    return quotes[before % 2 == 0]


def _trailing_backslashes(data: bytes, run: int = 0) -> int:
    """Backslashes ending `data` (`run` more before it, where all of `data` is backslashes)."""
    k = len(data) - len(data.rstrip(b"\\"))
    return k + run if k == len(data) else k


def _safe_cut(data: bytes, at: int) -> int:
    """Bytes of the string starting at `at` to keep (MAX_STRING or a few less): never half an escape, a
    surrogate pair or a UTF-8 character."""
    cut = MAX_STRING
    before = None  # the escape just before the one looked at
    for m in _ESCAPE.finditer(data, at, at + cut + 12):
        s, e = m.start() - at, m.end() - at
        if s >= cut:
            break
        if e > cut or e == cut and _HIGH_SURROGATE.match(m.group()):
            cut = s
            if before is not None and before.end() == m.start() and _HIGH_SURROGATE.match(before.group()):
                cut = before.start() - at  # the low half straddled the cut: its high half goes too
            break
        before = m
    while cut > 0 and data[at + cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte: back to its lead byte
        cut -= 1
    return cut


def open_guarded(path: Path, on_clip: Callable[[], None] | None = None, depth: bool = True) -> JsonGuard:
    """The trace's JSON bytes (gunzipped where the file is gzip), through a `JsonGuard`; `on_clip` is called for
    each string clipped."""
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if gz:
        opened = cast(IO[bytes], gzip.open(path, "rb"))  # noqa: SIM115 - the guard owns it and closes it
        return JsonGuard(opened, path, max(GZIP_FLOOR, GZIP_RATIO * path.stat().st_size), on_clip, depth)
    return JsonGuard(path.open("rb"), path, None, on_clip, depth)

