"""torch.profiler / Kineto Chrome-trace JSON (plain or .gz) as a normalized `Trace`.

The JSON is streamed: Kineto's layout is cut into 16 MB chunks at event boundaries, and each chunk is
decoded by msgspec into small structs holding only the fields profkit reads (by worker processes when
there is more than one chunk); any other layout goes through ijson one event object at a time. Rows
are written in batches to a SQLite database in a temporary file, so a trace of hundreds of MB never
becomes a list of Python objects. The analyses then run on that database exactly as on an nsys
export. Timestamps: Kineto writes microseconds as floats on the trace's clock; they become integer
nanoseconds on the same clock (`baseTimeNanoseconds` is kept in `meta` to map them to wall time).
"""

from __future__ import annotations

import gzip
import io
import itertools
import math
import os
import re
import shutil
import sqlite3
import tempfile
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import IO, Annotated, Any

import ijson
import msgspec

from profkit.errors import TraceError
from profkit.resources import process_context
from profkit.traces.apis import GRAPH_LAUNCH_APIS
from profkit.traces.model import DUPLICATE_KEYS, Trace, count_duplicates

BATCH = 20_000
# "Memcpy HtoD (Pageable -> Device)" -> nsys's "[CUDA memcpy Host-to-Device]", src Pageable, dst Device
_MEMCPY = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
_COPY_KINDS = {"HtoD": "Host-to-Device", "DtoH": "Device-to-Host", "DtoD": "Device-to-Device",
               "HtoH": "Host-to-Host", "PtoP": "Peer-to-Peer", "DtoA": "Device-to-Array",
               "AtoD": "Array-to-Device", "HtoA": "Host-to-Array", "AtoH": "Array-to-Host"}
_MEMSET = re.compile(r"Memset \((\w+)\)")

SCHEMA = """
CREATE TABLE strings (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE raw_kernels (start INTEGER, end INTEGER, device INTEGER, stream INTEGER, correlation INTEGER,
                          pid INTEGER, name_id INTEGER);
CREATE TABLE raw_memops (start INTEGER, end INTEGER, device INTEGER, stream INTEGER, correlation INTEGER,
                         pid INTEGER, operation TEXT, bytes INTEGER, src_kind TEXT, dst_kind TEXT);
CREATE TABLE raw_api (start INTEGER, end INTEGER, tid INTEGER, pid INTEGER, correlation INTEGER, name_id INTEGER);
CREATE TABLE raw_sync (start INTEGER, end INTEGER, device INTEGER, stream INTEGER, correlation INTEGER,
                       pid INTEGER, sync_type TEXT);
CREATE TABLE nvtx (start INTEGER, end INTEGER, tid INTEGER, name TEXT, style TEXT);
CREATE TABLE cpu_ops (start INTEGER, end INTEGER, tid INTEGER, name_id INTEGER);
"""

# The normalized relations, start-ordered (`seq` is the row order), built once the stream is read.
FINISH = """
CREATE TABLE kernels AS SELECT row_number() OVER (ORDER BY start) AS seq, start, end, device, stream,
    correlation, pid, name_id, name_id AS short_id, NULL AS graph_node FROM raw_kernels WHERE device >= 0
    ORDER BY start;
CREATE TABLE memops AS SELECT start, end, device, stream, correlation, pid, operation, bytes, src_kind,
    dst_kind, NULL AS graph_node FROM raw_memops WHERE device >= 0 ORDER BY start;
CREATE TABLE api AS SELECT row_number() OVER (ORDER BY start) AS seq, start, end, tid, pid, correlation, name_id
    FROM raw_api ORDER BY start;
CREATE TABLE sync AS SELECT * FROM raw_sync ORDER BY start;
DROP TABLE raw_kernels; DROP TABLE raw_memops; DROP TABLE raw_api; DROP TABLE raw_sync;
CREATE UNIQUE INDEX kernels_seq ON kernels (seq);
CREATE UNIQUE INDEX api_seq ON api (seq);
CREATE INDEX api_corr ON api (correlation);
"""


