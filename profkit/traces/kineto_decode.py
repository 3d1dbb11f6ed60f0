"""A torch.profiler / Kineto Chrome-trace JSON's events decoded into columns, in parallel where the trace is long.

The JSON is streamed: Kineto's layout is cut into 4 MB chunks at event boundaries, and each chunk is
decoded by msgspec into small structs holding only the fields profkit reads (by worker processes when
there are more than a few chunks); any other layout goes through ijson one event object at a time.
Events become columns (int64 numpy arrays, NULL as `NULL_INT`; text only in the small relations), the
same layout the nsys reader's columns have: each chunk's rows are packed into arrays as they come, so
a trace of hundreds of MB never becomes a list of Python objects. Every byte is read through
traces/kineto_guard.py; traces/kineto.py turns the columns into the normalized relations.
Timestamps: Kineto writes microseconds as floats on the trace's clock; they become integer
nanoseconds on the same clock.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import re
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Any

import ijson
import msgspec
import numpy as np

from profkit.errors import TraceError
from profkit.resources import process_context
from profkit.traces.columns import NULL_INT
from profkit.traces.kineto_guard import JsonGuard, open_guarded

# Rows of one relation held as Python tuples before they are packed into arrays.
PACK_ROWS = 200_000
# "Memcpy HtoD (Pageable -> Device)" -> nsys's "[CUDA memcpy Host-to-Device]", src Pageable, dst Device
_MEMCPY = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
_COPY_KINDS = {"HtoD": "Host-to-Device", "DtoH": "Device-to-Host", "DtoD": "Device-to-Device",
               "HtoH": "Host-to-Host", "PtoP": "Peer-to-Peer", "DtoA": "Device-to-Array",
               "AtoD": "Array-to-Device", "HtoA": "Host-to-Array", "AtoH": "Array-to-Host"}
_MEMSET = re.compile(r"Memset \((\w+)\)")

# The columns each relation's events are decoded into, in the order of a row's tuple.
LAYOUT = {
    "kernels": ("start", "end", "device", "stream", "correlation", "pid", "name_id"),
    "memops": ("start", "end", "device", "stream", "correlation", "pid", "operation", "bytes", "src_kind",
               "dst_kind"),
    "api": ("start", "end", "tid", "pid", "correlation", "name_id"),
    "sync": ("start", "end", "device", "stream", "correlation", "pid", "sync_type"),
    "nvtx": ("start", "end", "tid", "pid", "name", "style"),
    "cpu_ops": ("start", "end", "tid", "name_id"),
}
TEXT_COLUMNS = frozenset({"operation", "src_kind", "dst_kind", "sync_type", "name", "style"})
NAMED = ("kernels", "api", "cpu_ops")  # relations whose name_id refers to the decoded names

Columns = dict[str, Any]  # column name -> int64 array, or a list for a text column


# Microseconds whose nanoseconds, plus a duration as long, still fit an int64 (SQLite's INTEGER).
TS_LIMIT_US = 4.5e15


def _ns(us: Any) -> int | None:
    """Microseconds (a number) -> integer nanoseconds; None for anything else (a string, NaN, huge)."""
    if type(us) not in (int, float) or not math.isfinite(us) or abs(us) >= TS_LIMIT_US:
        return None
    return int(round(us * 1000))


def as_int(v: Any) -> int | None:
    """`v` as an integer SQLite can store with room to add, or None (a bool, a string, a float too big...)."""
    if isinstance(v, bool):
        return None
    try:
        i = int(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return i if -(1 << 62) < i < (1 << 62) else None


# Older torch (1.8-1.10) spelled the categories differently; HTA reads both. Anything else unknown is ignored.
CATEGORY_ALIASES = {
    "Kernel": "kernel", "Runtime": "cuda_runtime", "Driver": "cuda_driver", "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset", "Operator": "cpu_op", "Sync": "cuda_sync",
    "User_annotation": "user_annotation", "Gpu_user_annotation": "gpu_user_annotation",
}


@dataclass
class _ChunkColumns:
    """What a decoding worker sends back for one chunk: its columns, with name ids into `names` (1-based)."""

    names: list[str]
    parts: dict[str, list[Columns]]
    seen: dict[str, int]
    skipped: int


class EventColumns:
    """Turns a stream of Kineto events into the columns of the normalized relations (in file order, as decoded)."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.rows: dict[str, list[tuple]] = {rel: [] for rel in LAYOUT}
        self.parts: dict[str, list[Columns]] = {rel: [] for rel in LAYOUT}  # packed rows, in file order
        self.seen: dict[str, int] = {rel: 0 for rel in LAYOUT}  # events decoded per relation
        self.skipped = 0  # events whose fields are not what Kineto writes (a string time, no device, ...)
        self.clipped = 0  # strings longer than MAX_STRING, clipped as they were read (`JsonGuard`)

    def clip(self) -> None:
        """A string was clipped as it was read (the `JsonGuard`'s `on_clip`)."""
        self.clipped += 1

    def name_id(self, name: str) -> int:
        nid = self.names.get(name)
        if nid is None:
            nid = self.names[name] = len(self.names) + 1
        return nid

    def add(self, ph: Any, cat: Any, name: Any, pid: Any, tid: Any, ts: Any, dur: Any, device: Any = None,
            stream: Any = None, correlation: Any = None, nbytes: Any = None) -> None:
        """One event, with the four `args` fields profkit reads."""
        if ph != "X" or ts is None:
            return
        cat = CATEGORY_ALIASES.get(cat, cat) if isinstance(cat, str) else cat
        start, length = _ns(ts), _ns(dur or 0)
        if start is None or length is None or length < 0:
            self.skipped += 1
            return
        end = start + length
        name = str(name or "")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset") and as_int(device) is None:
            self.skipped += 1  # a GPU event must say which GPU
            return
        if cat == "kernel":
            self._put("kernels", (start, end, as_int(device), as_int(stream), as_int(correlation), None,
                                  self.name_id(name)))
        elif cat == "gpu_memcpy":
            m = _MEMCPY.match(name)
            op = f"[CUDA memcpy {_COPY_KINDS.get(m.group(1), m.group(1))}]" if m else f"[CUDA memcpy {name}]"
            self._put("memops", (start, end, as_int(device), as_int(stream), as_int(correlation), None, op,
                                 as_int(nbytes) or 0, m.group(2) if m else None, m.group(3) if m else None))
        elif cat == "gpu_memset":
            m = _MEMSET.match(name)
            self._put("memops", (start, end, as_int(device), as_int(stream), as_int(correlation), None,
                                 "[CUDA memset]", as_int(nbytes) or 0, None, m.group(1) if m else None))
        elif cat in ("cuda_runtime", "cuda_driver"):
            self._put("api", (start, end, as_int(tid), as_int(pid), as_int(correlation), self.name_id(name)))
        elif cat == "cuda_sync":
            self._put("sync", (start, end, as_int(device), as_int(stream), as_int(correlation), as_int(pid), name))
        elif cat in ("user_annotation", "gpu_user_annotation"):
            self._put("nvtx", (start, end, as_int(tid), as_int(pid), name,
                               "CPU" if cat == "user_annotation" else "GPU"))
        elif cat == "cpu_op":
            self._put("cpu_ops", (start, end, as_int(tid), self.name_id(name)))

    def add_events(self, events: list[_Event]) -> None:
        """A decoded chunk: the frequent categories inline (msgspec already typed the fields), the rest
        through `add`. This loop is the reader's hot path: millions of events per trace."""
        kernels, api, cpu = self.rows["kernels"], self.rows["api"], self.rows["cpu_ops"]
        names = self.names
        for e in events:
            if e.ph != "X" or e.ts is None:  # flow arrows, metadata, instants: ~40 % of a trace
                continue
            cat = e.cat
            if cat == "cpu_op" or cat == "kernel" or cat == "cuda_runtime" or cat == "cuda_driver":
                ts, dur = e.ts, e.dur or 0.0
                if not (-TS_LIMIT_US < ts < TS_LIMIT_US and 0 <= dur < TS_LIMIT_US) or (
                        cat == "kernel" and (e.args is None or e.args.device is None)):
                    self.skipped += 1  # NaN fails the comparisons too
                    continue
                start = round(ts * 1000)
                end = start + round(dur * 1000)
                name = e.name or ""
                nid = names.get(name)
                if nid is None:
                    nid = names[name] = len(names) + 1
                a = e.args
                if cat == "cpu_op":
                    cpu.append((start, end, e.tid if type(e.tid) is int else as_int(e.tid), nid))
                elif cat == "kernel":
                    assert a is not None  # a kernel without its args was skipped above
                    kernels.append((start, end, a.device, a.stream, a.correlation, None, nid))
                else:
                    api.append((start, end, e.tid if type(e.tid) is int else as_int(e.tid),
                                e.pid if type(e.pid) is int else as_int(e.pid), a.correlation if a else None, nid))
            else:
                a = e.args
                if a is None:
                    self.add(e.ph, cat, e.name, e.pid, e.tid, e.ts, e.dur)
                else:
                    self.add(e.ph, cat, e.name, e.pid, e.tid, e.ts, e.dur, a.device, a.stream, a.correlation,
                             a.nbytes)
        if len(kernels) + len(api) + len(cpu) >= PACK_ROWS:
            self.pack()

    def _put(self, relation: str, row: tuple) -> None:
        rows = self.rows[relation]
        rows.append(row)
        if len(rows) >= PACK_ROWS:
            self.pack()

    def pack(self) -> None:
        """The rows decoded so far become columns."""
        for rel, rows in self.rows.items():
            if rows:
                self.parts[rel].append(_packed(rel, rows))
                self.seen[rel] += len(rows)
                rows.clear()

    def take(self) -> _ChunkColumns:
        """Everything decoded, for the process that merges (a worker's are one chunk's)."""
        self.pack()
        return _ChunkColumns(names=list(self.names), parts=self.parts, seen=self.seen, skipped=self.skipped)

    def absorb(self, other: _ChunkColumns) -> None:
        """Append a worker's columns, its name ids mapped to these columns' ids."""
        ids = np.array([0] + [self.name_id(name) for name in other.names], dtype=np.int64)
        for rel, parts in other.parts.items():
            for part in parts:
                if rel in NAMED:
                    part["name_id"] = ids[part["name_id"]]
                self.parts[rel].append(part)
            self.seen[rel] += other.seen[rel]
        self.skipped += other.skipped


