"""The normalized trace every analysis reads.

A `Trace` is a SQLite connection in which these relations exist (views over an nsys export,
tables for a torch trace), all timestamps integer nanoseconds on one clock:

  kernels(seq, start, end, device, stream, correlation, pid, name_id, short_id, graph_node)
  memops (start, end, device, stream, correlation, pid, operation, bytes, src_kind, dst_kind, graph_node)
  api    (seq, start, end, tid, pid, correlation, name_id)   -- seq: row order = start order
  sync   (start, end, device, stream, correlation, pid, sync_type)
  nvtx   (start, end, tid, name, style)
  strings(id, value)                      -- kernel and API names, joined after aggregation

`seq` orders kernels and api rows by start (nsys writes its tables sorted by start), which lets
an analysis find the events around a timestamp by binary search instead of a scan.
`operation` uses nsys's own labels (`[CUDA memcpy Host-to-Device]`, `[CUDA memset]`) and the
memory kinds are `Pageable`, `Pinned`, `Device`, ... so both readers give the same tables.
Analyses aggregate with SQL over these names and never touch the source file again.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# What makes two rows one event recorded twice: the same place, times and correlation id. (A real nsys 2022 export,
# extrap_con_kernel, holds two kernels on one stream with equal times but their own correlation ids: nsys stats
# counts both, and so does profkit.) Both readers deduplicate by these keys.
DUPLICATE_KEYS = {"kernels": ("device", "stream", "start", "end", "correlation"),
                  "api": ("tid", "start", "end", "name_id", "correlation"),
                  "memops": ("device", "stream", "start", "end", "correlation"),
                  "sync": ("device", "stream", "start", "end", "correlation"),
                  "cpu_ops": ("tid", "start", "end", "name_id"), "nvtx": ("tid", "start", "end", "name", "style")}


def count_duplicates(conn: sqlite3.Connection, relation: str, subset: str = "", table: str | None = None) -> int:
    """How many rows of `relation` (read from `table`, default the relation itself) repeat an earlier one by
    DUPLICATE_KEYS; `subset` a WHERE clause that narrows the rows looked at."""
    keys = ", ".join(DUPLICATE_KEYS[relation])
    return conn.execute(f"SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM {table or relation} "
                        f"{subset} GROUP BY {keys} HAVING n > 1)").fetchone()[0]


@dataclass
class Trace:
    """An opened trace: a read-only connection exposing the normalized relations."""

    conn: sqlite3.Connection
    path: Path
    kind: str  # "nsys-sqlite" | "torch-trace"
    meta: dict[str, Any] = field(default_factory=dict)
    # Relations that hold data in this trace (an nsys export may lack MEMCPY, NVTX_EVENTS, ...).
    present: frozenset[str] = frozenset()
    # A torch trace is loaded into a SQLite file of profkit's own; the Trace that built it deletes it.
    db_file: Path | None = None
    owns_db: bool = False
    # An nsys export read through a private checkpointed copy (its -wal file had transactions).
    snapshot: Path | None = None
    # Relations an nsys export had out of start order or with duplicated rows, read through a repaired copy.
    repaired: tuple[str, ...] = ()
    # Results computed once per trace and shared by its analyses (the GPU gaps), across `reopen`.
    cache: dict[str, Any] = field(default_factory=dict)
    primary: bool = True  # False for a `reopen`ed connection: the first one closes what the cache holds

    def reopen(self) -> Trace:
        """Another connection to the same normalized trace (for analyses running in parallel). A reader whose
        relations are views over the user's file (nsys) reopens them its own way (`NsysTrace`)."""
        if self.db_file is None:
            raise NotImplementedError(f"{self.kind}: no database file to reopen")
        conn = sqlite3.connect(f"file:{self.db_file}?mode=ro", uri=True, check_same_thread=False)
        return Trace(conn=conn, path=self.path, kind=self.kind, meta=self.meta, present=self.present,
                     db_file=self.db_file, owns_db=False, cache=self.cache, primary=False)

    def has(self, relation: str) -> bool:
        return relation in self.present

    def query(self, sql: str, params: dict[str, Any] | tuple = ()) -> list[tuple]:
        return self.conn.execute(sql, params).fetchall()

    def strings(self, ids: Iterable[int]) -> dict[int, str]:
        """Names for string ids (kernel and API names are joined after aggregation, not per event)."""
        clean = {int(i) for i in set(ids) if isinstance(i, int) or (isinstance(i, float) and math.isfinite(i))}
        if not clean:
            return {}
        found = dict(self.conn.execute(f"SELECT id, value FROM strings WHERE id IN ({','.join(map(str, clean))})"))
        # every id gets a name: a string table that lost rows (or holds numbers) must not fail the report
        return {i: found[i] if isinstance(found.get(i), str) else f"<string #{i} missing>" for i in clean}

    def close(self) -> None:
        self.conn.close()
        if self.primary:
            for value in self.cache.values():  # e.g. the pool of Arrow connections to the file
                if hasattr(value, "close"):
                    value.close()
            self.cache.clear()
        if self.owns_db and self.db_file is not None:
            self.db_file.unlink(missing_ok=True)
        if self.owns_db and self.snapshot is not None:
            import shutil

            shutil.rmtree(self.snapshot.parent, ignore_errors=True)

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