def _drop_duplicates(conn: sqlite3.Connection, relation: str) -> int:
    """Count the duplicated events of the start-ordered `relation` and keep each once; returns how many went.

    A trace written twice into one file, or events repeated by a merge, would double every count. Duplicates
    start together, so one pass comparing each row with the next finds the candidates; only when some row
    starts with its predecessor is the exact count (and a rebuild, when there are duplicates) paid for."""
    keys = ", ".join(DUPLICATE_KEYS[relation])
    if relation not in ("kernels", "api"):  # no row order to lean on: counted exactly
        subset = ""
    else:
        pairs = f"{relation} a JOIN {relation} b ON b.seq = a.seq + 1 WHERE b.start = a.start"
        if not conn.execute(f"SELECT 1 FROM {pairs} LIMIT 1").fetchone():
            return 0
        subset = f"WHERE start IN (SELECT a.start FROM {pairs})"
    n = count_duplicates(conn, relation, subset)
    if not n:
        return 0
    cols = [d[0] for d in conn.execute(f"SELECT * FROM {relation} LIMIT 0").description if d[0] != "seq"]
    rest = ", ".join(cols)
    seq = "row_number() OVER (ORDER BY start) AS seq, " if relation in ("kernels", "api") else ""
    conn.executescript(
        f"""CREATE TABLE unique_rows AS SELECT {seq}{rest} FROM (SELECT {rest} FROM {relation} GROUP BY {keys})
                ORDER BY start;
            DROP TABLE {relation}; ALTER TABLE unique_rows RENAME TO {relation};""")
    if seq:
        conn.execute(f"CREATE UNIQUE INDEX {relation}_seq ON {relation} (seq)")
    if relation == "api":
        conn.execute("CREATE INDEX api_corr ON api (correlation)")
    return int(n)


TS_LIMIT_US = 9.0e15  # microseconds: in nanoseconds still an int64 (SQLite INTEGER)


def _ns(us: Any) -> int | None:
    """Microseconds (a number) -> integer nanoseconds; None for anything else (a string, NaN, huge)."""
    if type(us) not in (int, float) or not math.isfinite(us) or abs(us) >= TS_LIMIT_US:
        return None
    return int(round(us * 1000))


def _int(v: Any) -> int | None:
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