def _packed(relation: str, rows: list[tuple]) -> Columns:
    values = list(zip(*rows, strict=True))
    return {name: list(col) if name in TEXT_COLUMNS else _int_array(col)
            for name, col in zip(LAYOUT[relation], values, strict=True)}


def _int_array(values: tuple) -> np.ndarray:
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except TypeError:  # NULLs (an event without a stream, correlation id, thread...)
        return np.fromiter((NULL_INT if v is None else v for v in values), dtype=np.int64, count=len(values))



# An integer SQLite can store (int64) with room to add: a bigger one fails the typed decode, and the chunk is read
# by the generic reader, which drops what does not fit (`as_int`).
Int = Annotated[int, msgspec.Meta(gt=-(1 << 62), lt=1 << 62)]  # the same open bounds as `as_int`


class _Args(msgspec.Struct):
    device: Int | None = None
    stream: Int | None = None
    correlation: Int | None = None
    nbytes: Int | None = msgspec.field(default=None, name="bytes")


class _Event(msgspec.Struct):
    """The fields profkit reads; msgspec skips every other key (Input Dims, call stacks...) unparsed."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: Int | str | None = None
    tid: Int | str | None = None
    # An integer stays one: epoch microseconds (~1.7e15) times 1000 lose up to 256 ns as a float.
    ts: Int | float | None = None
    dur: Int | float | None = None
    args: _Args | None = None


class _Tail(msgspec.Struct):
    traceEvents: list[_Event]  # noqa: N815 - the JSON key


class _Trailer(msgspec.Struct):
    """Top-level keys a trace may carry after its events (written by tools that re-serialize a Kineto trace)."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"[]")  # noqa: N815 - skipped, the events are decoded apart
    schemaVersion: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    cuda_driver_version: Any = None
    cuda_runtime_version: Any = None
    baseTimeNanoseconds: Any = None  # noqa: N815
    computeProperties: Any = None  # noqa: N815


