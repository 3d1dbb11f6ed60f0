"""One read of a large nsys table (kernels, CUDA API) that also checks it, chunk by chunk (issue 41).

Opening an export used to check the kernel and CUDA API tables in SQL passes of their own (every numeric value an
integer, times and devices in bounds, rows in start order): 2 s of a 6 s report on 2 cores. Then the analyses read
the same rows again. Here the raw table is read once, in row-id ranges, through the ADBC driver (Arrow buffers
filled in C, the GIL let go), and each chunk is checked on the way with numpy before the analyses take it:
- types: the driver gives every column as int64 only when every value is an integer or NULL (a text or real value
  makes it another type or an error);
- NULLs where nsys always writes a value, times outside 0..2^53 ns, ends before starts, device ids out of range;
- order: starts strictly increasing in row-id order, row ids without a hole.

A chunk that fails any check raises `Unverified`: the caller opens the trace again with the SQL checks of
traces/nsys.py, which say what is wrong and repair what they can. A clean export (every real one) never pays them.
At most `jobs` chunks are in flight (read ahead on threads), so memory is a few chunks whatever the table's size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from profkit.traces.columns import JOBS, ConnectionPool, arrow_query, to_int64
from profkit.traces.schema import Trace

# Rows per chunk: ~10 MB of int64 columns for the kernel table's ten.
SCAN_ROWS = 1 << 17
# Chunks read ahead at once: the checks and the analyses run on one thread, which two or three readers keep busy;
# more only hold more chunks (8 on a 16-core box: +80 MB).
SCAN_JOBS = min(JOBS, 3)
MAX_NS = 1 << 53  # as traces/nsys.py: times past it are no real trace's
MAX_DEVICE = (1 << 20) - 1


class Unverified(Exception):  # noqa: N818 - a signal to the caller, not an error the user sees
    """A chunk of a table whose checks were left to its read failed one: open the trace with the SQL checks."""


def scan_table(trace: Trace, table: str, columns: Mapping[str, tuple[str, str]], span: tuple[int, int],
               chunk_rows: int = SCAN_ROWS, jobs: int = SCAN_JOBS) -> Iterator[dict[str, np.ndarray]]:
    """Chunks of `table` (a raw table of the trace's file) in row-id order: {name: int64 array} of `columns`
    ({name: (column, kind)} as traces.nsys.CHECKED: "start", "end", "device", "id", a trailing "?" where NULL is
    allowed) plus "seq" (the row id), every chunk checked. NULL becomes NULL_INT. `span`: the first and last
    row id."""
    pool = trace.cache.setdefault("adbc", ConnectionPool(trace.database))
    names = list(columns)
    sql = ", ".join(["rowid", *(columns[n][0] for n in names)])
    lo, hi = span
    ranges = [(a, min(hi + 1, a + chunk_rows)) for a in range(lo, hi + 1, chunk_rows)]

    def read(bounds: tuple[int, int]) -> dict[str, np.ndarray]:
        a, b = bounds
        try:
            got = arrow_query(pool, f"SELECT {sql} FROM main.{table} WHERE rowid >= {a} AND rowid < {b}", chunk_rows)
        except Exception as exc:  # noqa: BLE001 - the driver's type mismatch: a value that is no integer
            raise Unverified(f"{table}: {exc}") from None
        if got.num_rows != b - a:  # a hole in the row ids (a deleted row): the SQL checks decide
            raise Unverified(f"{table}: rows {a}..{b - 1} hold {got.num_rows} rows")
        out = {"seq": _int64(got.column(0), table, "rowid", nullable=False)}
        for i, name in enumerate(names):
            column, kind = columns[name]
            out[name] = _int64(got.column(i + 1), table, column, nullable=kind.endswith("?"))
        _check(out, columns, table)
        return out

    last_start = -1
    with ThreadPoolExecutor(max(1, jobs)) as threads:
        ahead: deque = deque()
        todo = iter(ranges)
        for bounds in todo:
            ahead.append(threads.submit(read, bounds))
            if len(ahead) >= max(1, jobs):
                break
        while ahead:
            chunk = ahead.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                ahead.append(threads.submit(read, nxt))
            start = chunk["start"]
            if len(start) and start[0] <= last_start:
                raise Unverified(f"{table}: rows out of start order at row {int(chunk['seq'][0])}")
            if len(start):
                last_start = int(start[-1])
            yield chunk


def _int64(column: Any, table: str, name: str, nullable: bool) -> np.ndarray:
    """An Arrow column as int64 with NULL_INT for NULL; Unverified where it is no integer column, or holds a NULL
    where nsys always writes a value."""
    if column.null_count and not nullable:
        raise Unverified(f"{table}.{name}: NULL")
    try:
        return to_int64(column, strict=True)
    except TypeError:
        raise Unverified(f"{table}.{name}: values of type {column.type}") from None


def _check(chunk: dict[str, np.ndarray], columns: Mapping[str, tuple[str, str]], table: str) -> None:
    """The bounds of traces.nsys's views (PLAUSIBLE, TIMES_OK) and strictly increasing starts, on one chunk."""
    start, end = chunk["start"], chunk["end"]
    ok = (end >= start) & (start >= 0) & (end <= MAX_NS)
    for name, (_column, kind) in columns.items():
        if kind == "device":
            ok &= (chunk[name] >= 0) & (chunk[name] <= MAX_DEVICE)
    if not ok.all():
        raise Unverified(f"{table}: a row out of bounds at row {int(chunk['seq'][np.argmin(ok)])}")
    if len(start) > 1 and not (start[1:] > start[:-1]).all():
        raise Unverified(f"{table}: rows out of start order")