class _Loader:
    """Turns a stream of Kineto events into rows of the normalized tables."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.names: dict[str, int] = {}
        self.rows: dict[str, list[tuple]] = {t: [] for t in ("raw_kernels", "raw_memops", "raw_api", "raw_sync",
                                                           "nvtx", "cpu_ops")}
        self.counts: dict[str, int] = {t: 0 for t in self.rows}
        self.saved_names = 0  # names[:saved_names] are in the strings table
        self.skipped = 0  # events whose fields are not what Kineto writes (a string time, no device, ...)
        self.duplicated: dict[str, int] = {}  # events seen twice (same stream/thread, start and end), kept once

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
        if cat in ("kernel", "gpu_memcpy", "gpu_memset") and _int(device) is None:
            self.skipped += 1  # a GPU event must say which GPU
            return
        if cat == "kernel":
            self._put("raw_kernels", (start, end, _int(device), _int(stream),
                                      _int(correlation), None, self.name_id(name)))
        elif cat == "gpu_memcpy":
            m = _MEMCPY.match(name)
            op = f"[CUDA memcpy {_COPY_KINDS.get(m.group(1), m.group(1))}]" if m else f"[CUDA memcpy {name}]"
            self._put("raw_memops", (start, end, _int(device), _int(stream),
                                     _int(correlation), None, op, _int(nbytes) or 0,
                                     m.group(2) if m else None, m.group(3) if m else None))
        elif cat == "gpu_memset":
            m = _MEMSET.match(name)
            self._put("raw_memops", (start, end, _int(device), _int(stream),
                                     _int(correlation), None, "[CUDA memset]",
                                     _int(nbytes) or 0, None, m.group(1) if m else None))
        elif cat in ("cuda_runtime", "cuda_driver"):
            self._put("raw_api", (start, end, _int(tid), _int(pid), _int(correlation), self.name_id(name)))
        elif cat == "cuda_sync":
            self._put("raw_sync", (start, end, _int(device), _int(stream),
                                   _int(correlation), _int(pid), name))
        elif cat in ("user_annotation", "gpu_user_annotation"):
            self._put("nvtx", (start, end, _int(tid), name, "CPU" if cat == "user_annotation" else "GPU"))
        elif cat == "cpu_op":
            self._put("cpu_ops", (start, end, _int(tid), self.name_id(name)))

    def add_events(self, events: list[_Event]) -> None:
        """A decoded chunk: the frequent categories inline (msgspec already typed the fields), the rest
        through `add`. This loop is the reader's hot path: millions of events per trace."""
        kernels, api, cpu = self.rows["raw_kernels"], self.rows["raw_api"], self.rows["cpu_ops"]
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
                    cpu.append((start, end, e.tid if type(e.tid) is int else _int(e.tid), nid))
                elif cat == "kernel":
                    kernels.append((start, end, a.device, a.stream, a.correlation, None, nid) if a
                                   else (start, end, None, None, None, None, nid))
                else:
                    api.append((start, end, e.tid if type(e.tid) is int else _int(e.tid),
                                e.pid if type(e.pid) is int else _int(e.pid), a.correlation if a else None, nid))
            else:
                a = e.args
                if a is None:
                    self.add(e.ph, cat, e.name, e.pid, e.tid, e.ts, e.dur)
                else:
                    self.add(e.ph, cat, e.name, e.pid, e.tid, e.ts, e.dur, a.device, a.stream, a.correlation,
                             a.nbytes)
        for table in ("raw_kernels", "raw_api", "cpu_ops"):
            if len(self.rows[table]) >= BATCH:
                self.flush(table)

    def _put(self, table: str, row: tuple) -> None:
        rows = self.rows[table]
        rows.append(row)
        if len(rows) >= BATCH:
            self.flush(table)

    def flush(self, table: str | None = None) -> None:
        for t in [table] if table else list(self.rows):
            rows = self.rows[t]
            if rows:
                marks = ",".join("?" * len(rows[0]))
                self.conn.executemany(f"INSERT INTO {t} VALUES ({marks})", rows)
                self.counts[t] += len(rows)
                rows.clear()

    def flush_names(self) -> None:
        """Write the names seen since the last call (ids are assigned in order of first sight)."""
        new = [(i, n) for n, i in self.names.items() if i > self.saved_names]
        self.conn.executemany("INSERT INTO strings VALUES (?, ?)", new)
        self.saved_names = len(self.names)

    def finish(self) -> None:
        self.flush()
        self.flush_names()
        # A GPU is numbered from 0: a negative device id is no GPU (it halved the utilization, counted as a
        # second device); those events are left out and counted.
        self.skipped += self.conn.execute(
            "SELECT (SELECT count(*) FROM raw_kernels WHERE device < 0) + "
            "(SELECT count(*) FROM raw_memops WHERE device < 0)").fetchone()[0]
        self.conn.executescript(FINISH)
        self.duplicated = {rel: _drop_duplicates(self.conn, rel) for rel in DUPLICATE_KEYS}
        # Kernels replayed from a CUDA (or HIP) graph were launched by a graph launch (joined by correlation id).
        marks = ", ".join("?" * len(GRAPH_LAUNCH_APIS))
        self.conn.execute(
            f"""UPDATE kernels SET graph_node = 1 WHERE correlation IN (
                 SELECT a.correlation FROM api a JOIN strings s ON s.id = a.name_id
                 WHERE s.value IN ({marks}))""", GRAPH_LAUNCH_APIS,
        )
        self.conn.commit()


def _open_stream(path: Path) -> IO[bytes]:
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else path.open("rb")


# An integer SQLite can store (int64) with room to add: a bigger one fails the typed decode, and the chunk is read
# by the generic reader, which drops what does not fit (`_int`).
Int = Annotated[int, msgspec.Meta(gt=-(1 << 62), lt=1 << 62)]  # the same open bounds as `_int`


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
    ts: float | None = None
    dur: float | None = None
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

    def __init__(self, f: IO[bytes]) -> None:
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