def _trailer(data: bytes) -> dict[str, Any]:
    """The metadata keys in the part of the document after traceEvents (empty when there are none)."""
    try:
        t = msgspec.json.decode(data, type=_Trailer)
    except Exception:  # noqa: BLE001 - metadata is optional; a broken tail fails the event decode anyway
        return {}
    return {k: getattr(t, k) for k in t.__struct_fields__ if k != "traceEvents" and getattr(t, k) is not None}


# 4 MB of JSON decodes to ~25 MB of structs: small enough to keep each worker's memory low.
_CHUNK = 4 << 20
# Traces of up to this many chunks (12 MB of JSON) are decoded in this process.
IN_PROCESS_CHUNKS = 3
# Kineto writes one event per `{ ... }` block, separated by "},\n  {" at the top level of traceEvents. A
# raw newline never occurs inside a JSON string, so a split there is between two events or, in an
# unexpected layout, yields invalid JSON, which sends the whole file to the generic ijson path.
_SEPARATOR = b"},\n  {"


class _NotKinetoLayout(Exception):
    pass


class _Prefetch:
    """Reads (and gunzips) the next block in a thread while the caller decodes the current one:
    zlib releases the GIL, so decompression overlaps with decoding."""

    def __init__(self, f: JsonGuard) -> None:
        self.f = f
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.next = self.pool.submit(f.read, _CHUNK)

    def read(self, _size: int) -> bytes:
        block = self.next.result()
        self.next = self.pool.submit(self.f.read, _CHUNK) if block else self.next
        return block

    def __enter__(self) -> _Prefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        # Let a pending read finish before the caller closes the file under it.
        self.pool.shutdown(wait=True)


def decode(path: Path) -> tuple[EventColumns, int, dict[str, Any]]:
    """The trace's events as columns, how many events were read, and the metadata keys found after them.

    Kineto's layout is decoded in chunks (`_load_fast`); any other goes through ijson (`_load_ijson`)."""
    columns = EventColumns()
    trailer: dict[str, Any] = {}
    try:
        n = _load_fast(path, columns, trailer)
    except _NotKinetoLayout:
        columns = EventColumns()
        n = _load_ijson(path, columns)
    return columns, n, trailer


def _load_fast(path: Path, columns: EventColumns, trailer: dict[str, Any] | None = None) -> int:
    """Chunked msgspec decoding (~3x faster than ijson); raises _NotKinetoLayout to fall back.

    A small trace is decoded here; a longer one by worker processes (decoding and the
    per-event loop hold the GIL, so threads would not help), each chunk's columns merged into
    `columns` in file order.
    """
    chunks = _kineto_chunks(path, trailer, columns)
    head = list(itertools.islice(chunks, IN_PROCESS_CHUNKS + 1))
    if len(head) <= IN_PROCESS_CHUNKS:  # small trace: starting workers would cost more than they save
        return sum(_decode_into(columns, data, tail) for data, tail in head)
    return _load_parallel(path, columns, itertools.chain(head, chunks))


_LIST_DECODER = msgspec.json.Decoder(list[_Event])
_TAIL_DECODER = msgspec.json.Decoder(_Tail)


def _decode_into(columns: EventColumns, data: bytes, tail: bool) -> int:
    try:
        events = _TAIL_DECODER.decode(data).traceEvents if tail else _LIST_DECODER.decode(data)
    except msgspec.DecodeError:
        raise _NotKinetoLayout from None
    columns.add_events(events)
    return len(events)


def _kineto_chunks(path: Path, trailer: dict[str, Any] | None = None,
                   columns: EventColumns | None = None) -> Iterator[tuple[bytes, bool]]:
    """traceEvents as ~16 MB JSON arrays cut at event boundaries: (array text, False), then the rest of
    the document as (object text, True); the metadata found after the events goes into `trailer`."""
    with open_guarded(path, columns.clip if columns else None, depth=False) as raw, _Prefetch(raw) as f:
        buf = bytearray()
        while True:  # skip the header up to the opening bracket of traceEvents
            block = f.read(_CHUNK)
            buf += block
            i = buf.find(b'"traceEvents"')
            j = buf.find(b"[", i) if i >= 0 else -1
            if j >= 0:
                del buf[:j]  # keep the "[" that opens traceEvents
                break
            if not block:
                raise _NotKinetoLayout
        while True:
            block = f.read(_CHUNK)
            if not block:
                last = b'{"traceEvents": ' + bytes(buf)
                if trailer is not None:
                    trailer.update(_trailer(last))
                yield last, True
                return
            buf += block
            cut = buf.rfind(_SEPARATOR)
            if cut < 0:
                if len(buf) > 4 * _CHUNK:  # no event boundary in 64 MB: not Kineto's layout, stream it
                    raise _NotKinetoLayout
                continue
            # The separator's comma becomes the closing bracket; its newline, the next chunk's "[".
            buf[cut + 1] = ord("]")
            chunk = bytes(buf[: cut + 2])
            del buf[: cut + 2]
            buf[0] = ord("[")
            yield chunk, False