def _load_fast(path: Path, loader: _Loader, trailer: dict[str, Any] | None = None) -> int:
    """Chunked msgspec decoding (~3x faster than ijson); raises _NotKinetoLayout to fall back.

    A small trace is decoded here; a longer one by worker processes (decoding and the
    per-event loop hold the GIL, so threads would not help), each writing its own SQLite file,
    merged into `loader`'s database at the end.
    """
    chunks = _kineto_chunks(path, trailer)
    head = list(itertools.islice(chunks, IN_PROCESS_CHUNKS + 1))
    if len(head) <= IN_PROCESS_CHUNKS:  # small trace: starting workers would cost more than they save
        return sum(_decode_into(loader, data, tail) for data, tail in head)
    return _load_parallel(path, loader, itertools.chain(head, chunks))


_LIST_DECODER = msgspec.json.Decoder(list[_Event])
_TAIL_DECODER = msgspec.json.Decoder(_Tail)


def _decode_into(loader: _Loader, data: bytes, tail: bool) -> int:
    try:
        events = _TAIL_DECODER.decode(data).traceEvents if tail else _LIST_DECODER.decode(data)
    except msgspec.DecodeError:
        raise _NotKinetoLayout from None
    loader.add_events(events)
    return len(events)


def _kineto_chunks(path: Path, trailer: dict[str, Any] | None = None) -> Iterator[tuple[bytes, bool]]:
    """traceEvents as ~16 MB JSON arrays cut at event boundaries: (array text, False), then the rest of
    the document as (object text, True); the metadata found after the events goes into `trailer`."""
    with _open_stream(path) as raw, _Prefetch(raw) as f:
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


def _load_parallel(path: Path, loader: _Loader, chunks: Iterator[tuple[bytes, bool]]) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="profkit-kineto-"))
    n_workers = _workers()
    ctx = process_context()  # not fork: this process already runs the gunzip prefetch thread
    n, dbs = 0, set()
    try:
        try:
            pool = ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx)
        except (OSError, NotImplementedError, ImportError):  # no working multiprocessing here: decode in turn
            return sum(_decode_into(loader, data, tail) for data, tail in chunks)
        with pool:
            pending: deque = deque()

            def collect() -> None:
                nonlocal n
                db, events, counts = pending.popleft().result()
                dbs.add(db)
                n += events
                for table, c in counts.items():
                    loader.counts[table] += c

            for data, tail in chunks:
                pending.append(pool.submit(_decode_in_worker, str(workdir), data, tail))
                while len(pending) > n_workers:  # bounded: a chunk queued per worker, flat memory
                    collect()
            while pending:
                collect()
        for db in sorted(dbs):
            _merge_worker_db(loader, db)
        # The merged names took ids in the strings table: the loader's map follows it from here.
        loader.names = dict(loader.conn.execute("SELECT value, id FROM strings"))
        loader.saved_names = max(loader.names.values(), default=0)
    except BrokenProcessPool as exc:
        raise TraceError(f"{path}: a decoding worker process died ({exc or 'killed'}); out of memory?") from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return n


# A worker process's own database, opened on its first chunk: (file, loader).
_worker_db: tuple[str, _Loader] | None = None


def _decode_in_worker(workdir: str, data: bytes, tail: bool) -> tuple[str, int, dict[str, int]]:
    """In a worker process: decode one chunk into this process's own SQLite file."""
    global _worker_db
    if _worker_db is None:
        db = str(Path(workdir) / f"worker-{os.getpid()}.sqlite")
        conn = sqlite3.connect(db)
        conn.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;" + SCHEMA)
        _worker_db = (db, _Loader(conn))
    db, loader = _worker_db
    before = dict(loader.counts)
    events = _decode_into(loader, data, tail)
    loader.flush()
    loader.flush_names()
    loader.conn.commit()
    return db, events, {t: loader.counts[t] - before[t] for t in before}


def _merge_worker_db(loader: _Loader, db: str) -> None:
    """Append a worker's rows to the main database, its name ids mapped to the main string ids."""
    conn = loader.conn
    conn.execute("ATTACH DATABASE ? AS w", (db,))
    try:
        conn.executescript(
            """
            CREATE INDEX IF NOT EXISTS strings_value ON strings (value);
            INSERT INTO strings (value) SELECT value FROM w.strings
                WHERE value NOT IN (SELECT value FROM main.strings);
            DROP TABLE IF EXISTS temp.name_map;
            CREATE TEMP TABLE name_map (local INTEGER PRIMARY KEY, global INTEGER);
            INSERT INTO name_map SELECT ws.id, s.id FROM w.strings ws JOIN main.strings s ON s.value = ws.value;
            INSERT INTO raw_kernels SELECT k.start, k.end, k.device, k.stream, k.correlation, k.pid, m.global
                FROM w.raw_kernels k JOIN name_map m ON m.local = k.name_id;
            INSERT INTO raw_api SELECT a.start, a.end, a.tid, a.pid, a.correlation, m.global
                FROM w.raw_api a JOIN name_map m ON m.local = a.name_id;
            INSERT INTO cpu_ops SELECT c.start, c.end, c.tid, m.global
                FROM w.cpu_ops c JOIN name_map m ON m.local = c.name_id;
            INSERT INTO raw_memops SELECT * FROM w.raw_memops;
            INSERT INTO raw_sync SELECT * FROM w.raw_sync;
            INSERT INTO nvtx SELECT * FROM w.nvtx;
            """
        )
        conn.commit()
    finally:
        conn.execute("DETACH DATABASE w")


def _load_ijson(path: Path, loader: _Loader) -> int:
    """Any valid Chrome-trace JSON, one event object at a time: an object with traceEvents, or (the
    Chrome trace format's other form, written by torch 1.8's Kineto) a bare array of events."""
    n = 0
    prefix = "item" if _first_byte(path) == b"[" else "traceEvents.item"
    with _open_stream(path) as f:
        for ev in ijson.items(f, prefix, use_float=True):
            if isinstance(ev, dict):
                a = ev.get("args") if isinstance(ev.get("args"), dict) else {}
                loader.add(ev.get("ph"), ev.get("cat"), ev.get("name"), ev.get("pid"), ev.get("tid"),
                           ev.get("ts"), ev.get("dur"), a.get("device"), a.get("stream"), a.get("correlation"),
                           a.get("bytes"))
                n += 1
    return n


def _header(path: Path) -> dict[str, Any]:
    """Top-level keys before `traceEvents` (Kineto writes its metadata first); stops at the events."""
    meta: dict[str, Any] = {}
    with _open_stream(path) as f:
        for key, value in ijson.kvitems(_until_events(f), ""):
            meta[key] = value
    return meta


def _until_events(f: IO[bytes]) -> IO[bytes]:
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