def _workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _load_parallel(path: Path, columns: EventColumns, chunks: Iterator[tuple[bytes, bool]]) -> int:
    n_workers = _workers()
    ctx = process_context()  # not fork: this process already runs the gunzip prefetch thread
    n = 0
    try:
        try:
            pool = ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx)
        except (OSError, NotImplementedError, ImportError):  # no working multiprocessing here: decode in turn
            return sum(_decode_into(columns, data, tail) for data, tail in chunks)
        with pool:
            pending: deque = deque()

            def collect() -> None:  # in submission order: the columns stay in file order
                nonlocal n
                events, decoded = pending.popleft().result()
                columns.absorb(decoded)
                n += events

            for data, tail in chunks:
                pending.append(pool.submit(_decode_in_worker, data, tail))
                while len(pending) > n_workers:  # bounded: a chunk queued per worker, flat memory
                    collect()
            while pending:
                collect()
    except BrokenProcessPool as exc:
        raise TraceError(f"{path}: a decoding worker process died ({exc or 'killed'}); out of memory?") from None
    return n


def _decode_in_worker(data: bytes, tail: bool) -> tuple[int, _ChunkColumns]:
    """In a worker process: one chunk's events as columns (sent back as numpy arrays, compact to pickle)."""
    columns = EventColumns()
    events = _decode_into(columns, data, tail)
    return events, columns.take()


def _load_ijson(path: Path, columns: EventColumns) -> int:
    """Any valid Chrome-trace JSON, one event object at a time: an object with traceEvents, or (the
    Chrome trace format's other form, written by torch 1.8's Kineto) a bare array of events."""
    n = 0
    prefix = "item" if _first_byte(path) == b"[" else "traceEvents.item"
    with open_guarded(path, columns.clip) as f:
        for ev in ijson.items(f, prefix, use_float=True):
            if isinstance(ev, dict):
                given = ev.get("args")
                a: dict[str, Any] = given if isinstance(given, dict) else {}
                columns.add(ev.get("ph"), ev.get("cat"), ev.get("name"), ev.get("pid"), ev.get("tid"),
                            ev.get("ts"), ev.get("dur"), a.get("device"), a.get("stream"), a.get("correlation"),
                            a.get("bytes"))
                n += 1
    return n


def read_header(path: Path) -> dict[str, Any]:
    """Top-level keys before `traceEvents` (Kineto writes its metadata first); stops at the events."""
    meta: dict[str, Any] = {}
    with open_guarded(path, depth=False) as f:
        head = _until_events(f)
    # Its nesting is bounded here, on the metadata alone: the events are the event reader's.
    for key, value in ijson.kvitems(JsonGuard(head, path, depth=True), ""):
        meta[key] = value
    return meta


def _until_events(f: JsonGuard) -> IO[bytes]:
    """A file-like view that ends where `"traceEvents"` begins, closing the JSON object there."""
    head = bytearray()
    while chunk := f.read(1 << 16):
        head += chunk
        i = head.find(b'"traceEvents"')
        if i >= 0:
            head = head[:i].rstrip().rstrip(b",") + b"}"
            break
        if len(head) > 64 << 20:  # metadata is small; a huge header means it is not there
            break
    return io.BytesIO(bytes(head))


def looks_like_trace(path: Path) -> bool:
    """Whether the file's first MB shows a trace's events (for a JSON without metadata before them)."""
    with open_guarded(path) as f:
        head = f.read(1 << 20)
    return b'"traceEvents"' in head or (head.lstrip()[:1] == b"[" and b'"ph"' in head)


def _first_byte(path: Path) -> bytes:
    with open_guarded(path) as f:
        return f.read(4096).lstrip()[:1]