def open_kineto(path: Path) -> Trace:
    """Read a torch.profiler trace into a temporary SQLite database and expose it as a `Trace`."""
    conn, db = _new_db()
    loader = _Loader(conn)
    try:
        header = _header(path)
        if not header and not _looks_like_trace(path):
            raise TraceError(f"{path}: JSON without traceEvents: not a torch.profiler trace")
        trailer: dict[str, Any] = {}
        try:
            n = _load_fast(path, loader, trailer)
        except _NotKinetoLayout:
            _discard(conn, db)
            conn, db = _new_db()
            loader = _Loader(conn)
            n = _load_ijson(path, loader)
        if n == 0:
            raise TraceError(f"{path}: JSON without trace events: not a torch.profiler trace")
        loader.finish()
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        _discard(conn, db)
        raise TraceError(f"{path}: truncated or corrupt gzip ({exc})") from None
    except ijson.JSONError as exc:
        _discard(conn, db)
        raise TraceError(f"{path}: broken JSON ({_printable(exc)})") from None
    except OSError as exc:
        _discard(conn, db)
        raise TraceError(f"{path}: unreadable ({exc})") from None
    except TraceError:
        _discard(conn, db)
        raise
    except RecursionError:
        _discard(conn, db)
        raise TraceError(f"{path}: JSON nested too deeply: not a torch.profiler trace") from None
    except BaseException:
        _discard(conn, db)  # no temporary database left behind, whatever stopped the load
        raise
    if loader.counts["raw_kernels"] == 0:
        _discard(conn, db)
        raise TraceError(f"{path}: the trace has no GPU kernels (was the profiler run with CUDA activities?)")
    if conn.execute("SELECT 1 FROM kernels LIMIT 1").fetchone() is None:
        _discard(conn, db)
        raise TraceError(f"{path}: no usable kernel events: {loader.skipped} with malformed fields "
                         "(time, duration, device) left out")
    present = {"kernels", "strings"} | {rel for rel, t in (("memops", "raw_memops"), ("api", "raw_api"),
                                                           ("sync", "raw_sync"), ("nvtx", "nvtx"),
                                                           ("cpu_ops", "cpu_ops")) if loader.counts[t]}
    meta = _meta({**trailer, **header})  # the header's own keys first, then those written after the events
    said = [f"{loader.skipped} events with malformed fields (time, duration, device) left out"] if loader.skipped \
        else []
    said += [f"{n} duplicated {what} events (same {', '.join(DUPLICATE_KEYS[rel])}) counted once"
             for rel, what in (("kernels", "kernel"), ("api", "CUDA API"), ("memops", "memory-operation"),
                               ("sync", "synchronization"), ("cpu_ops", "CPU operator"), ("nvtx", "annotation"))
             if (n := loader.duplicated.get(rel))]
    if said:
        meta["inconsistent"] = "; ".join(said)
    return Trace(conn=conn, path=path, kind="torch-trace", meta=meta, present=frozenset(present),
                 db_file=Path(db), owns_db=True)


def _printable(exc: Exception, limit: int = 120) -> str:
    """The JSON parser's message on one line of printable ASCII (it may quote raw bytes of the file)."""
    text = exc.args[0] if exc.args else str(exc)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    first = str(text).strip().splitlines()[0] if str(text).strip() else type(exc).__name__
    return "".join(ch if " " <= ch <= "~" else "?" for ch in first)[:limit]


def _new_db() -> tuple[sqlite3.Connection, str]:
    fd, db = tempfile.mkstemp(prefix="profkit-", suffix=".sqlite")
    os.close(fd)
    conn = sqlite3.connect(db, check_same_thread=False)
    conn.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;" + SCHEMA)
    return conn, db


def _looks_like_trace(path: Path) -> bool:
    with _open_stream(path) as f:
        head = f.read(1 << 20)
    return b'"traceEvents"' in head or (head.lstrip()[:1] == b"[" and b'"ph"' in head)


def _first_byte(path: Path) -> bytes:
    with _open_stream(path) as f:
        return f.read(4096).lstrip()[:1]


def _discard(conn: sqlite3.Connection, db: str) -> None:
    conn.close()
    Path(db).unlink(missing_ok=True)


def _meta(header: dict[str, Any]) -> dict[str, Any]:
    props = header.get("deviceProperties", header.get("computeProperties"))  # the latter: early Kineto
    devices = [d for d in props if isinstance(d, dict)] if isinstance(props, list) else []
    # The header is the file's: numbers arrive as Decimals (ijson), huge or of the wrong type; names as anything.
    def text(v: Any) -> str | None:
        return None if v is None else str(v)[:200]

    meta: dict[str, Any] = {
        "tool": "torch.profiler (Kineto)",
        "tool_version": f"schema {text(header.get('schemaVersion'))}" if "schemaVersion" in header else None,
        "gpu": text(devices[0].get("name")) if devices and devices[0].get("name") else None,
        "gpus": [{"id": _int(d.get("id")), "name": text(d.get("name")), "memory_bytes": _int(d.get("totalGlobalMem")),
                  "sm_count": _int(d.get("numSms"))} for d in devices],
        "base_time_ns": _int(header.get("baseTimeNanoseconds")),
    }
    v = _int(header.get("cuda_driver_version"))
    if v is not None and v >= 0:
        meta["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
    dist = header.get("distributedInfo")
    if isinstance(dist, dict):
        meta["rank"] = _int(dist.get("rank"))
        meta["world_size"] = _int(dist.get("world_size"))
    return meta
